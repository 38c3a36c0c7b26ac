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


def fold_merge_deps(full: Graph, g: Graph, deps: list[list[int]], virtual: set[str] | None = None,
                    raw: list[list[int]] | None = None) -> list[list[int]]:
    """Dependencies of ``g`` (``full`` without its virtual ops, the same ops and tasks otherwise, in order) from
    those of ``full``: a dependency on a virtual task becomes one on every task that task depended on, transitively
    reduced again. The virtual ops (names; default: the attn_merge ops) are the folded merges and the combines of
    stream-K GEMVs ("<op>.combine", exec.stream_splitk): whichever of a split unit's tasks arrives last writes the
    unit's rows, so each of them also inherits what the combine waited for besides them (an earlier reader of the
    rows it overwrites), taken from ``raw`` (the unreduced dependencies, default ``deps``: in the reduced ones a
    combine's edge to such a reader is gone when one of its tasks already waits for it, and the others would not
    inherit it). ScheduleError if a virtual task depends on another virtual task."""
    if virtual is None:
        virtual = {op.name for op in full.ops if op.kind.name == "attn_merge"}
    fmap, ops = {}, iter(g.ops)
    for op in full.ops:
        if op.name not in virtual:
            for a, b in zip(op.task_ids, next(ops).task_ids):
                fmap[a] = b
    out: list[set[int]] = [set() for _ in g.tasks]
    for op in full.ops:
        if not op.name.endswith(".combine") or op.name not in virtual:
            continue
        base = op.name[: -len(".combine")]
        for v in op.task_ids:
            src = (raw or deps)[v]
            mine = [p for p in src if p in fmap and full.ops[full.tasks[p].op].name == base]
            others = {fmap[p] for p in src if p in fmap and p not in mine}
            for p in mine:
                out[fmap[p]].update(others)
    for a, b in fmap.items():
        ds = out[b]
        for p in deps[a]:
            if p in fmap:
                ds.add(fmap[p])
            elif any(q not in fmap for q in deps[p]):
                raise ScheduleError(f"streaming plan: virtual task {p} depends on another virtual task; it cannot be "
                                    f"folded")
            else:
                ds.update(fmap[q] for q in deps[p])
    return transitive_reduction([sorted(d) for d in out])
