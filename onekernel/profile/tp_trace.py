"""Both ranks' megakernel stamps at tensor-parallel size > 1: one timeline PNG (a panel per rank) and a breakdown.

Input per rank: the TP megakernel's profile rows ``prof [n_tasks, >= 5]`` int64 (``exec.mk_device``: start,
dependencies satisfied, end, SM id, and column 4 = the task's *local* waits done, before its remote waits), all
ranks running the same graph (the same task ids). ``%globaltimer`` is per GPU and the GPUs' clocks are not
synchronised, so each rank's stamps are aligned to *its own* step start (its earliest task start = 0): the panels
share a time axis in "microseconds since this rank's step began", not a common clock; a rank's all-reduce tiles
waiting on the peer show as that rank's remote-wait time.

Per task: waiting locally = col4 - start, waiting on peers = ready - col4 (0 for tasks without remote waits),
body = end - ready.

The streaming (Gluon) TP megakernel (``exec.stream_runner``) stamps 4-wide rows (start, all waits done, end,
worker, with the task's publish times packed above bit 16) and, per all-reduce task, its local waits done in column 0 of its ``prof_sub`` row: ``stream_rows`` turns
both into the layout above, so every function here takes either backend's stamps (the streaming runner's task ids
are those of its re-tiled graph, ``runner.task_graph``, with its remote waits in ``runner.events.remote_waits``).
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import torch

from onekernel.graph.ir import Graph
from onekernel.profile.trace import sm_of

COMM_KIND = "allreduce"
_LAYER = re.compile(r"\.(\d+)(\.ar)?$")


def remote_task_ids(events) -> set[int]:
    """The ids of the tasks with remote waits (a ``graph.deps`` Events' ``remote_waits``: one list per task of
    (peer rank, event) pairs; empty at TP = 1)."""
    return {t for t, rw in enumerate(events.remote_waits) if rw}


def stream_rows(prof: torch.Tensor, prof_sub: torch.Tensor, remote_tasks: set[int]) -> torch.Tensor:
    """The streaming TP megakernel's stamps in the Triton TP megakernel's layout (module doc): int64 [n, 5] =
    (start, all waits done, end, worker, local waits done), ns of the GPU's %globaltimer (the worker id and the
    publish bits above it as is: ``_rows`` reads it with ``trace.sm_of``), from
    ``prof`` int64 [n, 4] (start, all waits done, end, worker + publish << 16: ``StreamMegakernelRunner.prof``) and ``prof_sub``
    int64 [>= n, 4] (its ``prof_sub``: column 0 of an all-reduce task's row = its local waits done, stamped before
    its remote waits). Local waits done = prof_sub[t, 0] for t in ``remote_tasks`` (task ids of the runner's
    ``task_graph``: ``remote_task_ids(runner.events)``), = all waits done for every other task. A new CPU tensor
    (the inputs may be on a GPU). ValueError for other shapes or dtypes, a remote task id outside [0, n), or a
    remote task whose local stamp is not between its start and ready (not a profiling TP build's prof_sub)."""
    if prof.dim() != 2 or prof.shape[1] != 4 or prof_sub.dim() != 2 or prof_sub.shape[1] != 4 \
            or prof_sub.shape[0] < prof.shape[0] or prof.dtype != torch.int64 or prof_sub.dtype != torch.int64:
        raise ValueError(f"stream_rows needs prof int64 [n, 4] and prof_sub int64 [>= n, 4], got "
                         f"{tuple(prof.shape)} {prof.dtype} and {tuple(prof_sub.shape)} {prof_sub.dtype}")
    n = prof.shape[0]
    bad = sorted(t for t in remote_tasks if not 0 <= t < n)
    if bad:
        raise ValueError(f"remote task ids {bad[:5]} outside the {n} profiled tasks")
    prof, sub = prof.detach().cpu(), prof_sub.detach().cpu()
    local = prof[:, 1].clone()
    ids = torch.tensor(sorted(remote_tasks), dtype=torch.int64)
    local[ids] = sub[ids, 0]
    off = ((local < prof[:, 0]) | (local > prof[:, 1])).nonzero().flatten().tolist()
    if off:
        t = off[0]
        raise ValueError(f"task {t}'s local waits done ({int(local[t])} ns) is not between its start and ready "
                         f"({int(prof[t, 0])}, {int(prof[t, 1])}); {len(off)} such tasks: prof_sub must come from the "
                         "same profiling (profile=True) TP step as prof")
    return torch.cat([prof, local[:, None]], dim=1)


def _rows(prof: torch.Tensor) -> list[tuple[float, float, float, int, float]]:
    """(start, local waits done, ready, end) in us since the rank's first start, and the SM id, per task."""
    p = prof.detach().cpu().tolist()
    t0 = min(r[0] for r in p)
    return [((r[0] - t0) / 1e3, (r[4] - t0) / 1e3, (r[1] - t0) / 1e3, (r[2] - t0) / 1e3, sm_of(r[3])) for r in p]


def layer_of(op_name: str) -> str:
    """"layer {i}" for ``*.{i}`` / ``*.{i}.ar`` ops, else the op's name (embed, lm_head, ...)."""
    m = _LAYER.search(op_name)
    return f"layer {m.group(1)}" if m else op_name


def rank_breakdown(graph: Graph, prof: torch.Tensor, remote_tasks: set[int]) -> dict:
    """One rank's times in microseconds (see module doc): span (first start to last end), all-reduce tasks (their
    body time summed over tiles, and their whole time start..end summed), waiting on peers (summed over the
    tasks with remote waits), waiting locally (summed over every task), and per stage (``layer_of``: embed,
    layer i, lm_head, ...) and per op: first start, last end (since the step start), span, body time summed over
    tiles."""
    rows = _rows(prof)
    out = {"span_us": max(r[3] for r in rows), "allreduce_body_us": 0.0, "allreduce_total_us": 0.0,
           "remote_wait_us": 0.0, "local_wait_us": 0.0, "tasks": len(rows),
           "allreduce_tasks": 0, "sms_used": len({r[4] for r in rows})}
    ops: dict[str, dict] = {}
    stages: dict[str, dict] = {}
    for t, (s, lw, rd, e, _) in enumerate(rows):
        op = graph.ops[graph.tasks[t].op]
        remote = t in remote_tasks
        out["local_wait_us"] += (lw if remote else rd) - s
        if remote:
            out["remote_wait_us"] += rd - lw
        if op.kind.name == COMM_KIND:
            out["allreduce_body_us"] += e - rd
            out["allreduce_total_us"] += e - s
            out["allreduce_tasks"] += 1
        for table, key in ((ops, op.name), (stages, layer_of(op.name))):
            d = table.setdefault(key, {"start_us": s, "end_us": e, "body_us": 0.0})
            d["start_us"], d["end_us"] = min(d["start_us"], s), max(d["end_us"], e)
            d["body_us"] += e - rd
    for table in (ops, stages):
        for d in table.values():
            d["span_us"] = d["end_us"] - d["start_us"]
    out["stages"], out["ops"] = stages, ops
    return out


def tp_timeline_png(graph: Graph, profs: list[torch.Tensor], remote_tasks: set[int], path: str | Path,
                    title: str = "") -> None:
    """One panel per rank (rows = SMs), tasks as bars coloured by op kind, the all-reduce tiles in red, local
    waits shaded light grey and waits on peers light red; each rank's time axis starts at its own step start."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    kinds = sorted({op.kind.name for op in graph.ops} - {COMM_KIND})
    cmap = plt.get_cmap("tab10")
    colour = {k: cmap(i % 10) for i, k in enumerate(k for k in kinds)}
    colour[COMM_KIND] = (0.85, 0.05, 0.05, 1.0)
    shade = {"wait": "0.85", "remote": (1.0, 0.75, 0.75, 1.0)}
    h = 5 if len(profs) <= 2 else 3  # TP=8: 8 panels of 3 inches
    fig, axes = plt.subplots(len(profs), 1, figsize=(16, h * len(profs)), dpi=120, sharex=True, squeeze=False)
    for rank, (ax, prof) in enumerate(zip(axes[:, 0], profs)):
        rows = _rows(prof)
        bars = defaultdict(list)
        for t, (s, lw, rd, e, sm) in enumerate(rows):
            remote = t in remote_tasks
            local_end = lw if remote else rd
            if local_end > s:
                bars[(sm, "wait")].append((s, local_end - s))
            if remote and rd > lw:
                bars[(sm, "remote")].append((lw, rd - lw))
            bars[(sm, graph.ops[graph.tasks[t].op].kind.name)].append((rd, max(e - rd, 0.01)))
        for (sm, key), spans in bars.items():
            ax.broken_barh(spans, (sm - 0.45, 0.9), color=shade.get(key) or colour[key], linewidth=0)
        ax.set_ylim(-1, max(r[4] for r in rows) + 1)
        ax.set_ylabel(f"rank {rank}: SM")
        ax.set_title(f"rank {rank} (GPU {rank}): span {max(r[3] for r in rows):.1f} us", fontsize=10)
    handles = [Patch(color=colour[k], label=k) for k in kinds] + [
        Patch(color=colour[COMM_KIND], label="all-reduce tiles"), Patch(color=shade["wait"], label="waiting (local)"),
        Patch(color=shade["remote"], label="waiting on the peer rank")]
    axes[0, 0].legend(handles=handles, loc="upper right", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel("us since this rank's step start (each GPU's own %globaltimer; clocks not synchronised)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
