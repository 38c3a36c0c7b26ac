"""The contract between an operator family and the executors.

Every operator kind is described by one :class:`OpKind`, a module-level constant of its op file; an ``Op`` of
the graph holds its kind directly (no registry, nothing happens at import). Executors never know what an op
computes: they only call its Triton tile functions through generated wrappers (``onekernel.exec.codegen``):

    state = prologue(tile, <args...>, <consts...>)      # reads weights / inputs ready before the step
    <wait>   (PDL: gdc_wait; megakernel: spin on the task's events; eager/graph: nothing)
    body(tile, *state, <args...>, <consts...>)          # reads activations, writes outputs

* ``args`` are pointer arguments, in order; each names a role that ``Op.args`` maps to a buffer.
* ``consts`` are ``tl.constexpr`` parameters, in order, taken from ``Op.params``.
* ``n_state`` is the number of values the prologue returns (>= 1); they are passed to the body in order.
* Activation loads inside ``body`` use ``cache_modifier=".cg"`` so that data written by another CTA of the
  same persistent kernel is never served from a stale L1 line (../shared/DESIGN.md, "Tasks and dependencies").
* ``reference(op, tensors)`` computes the same outputs with PyTorch (``tensors``: buffer name -> tensor).

An op file's builder (``add_<op>(graph, name, <input Buffers>, *, <options>) -> <output Buffer(s)>``) declares
the op's outputs and scratch buffers (named after the op), splits it into tasks and appends it to the graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import os

import torch

# Whether the tile functions were defined for the Triton interpreter: Triton reads TRITON_INTERPRET when a
# kernel is defined (here, when the op modules are imported, which import this one first), not when it runs.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


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


@torch.no_grad()
def run_reference(graph, tensors: dict[str, torch.Tensor]) -> None:
    """Run every op's PyTorch reference in program order (the "graph reference"); writes into ``tensors``."""
    for op in graph.ops:
        op.kind.reference(op, tensors)
