"""Per-task timestamps -> Perfetto trace, timeline PNG and a breakdown of where the step's time goes.

Every Triton mode can record, per task, four int64 values (``prof[task] = (start, ready, end, sm)``): the
``%globaltimer`` nanoseconds when the CTA began the task, when its dependencies were satisfied (after the
megakernel's event spin or PDL's ``gdc_wait``), when it finished, and the SM it ran on (the streaming
megakernel packs its publish time above bit 16 of that column: only the low 16 bits are the SM).

Breakdown (per SM, over the step's span from the first start to the last end):
* computing: sum of (end - ready), the tile bodies; prologues count as computing too (start..ready minus
  the time spent spinning is not separable, so start..ready is reported as "waiting" — an upper bound);
* waiting on dependencies: sum of (ready - start);
* idle: the rest of the span on SMs that ran tasks, plus whole SMs that ran none.
For the separate-kernel modes, ``launch_gaps`` sums the time between the last end of one op and the first
start of the next: the cost of kernel boundaries that a megakernel removes.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

from onekernel.graph.ir import Graph


def sm_of(col3: int) -> int:
    """The SM (worker) of a prof row's column 3: its low 16 bits (``publish_of``: the streaming megakernel's bits above)."""
    return int(col3) & 0xFFFF


def publish_of(col3: int) -> tuple[int, int]:
    """(ns at the task's last CTA barrier, ns of its whole publish: that barrier and the release add) that the
    streaming megakernel's profiling build packs into column 3 above the worker (bits 16-39 and 40-63;
    ``exec.stream_device._consumer``); (0, 0) for the other executors' rows."""
    return (int(col3) >> 16) & 0xFFFFFF, int(col3) >> 40


def _rows(graph: Graph, prof: torch.Tensor):
    p = prof.detach().cpu().tolist()
    t0 = min(r[0] for r in p)
    return [(t, graph.ops[task.op], (r[0] - t0) / 1e3, (r[1] - t0) / 1e3, (r[2] - t0) / 1e3, sm_of(r[3]))
            for t, (task, r) in enumerate(zip(graph.tasks, p))]


def _union_len(iv: list[tuple[float, float]]) -> float:
    """Total length covered by intervals (start, end)."""
    total, cur_s, cur_e = 0.0, None, None
    for a, b in sorted(iv):
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def breakdown(graph: Graph, prof: torch.Tensor, n_sm: int) -> dict:
    """Times in microseconds over the step's span on ``n_sm`` SMs, each SM's time counted once: computing
    (some CTA on the SM runs a task body), waiting on dependencies (some CTA waits and none computes), idle
    (the rest, including SMs without a CTA), their shares of span * n_sm; per op kind computing time (summed
    CTA time: CTAs sharing an SM both count); and the launch gaps between consecutive ops. Several CTAs per
    SM (separate kernels, PDL's early-launched CTAs) are why the per-SM unions matter."""
    rows = _rows(graph, prof)
    span = max(r[4] for r in rows) - min(r[2] for r in rows)
    body, busy = defaultdict(list), defaultdict(list)
    for _, _, s, r, e, sm in rows:
        body[sm].append((r, e))
        busy[sm].append((s, e))
    compute = sum(_union_len(v) for v in body.values())
    wait = sum(_union_len(v) for v in busy.values()) - compute
    idle = max(span * n_sm - compute - wait, 0.0)
    by_kind = defaultdict(float)
    for r in rows:
        by_kind[r[1].kind.name] += r[4] - r[3]
    first = defaultdict(lambda: float("inf"))
    last = defaultdict(float)
    for r in rows:
        first[r[1].index] = min(first[r[1].index], r[2])
        last[r[1].index] = max(last[r[1].index], r[4])
    gaps = sum(max(first[i + 1] - last[i], 0.0) for i in range(len(graph.ops) - 1) if i + 1 in first)
    total = span * n_sm or 1.0
    return {"span_us": span, "computing_us": compute, "waiting_us": wait, "idle_us": idle,
            "computing_pct": 100 * compute / total, "waiting_pct": 100 * wait / total, "idle_pct": 100 * idle / total,
            "computing_by_kind_us": dict(by_kind), "launch_gaps_us": gaps, "n_sm": n_sm, "tasks": len(rows)}


def perfetto(graph: Graph, prof: torch.Tensor, path: str | Path, label: str = "") -> None:
    """Write a Chrome/Perfetto JSON trace: one track per SM, a slice per task (waiting and computing)."""
    ev = []
    for t, op, s, r, e, sm in _rows(graph, prof):
        if r > s:
            ev.append({"name": f"wait {op.name}", "cat": "wait", "ph": "X", "ts": s, "dur": r - s, "pid": 0,
                       "tid": sm, "args": {"task": t}})
        ev.append({"name": op.name, "cat": op.kind.name, "ph": "X", "ts": r, "dur": max(e - r, 1e-3), "pid": 0,
                   "tid": sm, "args": {"task": t, "tile": graph.tasks[t].tile}})
    meta = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"onekernel {label}"}}]
    Path(path).write_text(json.dumps({"traceEvents": meta + ev, "displayTimeUnit": "ns"}))


def timeline_png(graph: Graph, prof: torch.Tensor, path: str | Path, title: str = "") -> None:
    """A timeline: SMs on the y axis, tasks as bars coloured by op kind, waiting in light grey."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows(graph, prof)
    kinds = sorted({r[1].kind.name for r in rows})
    cmap = plt.get_cmap("tab10")
    colour = {k: cmap(i % 10) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(14, 7), dpi=120)
    bars = defaultdict(list)  # (sm, colour key) -> [(start, width)]: one broken_barh call per group
    for t, op, s, r, e, sm in rows:
        if r > s:
            bars[(sm, "wait")].append((s, r - s))
        bars[(sm, op.kind.name)].append((r, max(e - r, 0.01)))
    for (sm, key), spans in bars.items():
        ax.broken_barh(spans, (sm - 0.45, 0.9), color="0.85" if key == "wait" else colour[key], linewidth=0)
    for k in kinds:
        ax.barh(-10, 0, color=colour[k], label=k)
    ax.barh(-10, 0, color="0.85", label="waiting")
    ax.set_ylim(-1, max(r[5] for r in rows) + 1)
    ax.set_xlabel("time since the step's first task (us)")
    ax.set_ylabel("SM")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
