"""Static schedules: one queue of task ids per persistent worker (CTA), run in order.

A worker runs its queue front to back and spins on each task's events before the task body, so a schedule is
deadlock-free iff (DESIGN.md) no task waits on a task placed later in its own queue and the *wait-for graph*
(edges: dependencies, plus "queued right after" inside each queue) is acyclic. :func:`validate` checks exactly
that; :func:`residency_check` checks that the persistent grid fits on the device at once (all workers must be
co-resident, or a spinning worker can starve the one it waits for).
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Mapping

import torch

from ..errors import DeviceError, InputError, ScheduleError
from .deps import _consumers
from .paths import Cost, task_costs, topological_order
from .ir import Graph


@dataclass
class Schedule:
    """``queues[w]``: task ids worker w runs, in order; ``policy``: the name of the function that built it."""

    queues: list[list[int]]
    n_workers: int
    policy: str

    def arrays(self, device="cpu") -> dict[str, torch.Tensor]:
        """int32 CSR for a kernel: worker w runs ``queue_ids[queue_ptr[w]:queue_ptr[w+1]]``."""
        ptr = [0]
        for q in self.queues:
            ptr.append(ptr[-1] + len(q))
        ids = [t for q in self.queues for t in q]
        return {"queue_ptr": torch.tensor(ptr, dtype=torch.int32, device=device),
                "queue_ids": torch.tensor(ids, dtype=torch.int32, device=device)}


def _check_workers(n_workers: int) -> None:
    if n_workers < 1:
        raise InputError(f"need at least 1 worker, got {n_workers}")


def round_robin(graph: Graph, deps: list[list[int]], n_workers: int) -> Schedule:
    """Topological order (Kahn) dealt to workers 0, 1, ..., n_workers-1, 0, ... Always valid: one total order
    is consistent with every dependency and every queue."""
    _check_workers(n_workers)
    queues: list[list[int]] = [[] for _ in range(n_workers)]
    for i, t in enumerate(topological_order(graph, deps)):
        queues[i % n_workers].append(t)
    return Schedule(queues, n_workers, "round_robin")


def critical_path_list(graph: Graph, deps: list[list[int]], n_workers: int, cost: Cost = None) -> Schedule:
    """List scheduling by bottom level (HLFET, Adam, Chandy & Dickson 1974; Kwok & Ahmad 1999 survey).

    priority(t) = cost(t) + max priority of its consumers (longest path to the end); cost as in
    :func:`onekernel.graph.paths.task_costs` (default ``max(task.bytes, 1)``). A simulation keeps each worker's
    finish time: the worker that frees up first takes the highest-priority task whose dependencies have all
    finished by then (if none, it idles until the next task finishes). Queues are in assignment order, which is
    a topological order, so the schedule is always valid. O((T + E) log T).
    """
    _check_workers(n_workers)
    n = len(graph.tasks)
    cst = task_costs(graph, cost)
    order = topological_order(graph, deps)  # raises on a cycle
    cons = _consumers(n, deps)
    prio = [0.0] * n
    for t in reversed(order):
        prio[t] = cst[t] + max((prio[c] for c in cons[t]), default=0)
    left = [len(set(ds)) for ds in deps]
    ready = [(-prio[t], t) for t in range(n) if left[t] == 0]
    heapq.heapify(ready)
    workers = [(0.0, w) for w in range(n_workers)]
    running: list[tuple[float, int]] = []  # (finish time, task)
    queues: list[list[int]] = [[] for _ in range(n_workers)]
    now = 0.0

    def finish_until(time: float) -> None:
        while running and running[0][0] <= time:
            _, t = heapq.heappop(running)
            for c in cons[t]:
                left[c] -= 1
                if left[c] == 0:
                    heapq.heappush(ready, (-prio[c], c))

    for _ in range(n):
        free, w = heapq.heappop(workers)
        now = max(now, free)
        finish_until(now)
        while not ready:  # idle until a running task finishes and releases one
            now = running[0][0]
            finish_until(now)
        _, t = heapq.heappop(ready)
        end = now + cst[t]
        queues[w].append(t)
        heapq.heappush(workers, (end, w))
        heapq.heappush(running, (end, t))
    return Schedule(queues, n_workers, "critical_path_list")


def reserved_critical_path(graph: Graph, deps: list[list[int]], n_workers: int, reserved: list[bool],
                           k: int, cost: Cost = None) -> Schedule:
    """``critical_path_list`` with ``k`` workers reserved: the tasks with ``reserved[t]`` (a tensor-parallel
    graph's communication tasks) run only on workers ``n_workers - k .. n_workers - 1``, every other task only on
    workers ``0 .. n_workers - k - 1`` (the SM-reservation study of issue 13: does giving the all-reduce its own
    SMs help?). Same priorities (bottom level) and simulation, one pool of workers per class: at each time the
    free workers of each class take that class's highest-priority ready tasks; otherwise time moves to the next
    task end or worker release. Queues are in assignment order (a topological order): always valid.
    Deterministic, so every rank builds the same one. Raises InputError unless 0 < k < n_workers and both
    classes are non-empty or the class without workers has no tasks."""
    _check_workers(n_workers)
    n = len(graph.tasks)
    if len(reserved) != n:
        raise InputError(f"reserved has {len(reserved)} entries, the graph {n} tasks")
    if not 0 < k < n_workers:
        raise InputError(f"reserving {k} of {n_workers} workers: need 0 < k < n_workers (0: critical_path_list)")
    cst = task_costs(graph, cost)
    order = topological_order(graph, deps)
    cons = _consumers(n, deps)
    prio = [0.0] * n
    for t in reversed(order):
        prio[t] = cst[t] + max((prio[c] for c in cons[t]), default=0)
    cls = [1 if r else 0 for r in reserved]
    left = [len(set(ds)) for ds in deps]
    ready: list[list] = [[], []]
    for t in range(n):
        if left[t] == 0:
            heapq.heappush(ready[cls[t]], (-prio[t], t))
    free = [[(0.0, w) for w in range(n_workers - k)], [(0.0, w) for w in range(n_workers - k, n_workers)]]
    running: list[tuple[float, int]] = []
    queues: list[list[int]] = [[] for _ in range(n_workers)]
    now, placed = 0.0, 0
    while placed < n:
        while running and running[0][0] <= now:
            _, t = heapq.heappop(running)
            for c in cons[t]:
                left[c] -= 1
                if left[c] == 0:
                    heapq.heappush(ready[cls[c]], (-prio[c], c))
        for c in (0, 1):
            while ready[c] and free[c][0][0] <= now:
                _, w = heapq.heappop(free[c])
                _, t = heapq.heappop(ready[c])
                queues[w].append(t)
                heapq.heappush(free[c], (now + cst[t], w))
                heapq.heappush(running, (now + cst[t], t))
                placed += 1
        nxt = [running[0][0]] if running else []
        nxt += [free[c][0][0] for c in (0, 1) if ready[c]]
        later = [x for x in nxt if x > now]
        if placed < n:
            now = min(later)  # a DAG always has a running task or a ready one with a worker to come
    return Schedule(queues, n_workers, f"reserved_critical_path(k={k})")


def _name(graph: Graph, t: int, worker: list[int]) -> str:
    task = graph.tasks[t]
    op = graph.ops[task.op].name if 0 <= task.op < len(graph.ops) else "?"
    return f"task {t} ({op} tile {task.tile}, worker {worker[t]})"


def validate(schedule: Schedule, graph: Graph, deps: list[list[int]]) -> None:
    """Raise :class:`ScheduleError` unless the schedule can run to completion (see module doc).

    Checks, in order: (a) queue count and every task exactly once; (b) inside a queue, no task depends on one
    placed later (or on itself); (c) the wait-for graph across queues is acyclic (Kahn's algorithm; on failure
    one cycle is found by walking unprocessed predecessors, iteratively). O(T + E).
    """
    n = len(graph.tasks)
    if len(deps) != n:
        raise ScheduleError(f"deps has {len(deps)} entries but the graph has {n} tasks")
    if len(schedule.queues) != schedule.n_workers:
        raise ScheduleError(f"schedule has {len(schedule.queues)} queues but n_workers={schedule.n_workers}")
    worker, index = [-1] * n, [-1] * n
    dups: list[str] = []
    for w, q in enumerate(schedule.queues):
        for i, t in enumerate(q):
            if not (isinstance(t, int) and 0 <= t < n):
                raise ScheduleError(f"worker {w} position {i}: {t!r} is not a task id in [0, {n})")
            if worker[t] >= 0:
                dups.append(f"task {t} on worker {worker[t]} (position {index[t]}) and worker {w} (position {i})")
                continue
            worker[t], index[t] = w, i
    missing = [t for t in range(n) if worker[t] < 0]
    if dups or missing:
        msg = []
        if missing:
            msg.append(f"{len(missing)} task(s) in no queue: {missing[:10]}")
        if dups:
            msg.append(f"{len(dups)} task(s) placed twice: " + "; ".join(dups[:5]))
        raise ScheduleError("; ".join(msg) + ". Every task must appear in exactly one queue.")
    for t in range(n):
        for d in deps[t]:
            if worker[d] == worker[t] and index[d] >= index[t]:
                raise ScheduleError(
                    f"{_name(graph, t, worker)} at position {index[t]} waits on {_name(graph, d, worker)} placed "
                    f"at position {index[d]} of the same queue: the worker would spin forever. "
                    "Put dependencies earlier in the queue.")
    queues = schedule.queues
    succ = _consumers(n, deps)
    indeg = [len(set(ds)) + (index[t] > 0) for t, ds in enumerate(deps)]
    for q in queues:
        for a, b in zip(q, q[1:]):
            succ[a].append(b)
    todo = deque(t for t in range(n) if indeg[t] == 0)
    done = 0
    while todo:
        t = todo.popleft()
        done += 1
        for c in succ[t]:
            indeg[c] -= 1
            if indeg[c] == 0:
                todo.append(c)
    if done == n:
        return
    # Every unprocessed task has an unprocessed predecessor: walk backwards until a task repeats.
    t = next(t for t in range(n) if indeg[t] > 0)
    seen: dict[int, int] = {}
    walk: list[tuple[int, str]] = []
    while t not in seen:
        seen[t] = len(walk)
        prev = queues[worker[t]][index[t] - 1] if index[t] > 0 else -1
        if prev >= 0 and indeg[prev] > 0:
            walk.append((t, "is queued after"))
            t = prev
        else:
            walk.append((t, "depends on"))
            t = next(d for d in deps[t] if indeg[d] > 0)
    cycle = walk[seen[t]:]
    text = " ".join(f"{_name(graph, a, worker)} {how}" for a, how in cycle)
    raise ScheduleError(f"cyclic wait across queues ({len(cycle)} tasks): {text} {_name(graph, t, worker)}. "
                        "Reorder the queues (e.g. use a topological order).")


def residency_check(n_workers: int, kernel_meta: Mapping[str, int], device_props: Mapping[str, int]) -> int:
    """Return how many CTAs of the kernel fit on the device at once; raise DeviceError if ``n_workers`` exceed it.

    kernel_meta: ``n_regs`` (registers per thread), ``num_warps``, ``shared`` (bytes of shared memory per CTA).
    device_props: ``sm_count``, ``smem_per_sm`` (bytes), and optionally ``regs_per_sm`` (65536),
    ``max_threads_per_sm`` (2048), ``max_blocks_per_sm`` (32), ``reg_alloc_unit`` (256 registers per warp
    allocation), ``smem_reserved_per_block`` (1024 bytes the driver reserves per CTA on sm_80+; 0 counts
    ``shared`` only). Per SM (CUDA occupancy calculator rules):
    ``min(regs_per_sm // (ceil(n_regs * 32 / unit) * unit) // num_warps, max_threads_per_sm // (32 * num_warps),
    smem_per_sm // (shared + reserved) if shared else inf, max_blocks_per_sm)``; total = per SM x sm_count.
    """
    _check_workers(n_workers)
    regs, warps, smem = int(kernel_meta["n_regs"]), int(kernel_meta["num_warps"]), int(kernel_meta.get("shared", 0))
    sms, smem_sm = int(device_props["sm_count"]), int(device_props["smem_per_sm"])
    unit = int(device_props.get("reg_alloc_unit", 256))
    per_warp = -(-max(regs, 1) * 32 // unit) * unit
    limits = {
        "registers": int(device_props.get("regs_per_sm", 65536)) // per_warp // warps,
        "threads": int(device_props.get("max_threads_per_sm", 2048)) // (32 * warps),
        "blocks": int(device_props.get("max_blocks_per_sm", 32)),
    }
    if smem > 0:
        limits["shared memory"] = smem_sm // (smem + int(device_props.get("smem_reserved_per_block", 1024)))
    per_sm = min(limits.values())
    total = per_sm * sms
    if n_workers > total:
        why = min(limits, key=limits.get)
        raise DeviceError(
            f"{n_workers} workers need {n_workers} co-resident CTAs but only {total} fit: {per_sm} per SM x {sms} "
            f"SMs given {regs} registers/thread, {warps} warps, {smem} bytes shared memory (limited by {why}); "
            f"use --workers <= {total}")
    return total
