"""The streaming megakernel's merge fold, host side: the attention tasks merge the split-KV partials themselves
(the last run of tiles to finish a (sequence, KV head) group merges its rows: ``stream_tasks._arrive_and_merge``),
so a plan has no attn_merge tasks and a layer 5 dependent stages instead of 6 (docs/DESIGN.md, "Attention merges
its own splits"). ``FOLD`` is the default (``STREAM_FOLD_MERGE=0`` keeps the merge tasks, for a measurement).
With the fold the attention runs also skip their dead tiles (``SKIP_DEAD``: splits that start past the sequence's
position; ``STREAM_ATTN_SKIP=0`` computes them, for a measurement): only the fold's merge knows to read live
splits only.
"""
from __future__ import annotations

import os

from onekernel.errors import ScheduleError
from onekernel.graph.deps import transitive_reduction
from onekernel.graph.ir import Graph

FOLD = os.environ.get("STREAM_FOLD_MERGE", "1") == "1"
SKIP_DEAD = os.environ.get("STREAM_ATTN_SKIP", "1") == "1"
# the order of a group's splits along the tile index that runs are cut from (split_order); "linear" for a measurement
SPLIT_ORDER = os.environ.get("STREAM_ATTN_ORDER", "bitrev")
MAX_GROUPS = 32  # groups one run's arrival covers (the kernel's 32-bit mask of the groups it merges)


def split_order(nsplit: int, skip: bool) -> list[int]:
    """order[p] = the split s that position p of a (sequence, KV head) group's tiles holds in the plan's tile
    order (runs are cut from consecutive positions). With dead tiles skipped (a cache filled to a fraction of its
    length has its live splits first) the bit-reversed order spreads the live splits evenly over any run of
    consecutive positions, for every power-of-two fill: a run of n / 2^k positions holds the same number of live
    splits as its neighbours. Identity without skipping, for a non-power-of-two NSPLIT or STREAM_ATTN_ORDER=linear.
    The kernel decodes p the same way (stream_tasks._tile_coords, PERM). Bit reversal is its own inverse."""
    if not (skip and SPLIT_ORDER == "bitrev") or nsplit & (nsplit - 1):
        return list(range(nsplit))
    bits = nsplit.bit_length() - 1
    return [int(format(p, f"0{bits}b")[::-1], 2) if bits else 0 for p in range(nsplit)]


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
