"""Task-graph IR of one decode step: buffers, regions, ops, tasks, events.

A decode step is a list of ``Op`` s in program order. Each op is split into ``Task`` s, one per tile; a task
names the ``Region`` s it reads and writes. Dependencies between tasks are derived from overlapping regions
(see :mod:`onekernel.graph.deps`), never written by hand.

Shapes are in elements; ``Region.box`` is one half-open ``[lo, hi)`` interval per dimension of its buffer.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off inside the block (a decorator too), on again after if it was on.

    Building a decode step makes ~10^5-10^6 small containers (tasks, regions, dependency lists) and no cycles;
    each allocation burst triggers collections that rescan everything already built, which made most of the
    host-side time at batch 16 (Llama-3.1-8B: the graph 1.6 s -> 0.3 s with it paused, on a slow core).
    Reference counting still frees garbage at once; only the cycle search waits."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True)
class Buffer:
    """A named device tensor that the step reads or writes.

    kind: "weight" (read only, ready before the step), "input" (written by the host before the step:
    tokens, sequence lengths), "activation" (written inside the step), "kv" (KV cache: appended inside the
    step, read by attention), "output" (logits, next tokens), "scratch" (split-KV partials and the like),
    "peer" (another tensor-parallel rank's copy of one of this graph's buffers, read only here: written by that
    rank's own step; ``graph.meta["peers"][name] = (rank, buffer)`` says which, see ``deps.derive_remote_dependencies``).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()

    def full(self) -> "Region":
        """The region covering the whole buffer."""
        return Region(self.name, tuple((0, s) for s in self.shape))


@dataclass(frozen=True)
class Region:
    """A box inside one buffer: ``box[d] = (lo, hi)`` half-open along dimension d."""

    buffer: str
    box: tuple[tuple[int, int], ...]

    def overlaps(self, other: "Region") -> bool:
        if self.buffer != other.buffer:
            return False
        return all(a_lo < b_hi and b_lo < a_hi for (a_lo, a_hi), (b_lo, b_hi) in zip(self.box, other.box))

    def nbytes(self, buf: Buffer) -> int:
        n = 1
        for lo, hi in self.box:
            n *= hi - lo
        return n * torch.empty((), dtype=buf.dtype).element_size()


@dataclass
class Task:
    """One tile of one op. ``tile`` is the index the tile function receives (0 <= tile < op.n_tiles).

    bytes: bytes moved through device memory (weights + activations read + written); flops: arithmetic.
    ``id`` is the position in ``Graph.tasks`` (set by :meth:`Graph.add_op`).
    """

    op: int
    tile: int
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    bytes: int = 0
    flops: int = 0
    id: int = -1


@dataclass
class Op:
    """One operator instance, e.g. layer 3's QKV GEMV.

    kind: the op's :class:`onekernel.ops.base.OpKind` (its tile functions, argument roles, reference); the graph
    stores it and reads nothing but its ``name``, so this layer knows no operator;
    args: argument role -> buffer name, in the order of ``kind.args``;
    params: compile-time constants of the tile function (dimensions, tile sizes, eps), ``kind.consts``.
    """

    name: str
    kind: Any
    args: dict[str, str]
    params: dict[str, Any]
    n_tiles: int = 0
    task_ids: list[int] = field(default_factory=list)
    index: int = -1


@dataclass
class Graph:
    """A decode step: buffers and ops in program order, with their tasks."""

    buffers: dict[str, Buffer] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add_buffer(self, name: str, shape, dtype: torch.dtype, kind: str) -> Buffer:
        """Declare a buffer and return its handle (raises ValueError when ``name`` is taken)."""
        if name in self.buffers:
            raise ValueError(f"buffer {name!r} defined twice")
        b = Buffer(name, tuple(int(s) for s in shape), dtype, kind)
        self.buffers[name] = b
        return b

    def add_op(self, op: Op, tasks: list[Task]) -> Op:
        """Append ``op`` and its tasks (in tile order); checks that every region names a known buffer."""
        for a in op.args.values():
            if a not in self.buffers:
                raise ValueError(f"op {op.name!r} names unknown buffer {a!r}")
        op.index = len(self.ops)
        op.n_tiles = len(tasks)
        op.task_ids = []
        for i, t in enumerate(tasks):
            if t.tile != i:
                raise ValueError(f"op {op.name!r}: tasks must come in tile order (got tile {t.tile} at {i})")
            for r in (*t.reads, *t.writes):
                if r.buffer not in self.buffers:
                    raise ValueError(f"op {op.name!r} tile {i}: region of unknown buffer {r.buffer!r}")
            t.op = op.index
            t.id = len(self.tasks)
            op.task_ids.append(t.id)
            self.tasks.append(t)
        self.ops.append(op)
        return op

    def bytes_per_step(self) -> int:
        return sum(t.bytes for t in self.tasks)

    def weight_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values() if b.kind == "weight")
