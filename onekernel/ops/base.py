"""The contract between an operator family and the executors.

Every operator kind is described by one :class:`OpKind`. Executors never know what an op computes: they
only call its Triton tile functions through generated wrappers (``onekernel.exec.codegen``):

    state = prologue(tile, <args...>, <consts...>)      # reads weights / inputs ready before the step
    <wait>   (PDL: gdc_wait; megakernel: spin on the task's events; eager/graph: nothing)
    body(tile, *state, <args...>, <consts...>)          # reads activations, writes outputs

* ``args`` are pointer arguments, in order; each names a role that ``Op.args`` maps to a buffer.
* ``consts`` are ``tl.constexpr`` parameters, in order, taken from ``Op.params``.
* ``n_state`` is the number of values the prologue returns (>= 1); they are passed to the body in order.
* Activation loads inside ``body`` use ``cache_modifier=".cg"`` so that data written by another CTA of the
  same persistent kernel is never served from a stale L1 line (DESIGN.md, "Tasks and dependencies").
* ``reference(op, tensors)`` computes the same outputs with PyTorch (``tensors``: buffer name -> tensor).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

OP_KINDS: dict[str, "OpKind"] = {}


@dataclass(frozen=True)
class OpKind:
    name: str
    prologue: object  # triton.JITFunction
    body: object  # triton.JITFunction
    args: tuple[str, ...]
    consts: tuple[str, ...]
    n_state: int
    reference: Callable
    num_warps: int = 4


def register(kind: OpKind) -> OpKind:
    """Add ``kind`` to :data:`OP_KINDS` (raises ValueError on a duplicate name)."""
    if kind.name in OP_KINDS and OP_KINDS[kind.name] is not kind:
        raise ValueError(f"op kind {kind.name!r} registered twice")
    OP_KINDS[kind.name] = kind
    return kind
