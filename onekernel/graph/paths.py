"""Costs, topological order and critical path of a decode-step task graph, and a text summary of its dependencies
and events (``graph.deps`` derives them). A task's default cost is its bytes moved (``max(task.bytes, 1)``).
"""
from __future__ import annotations

import heapq
from math import prod
from typing import Callable, Sequence, Union

import torch

from .deps import EventTable, _check_deps, _consumers
from .ir import Graph, Task

Cost = Union[None, Sequence[float], Callable[[Task], float]]


def task_costs(graph: Graph, cost: Cost = None) -> list[float]:
    """Per-task cost: ``None`` -> ``max(task.bytes, 1)``; a sequence indexed by task id; or ``cost(task)``."""
    if cost is None or callable(cost):
        return [cost(t) if cost else max(t.bytes, 1) for t in graph.tasks]
    if len(cost) != len(graph.tasks):
        raise ValueError(f"cost has {len(cost)} entries but the graph has {len(graph.tasks)} tasks")
    return list(cost)


def topological_order(graph: Graph, deps: list[list[int]]) -> list[int]:
    """Task ids with every task after its dependencies (Kahn's algorithm, smallest ready id first, so
    program-order deps give ``0..n-1``). Raises ValueError naming the tasks left on a cycle."""
    n = len(graph.tasks)
    _check_deps(n, deps)
    cons = _consumers(n, deps)
    left = [len(set(ds)) for ds in deps]
    ready = [t for t in range(n) if left[t] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        order.append(t := heapq.heappop(ready))
        for c in cons[t]:
            left[c] -= 1
            if left[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != n:
        stuck = [t for t in range(n) if left[t] > 0]
        raise ValueError(f"dependency cycle among {len(stuck)} tasks, e.g. {stuck[:8]}")
    return order


def critical_path(graph: Graph, deps: list[list[int]], cost: Cost = None) -> tuple[float, list[int]]:
    """Longest chain: ``(sum of its task costs, task ids first to last)``; ``cost`` as in :func:`task_costs`
    (``[1] * n`` gives the chain length in tasks). Empty graph: ``(0, [])``."""
    cst = task_costs(graph, cost)
    dist, prev = [0.0] * len(cst), [-1] * len(cst)
    for t in topological_order(graph, deps):
        best = max(deps[t], key=lambda d: dist[d], default=-1)
        dist[t] = cst[t] + (dist[best] if best >= 0 else 0)
        prev[t] = best
    t = max(range(len(cst)), key=lambda i: dist[i], default=-1)
    total, path = (dist[t] if t >= 0 else 0), []
    while t >= 0:
        path.append(t)
        t = prev[t]
    return total, path[::-1]


def region_bytes(graph: Graph) -> dict[str, int]:
    """Bytes the regions of all tasks touch per step, by buffer kind (reads + writes, e.g. ``weight``, ``kv``).
    These are the declared boxes: a KV region that covers the whole context counts it all."""
    esize = {b.name: torch.empty((), dtype=b.dtype).element_size() for b in graph.buffers.values()}
    out: dict[str, int] = {}
    for r in (r for t in graph.tasks for r in (*t.reads, *t.writes)):
        kind = graph.buffers[r.buffer].kind
        out[kind] = out.get(kind, 0) + esize[r.buffer] * prod(max(hi - lo, 0) for lo, hi in r.box)
    return out


def summary(graph: Graph, deps: list[list[int]], events: EventTable | None = None) -> str:
    """Printable table: per op kind (ops, tasks, task bytes) and totals (edges, events, bytes per step by
    weights / KV / activations from the regions, longest dependency chain in tasks and in bytes)."""
    rows: dict[str, list[int]] = {}
    for op in graph.ops:
        r = rows.setdefault(op.kind.name, [0, 0, 0])
        r[:] = r[0] + 1, r[1] + len(op.task_ids), r[2] + sum(graph.tasks[t].bytes for t in op.task_ids)
    lines = [f"{'op kind':<20}{'ops':>8}{'tasks':>10}{'bytes':>16}"]
    for kind, (o, t, b) in sorted(rows.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"{kind:<20}{o:>8}{t:>10}{b:>16,}")
    lines.append(f"{'total':<20}{len(graph.ops):>8}{len(graph.tasks):>10}{graph.bytes_per_step():>16,}")
    rb = region_bytes(graph)
    w, kv, act = rb.get("weight", 0), rb.get("kv", 0), sum(rb.values()) - rb.get("weight", 0) - rb.get("kv", 0)
    chain, chain_b = critical_path(graph, deps, [1] * len(graph.tasks))[0], critical_path(graph, deps)[0]
    ev = f"{events.n_events:,} ({events.n_waits:,} waits)" if events is not None else "-"
    return "\n".join(lines + [f"dependency edges: {sum(len(d) for d in deps):,}   events: {ev}",
                              f"bytes per step: weights {w:,}  KV {kv:,}  activations {act:,}",
                              f"longest dependency chain: {int(chain)} tasks ({int(chain_b):,} bytes on the path)"])
