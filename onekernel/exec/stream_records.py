"""The streaming megakernel's queue tables from a plan (``exec.stream_plan.StreamPlan``): the records every
worker walks (int32, the fields of ``exec.stream_base``: kind, op, task, signal, waits, tile / run, GEMV shape,
tensor-parallel flags), the dependency wait list, the remote wait list of the all-reduce tasks, and the
fingerprint the tensor-parallel ranks compare. ``stream_plan.make_plan`` builds them (and caches them with the
plan); they read only the plan's graph, kinds, units, events and schedule.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from onekernel.exec import host_cache
from onekernel.exec import stream_base as sd


def records(plan: StreamPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Queue records int32 [positions + 1, REC] (stream_base.F_*) and the wait list int32 [n, 2]."""
    g, ev = plan.graph, plan.events
    rows, wl, nrw = [], [], 0
    for q in plan.schedule.queues:
        for t in q:
            task = g.tasks[t]
            op = g.ops[task.op]
            waits = ev.waits[t]
            rec = [0] * sd.REC.value
            rec[sd.F_KIND.value], rec[sd.F_OP.value], rec[sd.F_TASK.value], rec[sd.F_SIGNAL.value] = plan.kinds[task.op], task.op, t, ev.signal[t]
            rec[sd.F_WB.value], rec[sd.F_WE.value] = len(wl), len(wl) + len(waits)
            if waits:
                rec[sd.F_EV0.value], rec[sd.F_EX0.value] = waits[0], ev.expected[waits[0]]
            rec[sd.F_TILE.value] = task.tile
            rec[sd.F_U0.value], rec[sd.F_NU.value] = plan.units[t]
            if "NKB" in op.params:
                rec[sd.F_K.value], rec[sd.F_NKB.value] = op.params["KG"], op.params["NKB"]
                rec[sd.F_N.value] = op.params.get("N", 0)
                rec[sd.F_IDX.value] = task.tile
                rec[sd.F_SS.value] = int("ss" in op.args)  # RMSNorm partials: written (residual) or read
            if ev.remote_waits:  # tensor parallel (stream_base: F_SYS, F_RWB/F_RWE/F_RES of all-reduce tasks)
                sig = ev.signal[t]
                rec[sd.F_SYS.value] = int(sig >= 0 and ev.sys_signal[sig])
                if plan.kinds[task.op] == sd.K_ALLREDUCE.value:
                    rw = ev.remote_waits[t]
                    rec[sd.F_RWB.value], rec[sd.F_RWE.value] = nrw, nrw + len(rw)
                    rec[sd.F_RES.value] = int(bool(op.params["RES"]))
                    nrw += len(rw)
            elif plan.kinds[task.op] == sd.K_ALLREDUCE.value:
                rec[sd.F_RES.value] = int(bool(op.params["RES"]))
            rows.append(rec)
            wl += [(e, ev.expected[e]) for e in waits]
    rows.append([0] * sd.REC.value)
    return torch.tensor(rows, dtype=torch.int32), torch.tensor(wl or [(0, 0)], dtype=torch.int32)


def fingerprint(plan: StreamPlan, extra: tuple = ()) -> int:
    """A 63-bit hash of what every rank must share to wait on each other's counters (as
    ``MegakernelRunner.fingerprint``): the task kinds, units, queues, events (signals, waits, expected counts,
    system-scope signals), the events of the remote waits (without the peer ranks, which differ by rank) and the
    kernel constants, and ``extra`` (the runner's own choices the ranks must share: the push all-reduce)."""
    ev = plan.events
    parts = (tuple(plan.kinds), tuple(plan.units), tuple(map(tuple, plan.schedule.queues)), tuple(ev.signal),
             tuple(map(tuple, ev.waits)), tuple(ev.expected), tuple(ev.sys_signal),
             tuple(tuple(sorted({e for _, e in rw})) for rw in ev.remote_waits), sorted(plan.consts.items()), extra)
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


def remote_wait_list(plan: StreamPlan) -> torch.Tensor:
    """int32 [m, 3] (event, expected count per epoch, peer rank): every queue position's remote waits in queue
    order (``records`` points each all-reduce record at its range); one zero row when there are none."""
    ev = plan.events
    rwl = []
    if ev.remote_waits:
        for q in plan.schedule.queues:
            for t in q:
                rwl += [(e, ev.expected[e], peer) for peer, e in ev.remote_waits[t]]
    return torch.tensor(rwl or [(0, 0, 0)], dtype=torch.int32)


def encode_products(p) -> dict:
    """The plan's cached products (events, schedule, records, wait lists: ``stream_plan.make_plan``) as arrays for
    ``exec.host_cache``."""
    events, schedule, qrec, wl, rwl = p
    return {**host_cache.encode_events(events), **host_cache.encode_schedule(schedule), "qrec": qrec.numpy(),
            "wl": wl.numpy(), "rwl": rwl.numpy()}


def decode_products(a: dict, n: int):
    """``encode_products`` inverted for a plan of n tasks; ValueError when the arrays do not fit."""
    qrec, wl, rwl = (torch.from_numpy(np.array(a[k], dtype=np.int32)) for k in ("qrec", "wl", "rwl"))
    if qrec.ndim != 2 or qrec.shape != (n + 1, sd.REC.value) or wl.ndim != 2 or wl.shape[1] != 2 or rwl.ndim != 2 \
            or rwl.shape[1] != 3:
        raise ValueError(f"records of shape {tuple(qrec.shape)}, {tuple(wl.shape)}, {tuple(rwl.shape)}")
    return host_cache.decode_events(a, n), host_cache.decode_schedule(a, n), qrec, wl, rwl
