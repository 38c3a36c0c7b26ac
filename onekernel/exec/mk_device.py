"""The megakernel's device code, as plain Triton: the persistent worker loop, waits, signals, prefetch, stamps.

Only the per-variant dispatch (``run_task``: which tile functions a record's variant calls, with which
constants) is generated (``exec.megakernel_src``); the loop receives it as a constexpr function. Per task:

    prologue(tile, ...)                     # weights only: runs before any waiting       (in run_task)
    before_body: [prefetch the next task's weights into L2]; wait on the task's events; CTA barrier
    body(tile, ...)                         # reads activations with .cg loads            (in run_task)
    CTA barrier; one release atomic add on the task's event (gpu scope)

The epoch is read once at entry; the last worker to finish increments it, so CUDA-graph replays and
back-to-back launches need no reset of any counter (../shared/DESIGN.md, "Tasks and dependencies"). Pointers are
rebuilt from a per-dtype base argument and offsets in 16-byte units (``argtab[op, slot]``).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer, smid

from onekernel.exec.queue import FIELDS, NARROW, REC

# Record field offsets (exec.queue.QueueRecord), as compile-time constants for the device code.
_R = {f: tl.constexpr(i) for i, f in enumerate(FIELDS)}
R_TASK, R_VARIANT, R_TILE, R_OP, R_SIGNAL = _R["task"], _R["variant"], _R["tile"], _R["op"], _R["signal"]
R_PF_ADDR, R_PF_BYTES = _R["prefetch_addr"], _R["prefetch_bytes"]
R_WAIT_BEGIN, R_WAIT_END, R_EV0, R_EX0 = _R["wait_begin"], _R["wait_end"], _R["first_event"], _R["first_expected"]
N_FIELDS = tl.constexpr(len(FIELDS))
REC_STRIDE = tl.constexpr(REC)
_NARROW_MASK = tl.constexpr(sum(1 << FIELDS.index(f) for f in NARROW))


@triton.jit
def load_record(qrec, pos):
    """The record at queue position ``pos`` as a tuple in QueueRecord field order (index it with R_*)."""
    r = qrec + pos * REC_STRIDE
    rec = ()
    for i in tl.static_range(N_FIELDS):
        v = tl.load(r + i)
        if (_NARROW_MASK >> i) & 1:
            rec = rec + (v.to(tl.int32),)  # tile math stays 32-bit
        else:
            rec = rec + (v,)
    return rec


@triton.jit
def load_args(argtab, op, MAXA: tl.constexpr):
    """Op ``op``'s pointer offsets (16-byte units) as a tuple of MAXA int64 values."""
    args = ()
    for j in tl.static_range(MAXA):
        args = args + (tl.load(argtab + op * MAXA + j),)
    return args


@triton.jit
def ld_acquire(p):
    """``ld.acquire.gpu`` of one int32: later loads of this thread are ordered after it (PTX memory model)."""
    return tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def spin(t, ev, want, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD: tl.constexpr):
    """Bounded spin until ev_cnt[ev] >= want; on timeout record the first failure in err[0:5] as
    (1, task, event, seen, want).

    ACQ_LOAD (GPU): every poll is an ``ld.acquire.gpu`` (one L2 round trip, no read-modify-write competing
    with the producers' atomics); the CTA barrier after the waits extends the ordering to the whole CTA.
    Else (interpreter): volatile polls, then one acquire read-modify-write."""
    if ACQ_LOAD:
        seen = ld_acquire(ev_cnt + ev)
    else:
        seen = tl.load(ev_cnt + ev, volatile=True)
    n = 0
    bad = tl.load(err, volatile=True)
    while (seen < want) & (n < SPIN_LIMIT) & (bad == 0):
        if ACQ_LOAD:
            seen = ld_acquire(ev_cnt + ev)
        else:
            seen = tl.load(ev_cnt + ev, volatile=True)
        bad = tl.load(err, volatile=True)
        n += 1
    if not ACQ_LOAD:
        seen = tl.atomic_add(ev_cnt + ev, 0, sem="acquire", scope="gpu")
    if (seen < want) & (bad == 0):
        if tl.atomic_cas(err, 0, 1) == 0:
            tl.store(err + 1, t)
            tl.store(err + 2, ev)
            tl.store(err + 3, seen)
            tl.store(err + 4, want)


