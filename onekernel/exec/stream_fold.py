"""The streaming megakernel's merge fold, host side: the attention tasks merge the split-KV partials themselves
(the last run of tiles to finish a (sequence, KV head) group merges its rows: ``stream_attn._arrive_and_merge``),
so a plan has no attn_merge tasks and a layer 5 dependent stages instead of 6 (docs/DESIGN.md, "Attention merges
its own splits"). ``FOLD`` is the default (``STREAM_FOLD_MERGE=0`` keeps the merge tasks, for a measurement).
"""
from __future__ import annotations

import os

from onekernel.errors import ScheduleError
from onekernel.graph.deps import transitive_reduction
from onekernel.graph.ir import Graph

FOLD = os.environ.get("STREAM_FOLD_MERGE", "1") == "1"
MAX_GROUPS = 32  # groups one run's arrival covers (the kernel's 32-bit mask of the groups it merges)


def fold_fits(src: Graph, n_workers: int) -> bool:
    """Whether every run of attention tiles (at most ceil(tiles / n_workers) consecutive tiles) touches at most
    MAX_GROUPS groups of NSPLIT tiles: ceil(run / NSPLIT) + 1 (false only for a handful of workers)."""
    at = next(op for op in src.ops if op.kind.name == "attn_partial")
    run = -(-len(at.task_ids) // n_workers)
    return -(-run // at.params["NSPLIT"]) + 1 <= MAX_GROUPS


def fold_merge_deps(full: Graph, g: Graph, deps: list[list[int]]) -> list[list[int]]:
    """Dependencies of ``g`` (``full`` without its attn_merge ops, the same ops and tasks otherwise, in order)
    from those of ``full``: a dependency on a merge task becomes one on every task the merge depended on (its
    attention tasks), transitively reduced again. ScheduleError if a merge depends on another merge."""
    fmap, ops = {}, iter(g.ops)
    for op in full.ops:
        if op.kind.name != "attn_merge":
            for a, b in zip(op.task_ids, next(ops).task_ids):
                fmap[a] = b
    out: list[list[int]] = [[] for _ in g.tasks]
    for a, b in fmap.items():
        ds = set()
        for p in deps[a]:
            if p in fmap:
                ds.add(fmap[p])
            elif any(q not in fmap for q in deps[p]):
                raise ScheduleError(f"streaming plan: merge task {p} depends on another merge task; it cannot be folded")
            else:
                ds.update(fmap[q] for q in deps[p])
        out[b] = sorted(ds)
    return transitive_reduction(out)
