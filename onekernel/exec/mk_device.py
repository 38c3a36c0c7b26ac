"""The megakernel's device code, as plain Triton: the persistent worker loop, waits, signals, prefetch, stamps.

Only the per-variant dispatch (``run_task``: which tile functions a record's variant calls, with which
constants) is generated (``exec.megakernel_src``); the loop receives it as a constexpr function. Per task:

    prologue(tile, ...)                     # weights only: runs before any waiting       (in run_task)
    before_body: [prefetch the next task's weights into L2]; wait on the task's events; CTA barrier
    body(tile, ...)                         # reads activations with .cg loads            (in run_task)
    CTA barrier; one release atomic add on the task's event (gpu scope; sys scope when another rank waits on it)

Tensor parallel (constexpr ``TP``; off, the kernel is the single-GPU one): a record's remote waits
``rwl[rwait_begin:rwait_end]`` = (event, expected, peer rank) spin on *that rank's* event counters, at
``ev_cnt + peer_off[peer]`` (int32 elements from this rank's counters to the peer's, in the one virtual address
space: CUDA's unified addressing of peer-mapped symmetric memory; in the interpreter, shared CPU memory mapped
into both processes), with ``ld.acquire.sys`` (``spin_peer``); a timeout records (5, task, event, seen, expected,
peer) in the error word.

The epoch is read once at entry; the last worker to finish increments it, so CUDA-graph replays and
back-to-back launches need no reset of any counter (../shared/DESIGN.md, "Tasks and dependencies"). Pointers are
rebuilt from a per-dtype base argument and offsets in 16-byte units (``argtab[op, slot]``).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer, smid

from onekernel.exec.queue import FIELDS, N_LOCAL, NARROW, REC

# Record field offsets (exec.queue.QueueRecord), as compile-time constants for the device code.
_R = {f: tl.constexpr(i) for i, f in enumerate(FIELDS)}
R_TASK, R_VARIANT, R_TILE, R_OP, R_SIGNAL = _R["task"], _R["variant"], _R["tile"], _R["op"], _R["signal"]
R_PF_ADDR, R_PF_BYTES = _R["prefetch_addr"], _R["prefetch_bytes"]
R_WAIT_BEGIN, R_WAIT_END, R_EV0, R_EX0 = _R["wait_begin"], _R["wait_end"], _R["first_event"], _R["first_expected"]
R_SIGNAL_SYS, R_RWAIT_BEGIN, R_RWAIT_END = _R["signal_sys"], _R["rwait_begin"], _R["rwait_end"]
N_FIELDS = tl.constexpr(len(FIELDS))
N_LOCAL_FIELDS = tl.constexpr(N_LOCAL)
ERR_REMOTE = tl.constexpr(5)  # error code of a remote wait that gave up (in the remote slot; + 5 = the peer rank)
ERR_STOP = tl.constexpr(6)  # err[0] set by a remote failure when no local one was recorded: local spins stop too
# The remote slot: err[ERR_RSLOT:ERR_RSLOT + 6] = (5, task, event, seen, expected, peer). Local spins record in
# err[0:5] and stop once err[0] != 0; remote spins poll only err[ERR_RSLOT], so a local wait that gives up first
# (a consumer of a stuck all-reduce: ld.acquire.gpu polls are faster than ld.acquire.sys polls, so the same poll
# count ends sooner; seen on the H200, run 8 call 3) never stops a remote wait from recording its peer rank. A
# remote failure then sets err[0] = ERR_STOP (if still 0), so the other local spins stop at once.
ERR_RSLOT = tl.constexpr(8)
PROF_W_TP = tl.constexpr(8)  # profile row width at TP > 1 (stamp)
REC_STRIDE = tl.constexpr(REC)
_NARROW_MASK = tl.constexpr(sum(1 << FIELDS.index(f) for f in NARROW))


@triton.jit
def load_record(qrec, pos, TP: tl.constexpr):
    """The record at queue position ``pos`` as a tuple in QueueRecord field order (index it with R_*); the
    tensor-parallel fields (from N_LOCAL_FIELDS on) only when ``TP``."""
    r = qrec + pos * REC_STRIDE
    rec = ()
    for i in tl.static_range(N_FIELDS):
        if i < N_LOCAL_FIELDS or TP:
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
def ld_acquire_sys(p):
    """``ld.acquire.sys`` of one int32 (PTX memory model, system scope): pairs with another GPU's
    ``atom.release.sys`` on the same address (a peer's event counter, over NVLink), so this thread's later loads
    see every store that the peer's CTA made before its release (its barrier, then the release: cumulativity)."""
    return tl.inline_asm_elementwise("ld.global.acquire.sys.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _poll_once(p, ACQ_LOAD: tl.constexpr, SYS: tl.constexpr):
    if ACQ_LOAD:
        if SYS:
            v = ld_acquire_sys(p)
        else:
            v = ld_acquire(p)
    else:
        v = tl.load(p, volatile=True)
    return v


@triton.jit
def _poll(p, want, stop, SPIN_LIMIT, ACQ_LOAD: tl.constexpr, SYS: tl.constexpr):
    """(the last count seen, the stop word's last value): poll p[0] (``ld.acquire.sys`` with SYS, else
    ``ld.acquire.gpu``; volatile loads off the GPU) until it reaches ``want``, for at most SPIN_LIMIT polls, and
    not once *stop != 0 (read at every poll: a failure was recorded). spin and spin_peer record the failure."""
    seen = _poll_once(p, ACQ_LOAD, SYS)
    n = 0
    bad = tl.load(stop, volatile=True)
    while (seen < want) & (n < SPIN_LIMIT) & (bad == 0):
        seen = _poll_once(p, ACQ_LOAD, SYS)
        bad = tl.load(stop, volatile=True)
        n += 1
    return seen, bad


@triton.jit
def spin_peer(t, ev, want, cnt, peer, err, SPIN_LIMIT, ACQ_LOAD: tl.constexpr):
    """Bounded spin until ``cnt[ev] >= want``, ``cnt`` being rank ``peer``'s event counters; on timeout record
    the first remote failure in the remote slot err[ERR_RSLOT:ERR_RSLOT + 6] as (5, task, event, seen, want, peer),
    then err[0] = ERR_STOP if no local failure is recorded (the local spins stop). Polls only the remote slot:
    a local failure (err[0]) does not cut a remote wait short.

    ACQ_LOAD (GPU): ``ld.acquire.sys`` polls (the counter is another GPU's memory; a gpu-scope acquire does not
    synchronise with another device's release). The CTA barrier after the waits extends the ordering to the CTA,
    and the body reads the peer's rows with volatile loads (``ld.volatile.global``; ops/allreduce.py). Interpreter: volatile polls and
    no read-modify-write (only the owner writes a counter; a non-atomic RMW across processes could lose its add;
    plain loads on the CPU are ordered enough: x86-TSO)."""
    rslot = err + ERR_RSLOT
    seen, bad = _poll(cnt + ev, want, rslot, SPIN_LIMIT, ACQ_LOAD, True)
    if (seen < want) & (bad == 0):
        if tl.atomic_cas(rslot, 0, ERR_REMOTE) == 0:
            tl.store(rslot + 1, t)
            tl.store(rslot + 2, ev)
            tl.store(rslot + 3, seen)
            tl.store(rslot + 4, want)
            tl.store(rslot + 5, peer)
            tl.atomic_cas(err, 0, ERR_STOP)


@triton.jit
def spin(t, ev, want, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD: tl.constexpr):
    """Bounded spin until ev_cnt[ev] >= want; on timeout record the first failure in err[0:5] as
    (1, task, event, seen, want).

    ACQ_LOAD (GPU): every poll is an ``ld.acquire.gpu`` (one L2 round trip, no read-modify-write competing
    with the producers' atomics); the CTA barrier after the waits extends the ordering to the whole CTA.
    Else (interpreter): volatile polls, then one acquire read-modify-write."""
    seen, bad = _poll(ev_cnt + ev, want, err, SPIN_LIMIT, ACQ_LOAD, False)
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
def stamp(prof, t, k, value, TP: tl.constexpr):
    """prof[t, k] = value (int64 [n_tasks, 4]: start, dependencies satisfied, end, SM id; with ``TP``
    [n_tasks, PROF_W_TP]: column 4 = the local waits done, before the remote ones)."""
    if TP:
        tl.store(prof + t * PROF_W_TP + k, value)
    else:
        tl.store(prof + t * 4 + k, value)


@triton.jit
def before_body(rec, epoch, wl, ev_cnt, err, prof, SPIN_LIMIT, rwl, peer_off, PREFETCH: tl.constexpr,
                PROFILE: tl.constexpr, ACQ_LOAD: tl.constexpr, TP: tl.constexpr):
    """Between a task's prologue and its body: prefetch the next task's weights, wait for every event the
    task depends on (the first from the record, the rest from ``wl``; with ``TP`` then the remote waits of
    ``rwl`` on the peers' counters), CTA barrier, stamp."""
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
    if TP:
        if PROFILE:
            stamp(prof, t, 4, globaltimer(), TP)
        for i in range(rec[R_RWAIT_BEGIN], rec[R_RWAIT_END]):
            peer = tl.load(rwl + 3 * i + 2)
            spin_peer(t, tl.load(rwl + 3 * i), tl.load(rwl + 3 * i + 1) * epoch, ev_cnt + tl.load(peer_off + peer),
                      peer, err, SPIN_LIMIT, ACQ_LOAD)
    tl.debug_barrier()
    if PROFILE:
        stamp(prof, t, 1, globaltimer(), TP)


@triton.jit
def megakernel(qrec, qoff, wl, argtab, ev_cnt, epoch_ptr, done_ptr, err, prof,
               base_bf16, base_f16, base_f32, base_i32, base_i64, n_workers, SPIN_LIMIT, rwl, peer_off,
               RUN_TASK: tl.constexpr, MAXA: tl.constexpr, PROFILE: tl.constexpr, PREFETCH: tl.constexpr,
               ACQ_LOAD: tl.constexpr, TP: tl.constexpr):
    """One persistent worker per program: run queue positions qoff[w]:qoff[w+1] (module doc). The next
    position's record is loaded while the current task runs, and the next task's pointer offsets right after
    the current body, so a task starts without dependent loads."""
    wid = tl.program_id(0)
    epoch = tl.load(epoch_ptr, volatile=True)
    q0 = tl.load(qoff + wid)
    q1 = tl.load(qoff + wid + 1)
    nrec = load_record(qrec, q0, TP)
    nargs = load_args(argtab, nrec[R_OP], MAXA)
    for qi in range(q0, q1):
        rec = nrec
        args = nargs
        nrec = load_record(qrec, qi + 1, TP)
        t = rec[R_TASK]
        if PROFILE:
            stamp(prof, t, 0, globaltimer(), TP)
        RUN_TASK(rec, args, base_bf16, base_f16, base_f32, base_i32, base_i64, epoch, wl, ev_cnt, err, prof,
                 SPIN_LIMIT, rwl, peer_off, PROFILE, PREFETCH, ACQ_LOAD, TP)
        nargs = load_args(argtab, nrec[R_OP], MAXA)
        tl.debug_barrier()
        if rec[R_SIGNAL] >= 0:
            if TP:
                # another rank reads this event (and the rows behind it): a system-scope release, ordered after
                # the CTA's stores by the barrier above (PTX memory model: release cumulativity)
                if rec[R_SIGNAL_SYS] != 0:
                    tl.atomic_add(ev_cnt + rec[R_SIGNAL], 1, sem="release", scope="sys")
                else:
                    tl.atomic_add(ev_cnt + rec[R_SIGNAL], 1, sem="release", scope="gpu")
            else:
                tl.atomic_add(ev_cnt + rec[R_SIGNAL], 1, sem="release", scope="gpu")
        if PROFILE:
            stamp(prof, t, 2, globaltimer(), TP)
            stamp(prof, t, 3, smid().to(tl.int64), TP)
    done = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if done == n_workers * epoch - 1:
        tl.atomic_add(epoch_ptr, 1, sem="release", scope="gpu")