@triton.jit
def prefetch_l2(addr, nbytes):
    """Issue prefetch.global.L2 for every 128-byte line of [addr, addr + nbytes)."""
    offs = tl.arange(0, 1024) * 128
    base = addr.to(tl.pointer_type(tl.int8))
    for start in range(0, nbytes, 1024 * 128):
        p = base + start + offs
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [p], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def stamp(prof, t, k, value):
    """prof[t, k] = value (int64 [n_tasks, 4]: start, dependencies satisfied, end, SM id)."""
    tl.store(prof + t * 4 + k, value)


@triton.jit
def before_body(rec, epoch, wl, ev_cnt, err, prof, SPIN_LIMIT, PREFETCH: tl.constexpr, PROFILE: tl.constexpr,
                ACQ_LOAD: tl.constexpr):
    """Between a task's prologue and its body: prefetch the next task's weights, wait for every event the
    task depends on (the first from the record, the rest from ``wl``), CTA barrier, stamp."""
    t = rec[R_TASK]
    if PREFETCH:
        if rec[R_PF_BYTES] > 0:
            prefetch_l2(rec[R_PF_ADDR], rec[R_PF_BYTES])
    wb = rec[R_WAIT_BEGIN]
    we = rec[R_WAIT_END]
    if we > wb:
        spin(t, rec[R_EV0], rec[R_EX0] * epoch, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD)
        for i in range(wb + 1, we):
            spin(t, tl.load(wl + 2 * i), tl.load(wl + 2 * i + 1) * epoch, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD)
    tl.debug_barrier()
    if PROFILE:
        stamp(prof, t, 1, globaltimer())


@triton.jit
def megakernel(qrec, qoff, wl, argtab, ev_cnt, epoch_ptr, done_ptr, err, prof,
               base_bf16, base_f16, base_f32, base_i32, base_i64, n_workers, SPIN_LIMIT,
               RUN_TASK: tl.constexpr, MAXA: tl.constexpr, PROFILE: tl.constexpr, PREFETCH: tl.constexpr,
               ACQ_LOAD: tl.constexpr):
    """One persistent worker per program: run queue positions qoff[w]:qoff[w+1] (module doc). The next
    position's record is loaded while the current task runs, and the next task's pointer offsets right after
    the current body, so a task starts without dependent loads."""
    wid = tl.program_id(0)
    epoch = tl.load(epoch_ptr, volatile=True)
    q0 = tl.load(qoff + wid)
    q1 = tl.load(qoff + wid + 1)
    nrec = load_record(qrec, q0)
    nargs = load_args(argtab, nrec[R_OP], MAXA)
    for qi in range(q0, q1):
        rec = nrec
        args = nargs
        nrec = load_record(qrec, qi + 1)
        t = rec[R_TASK]
        if PROFILE:
            stamp(prof, t, 0, globaltimer())
        RUN_TASK(rec, args, base_bf16, base_f16, base_f32, base_i32, base_i64, epoch, wl, ev_cnt, err, prof,
                 SPIN_LIMIT, PROFILE, PREFETCH, ACQ_LOAD)
        nargs = load_args(argtab, nrec[R_OP], MAXA)
        tl.debug_barrier()
        if rec[R_SIGNAL] >= 0:
            tl.atomic_add(ev_cnt + rec[R_SIGNAL], 1, sem="release", scope="gpu")
        if PROFILE:
            stamp(prof, t, 2, globaltimer())
            stamp(prof, t, 3, smid().to(tl.int64))
    done = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if done == n_workers * epoch - 1:
        tl.atomic_add(epoch_ptr, 1, sem="release", scope="gpu")
