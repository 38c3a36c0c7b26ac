"""The megakernel's static work list on the device: one record per queue position, and the wait list.

Worker ``w`` runs queue positions ``qoff[w]:qoff[w+1]`` in order. Each position has one ``QueueRecord`` (int64
fields, one 128-byte row of ``qrec``), so a task starts without dependent table lookups: the worker loads the
next position's record while the current task runs (``exec.mk_device.megakernel``). Waits beyond the first
live in the wait list ``wl`` (int32 [n, 2]: event, expected count per epoch).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from onekernel.graph.ir import gc_paused

REC = 16  # int64 slots per record: one 128-byte line


@dataclass(frozen=True)
class QueueRecord:
    """One queue position. Events are monotonic counters: a wait on (e, n) means ``count[e] >= n * epoch``."""

    task: int            # task id (index into Graph.tasks)
    variant: int         # compiled tile-function branch (exec.megakernel_src)
    tile: int            # tile index passed to the tile functions
    op: int              # op index: the row of the pointer table argtab
    signal: int          # event incremented when the task is done (-1: none)
    prefetch_addr: int   # next task's weight span prefetched into L2 (address, bytes; 0 bytes: none)
    prefetch_bytes: int
    wait_begin: int      # the task's waits are wl[wait_begin:wait_end]
    wait_end: int
    first_event: int     # wl[wait_begin] inline (most tasks wait on exactly one event)
    first_expected: int
    # Tensor parallel only (read by the kernel when its TP switch is on; the fields after N_LOCAL):
    signal_sys: int = 0  # 1: another rank waits on ``signal``: signal with a system-scope release
    rwait_begin: int = 0  # the task's remote waits are rwl[rwait_begin:rwait_end] (event, expected, peer rank)
    rwait_end: int = 0

    def serialize(self) -> list[int]:
        """The record as REC int64 values, fields in declaration order, zero padded."""
        return [getattr(self, f) for f in FIELDS] + [0] * (REC - len(FIELDS))


FIELDS = tuple(f.name for f in fields(QueueRecord))
N_LOCAL = FIELDS.index("signal_sys")  # the fields a kernel without remote waits loads
NARROW = ("task", "variant", "tile", "op", "signal", "first_event", "first_expected", "signal_sys")  # int32 in the kernel
assert len(FIELDS) <= REC


@gc_paused()
def build_queue(graph, schedule, events, op_variant: list[int], prefetch_span, remote: bool = False):
    """The records of every queue position (worker queues concatenated, plus one zero row that the pipelined
    load of "the position after the last" reads) as int64 [n_tasks + 1, REC], and the wait list int32 [n, 2];
    with ``remote`` also the remote wait list int32 [m, 3] (event, expected count per epoch, peer rank) as a
    third value.

    events: graph.deps.Events (signal, waits, expected; remote_waits and sys_signal when ``remote``);
    op_variant: op index -> variant id; prefetch_span(task) -> (address, bytes) of the weights to prefetch ahead
    of a task."""
    rows, wl, rwl = [], [], []
    for q in schedule.queues:
        for k, t in enumerate(q):
            task = graph.tasks[t]
            waits = events.waits[t]
            pf = prefetch_span(graph.tasks[q[k + 1]]) if k + 1 < len(q) else (0, 0)
            first = (waits[0], events.expected[waits[0]]) if waits else (0, 0)
            rw = events.remote_waits[t] if remote else []
            sig = events.signal[t]
            rows.append(QueueRecord(task=t, variant=op_variant[task.op], tile=task.tile, op=task.op,
                                    signal=sig, prefetch_addr=pf[0], prefetch_bytes=pf[1],
                                    wait_begin=len(wl), wait_end=len(wl) + len(waits), first_event=first[0],
                                    first_expected=first[1],
                                    signal_sys=int(remote and sig >= 0 and events.sys_signal[sig]),
                                    rwait_begin=len(rwl), rwait_end=len(rwl) + len(rw)).serialize())
            wl += [(e, events.expected[e]) for e in waits]
            rwl += [(e, events.expected[e], peer) for peer, e in rw]
    rows.append([0] * REC)
    out = torch.tensor(rows, dtype=torch.int64), torch.tensor(wl or [(0, 0)], dtype=torch.int32)
    if remote:
        return (*out, torch.tensor(rwl or [(0, 0, 0)], dtype=torch.int32))
    return out
