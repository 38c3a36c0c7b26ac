"""The streaming megakernel's device code (Gluon, sm_90): warp-specialised workers with a weight ring.

One CTA per SM. Two partitions (``gl.warp_specialize``):
* **loader** (1 warp): walks the worker's packed weight stream (every GEMV chunk of every task in its queue,
  in queue order; ``exec.stream_plan``) with one 1-D bulk copy (``cp.async.bulk``, L2 evict_first) per 16 KB
  chunk into a ring of SLOTS shared-memory slots (mbarriers ``ready``/``empty`` per slot). It never looks at a dependency: weights are ready before
  the step, so the ring stays full across task boundaries and while the consumer waits.
* **consumer** (4 warps): per queue position, spins (``ld.acquire.gpu``, bounded) on the task's events, runs
  the task, CTA-barrier, one release atomic add on the task's event. GEMV tasks read their activation once
  per task into shared memory (RMSNorm applied once there; the first XB batch rows, as many as fit beside the
  ring: a larger batch re-reads and re-normalises its other rows from L2 per chunk, the same operations, so
  the same bits), then per chunk: wait ``ready``, chunk -> registers,
  each warp releases the slot (the loader refills it while we compute), in-thread partial sums per batch row
  accumulated in k order; epilogue per row group (residual / RoPE + KV append / logits + argmax partials) or
  per unit (gate/up + SiLU): ``exec.stream_fma``. Attention, merge, embedding and argmax tasks use plain loads.
  With MMA (a ``gemv="mma"`` step) the GEMV tasks run on the tensor cores instead (``exec.stream_mma``), with
  the same epilogues (``exec.stream_epilogue``).

Shared pieces (record layout, kinds, waits): ``exec.stream_base``; the task bodies that stream no weights:
``exec.stream_tasks`` and ``exec.stream_attn``.

Numerics follow ops/ (HF rounding points; ``rnd`` and ``silu`` are the ops' own Triton functions, called
from Gluon); a row's reductions never depend on the batch size (batch invariance). The reduction orders
differ from the interpreter-tested Triton tile functions: the GPU checks compare both paths
(tests/test_stream_gpu.py, scripts/stream_check.py).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # PDL's griddepcontrol (Triton's own)
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from onekernel.exec.stream_attn import attn_task, merge_task
from onekernel.exec.stream_attn_tc import attn_task_tc
from onekernel.exec.stream_base import (F_KIND, F_OP, F_SIGNAL, F_SYS, F_TASK, K_ALLREDUCE, K_ARGMAX, K_ATTN, K_EMBED,
                                        K_MERGE, REC, SUBVIEW_REINTERPRET, barrier, bulk_load, mma_raw_rows,
                                        mma_raw_tile,
                                        mma_shared_layouts, now, record, smem_addr, view, wait_bounded, wait_deps,
                                        wait_remote)
from onekernel.exec.stream_epilogue import gemv_task
from onekernel.exec.stream_fma import gemv_fma
from onekernel.exec.stream_mma import gemv_mma
from onekernel.exec.stream_stage import stage_layout
from onekernel.exec.stream_tasks import allreduce_task, argmax_task, embed_task


# ----------------------------------------------------------------------------------------------- loader
@gluon.jit
def _loader(w_ptr, ring, bars, err, c0, n_chunks, SLOTS: gl.constexpr, BARS: gl.constexpr,
            WAIT_NS: gl.constexpr):
    """1 warp: chunk c0 + i of the packed stream (bf16/fp16 at w_ptr, 16 KB per chunk) into slot i % SLOTS, for i in
    [0, n_chunks), one 1-D bulk copy each under an L2 evict_first policy (stream_base.bulk_load). The slots are
    addressed from shared byte 0: the ring must be the kernel's first shared buffer (the largest, so Triton's
    allocator puts it there; stream_runner.fit_kernel refuses a kernel where it is not). Its waits get twice the
    consumer's bound, so the first recorded failure is the cause."""
    ELEMS: gl.constexpr = ring.shape[1] * ring.shape[2]  # a chunk: 16 KB of 2-byte values
    NBYTES: gl.constexpr = ELEMS * 2
    empty0 = smem_addr(BARS + 8 * SLOTS)
    ok = 1
    for i in range(n_chunks):
        slot = i % SLOTS
        ok = wait_bounded(ok, empty0 + 8 * slot, ((i // SLOTS) & 1) ^ 1, err, 3, -1, i, slot, 2 * WAIT_NS)
        mbarrier.expect(bars.index(slot), NBYTES, pred=ok != 0)
        bulk_load(smem_addr(slot * NBYTES), w_ptr + (c0 + i).to(gl.int64) * ELEMS, NBYTES, smem_addr(BARS + 8 * slot),
                  ok)


# ----------------------------------------------------------------------------------------------- worker
@gluon.constexpr_function
def scr_rows(G, RG, RP, HD):
    """Rows of attention's scratch fp32 [rows, RP, HD] viewed over the whole MMA accbuf [ACCG, 4, 16, RG] (the same
    bytes: Triton 3.8 reinterprets only whole buffers of the same size)."""
    return G * 4 * 16 * RG // (RP * HD)


@gluon.jit
def _consumer(ring, bars, xbuf, rbuf, accbuf, qrec, qoff, qbeg, qend, wl, argtab, ev_cnt, err, prof, base_t, base_f,
              base_i, wid, epoch,
              n_chunks, PROFILE: gl.constexpr, B: gl.constexpr, BP: gl.constexpr, XB: gl.constexpr,
              KXB: gl.constexpr, RG: gl.constexpr,
              CK: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr, WAIT_NS: gl.constexpr,
              MAXA: gl.constexpr, V: gl.constexpr, D: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
              HD: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr,
              BN: gl.constexpr, NSP2: gl.constexpr, CHM: gl.constexpr, BD: gl.constexpr, NT: gl.constexpr,
              EPS: gl.constexpr, SM_SCALE: gl.constexpr, MMA: gl.constexpr, GB: gl.constexpr, rwl, peer_off,
              TP: gl.constexpr, NR: gl.constexpr, ARD: gl.constexpr, NTA: gl.constexpr, ACCG: gl.constexpr,
              FOLD: gl.constexpr, NGP: gl.constexpr, ATTN_TC: gl.constexpr, QKN: gl.constexpr, NSS: gl.constexpr,
              PUSH: gl.constexpr):
    """4 warps: the worker's queue positions qoff[wid]:qoff[wid+1] in order (module doc). MMA: GEMV tasks on
    the tensor cores (gemv_mma; xbuf is then the staged activation tile, zeroed here once). TP: all-reduce
    tasks, remote waits, system-scope signals (stream_megakernel); PUSH: producers read by peers push their rows
    and signal into the peers' pools."""
    # GEMV results [BP, RG]: batch rows in registers, RG rows over the warps (as _group reduces them)
    AL: gl.constexpr = gl.SliceLayout(2, gl.BlockedLayout([1, 1, 1], [1, 1, 32], [1, 4, 1], [2, 1, 0]))
    TM: gl.constexpr = 32 if HD >= 128 else HD // 4
    LM: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TM, TM], [4, 1], [1, 0])
    q0 = gl.load(qbeg + wid)
    q1 = gl.load(qend + wid)
    n_prof = 0
    if PROFILE:  # prof holds n_prof task rows (every queue position is one task), then as many sub-timing rows
        n_prof = gl.load(qoff + gl.num_programs(0))
    ok = 1
    i = 0
    if MMA:  # operand A's rows >= B stay 0 (stream_stage.store_a never writes them)
        xbuf.store(gl.zeros([4, 16, CK // 4], xbuf.dtype, stage_layout(CK)))
        barrier()
    # attention's scratch for merging its warps' softmax states: fp32 [>= 8, RP, HD] (MMA: the whole accbuf, free
    # between GEMV tasks; CUDA-core path: its own buffer)
    if SUBVIEW_REINTERPRET:  # Triton 3.6: fp32 [8*RP, HD] (stream_attn._merge_views)
        scr = view(accbuf, gl.float32, [8 * RP, HD], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    elif MMA:
        scr = view(accbuf, gl.float32, [scr_rows(ACCG, RG, RP, HD), RP, HD],
                   gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    else:
        scr = accbuf
    for pos in range(q0, q1):
        rec = qrec + pos * REC
        kind = gl.load(rec + F_KIND)
        t = gl.load(rec + F_TASK)
        if PROFILE:
            gl.store(prof + t * 4, now())
        a = argtab + gl.load(rec + F_OP) * MAXA
        if MMA:  # the task's signal, a GEMV task's fields and operand addresses (the records and the argument
            # table are written before the step): loaded for every task before its wait, in registers when it ends
            # (the CUDA-core body's registers do not hold them: SmolLM2 batch 3 spilled 28 B)
            sig = gl.load(rec + F_SIGNAL)
            gt = gemv_task(rec, a, base_t, True)
        if kind == K_ATTN:  # it loads the old KV rows before it waits
            if ATTN_TC > 0:  # on the tensor cores (stream_attn_tc; K/V in xbuf, the warp merge in accbuf)
                attn_task_tc(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, xbuf, accbuf, PROFILE,
                             WAIT_NS, HQ, HKV, HD, S, SPLIT, NSPLIT, RP, SM_SCALE, NTA, FOLD, NSP2, NGP, ATTN_TC, B,
                             SLOTS * CK * RG * 2, prof + (n_prof + t) * 4)
            else:
                attn_task(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, scr, PROFILE, WAIT_NS, HQ,
                          HKV, HD, S, SPLIT, NSPLIT, RP, BN, SM_SCALE, NTA, FOLD, NSP2, NGP, prof + (n_prof + t) * 4)
        else:
            wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
        if TP:
            if kind == K_ALLREDUCE:  # the peers' producers of its rows (after the local ones)
                if PROFILE:  # the local waits done: the task's prof_sub row, column 0 (profile.tp_trace.stream_rows)
                    gl.store(prof + (n_prof + t) * 4, now())
                wait_remote(rec, rwl, peer_off, ev_cnt, err, epoch, t, WAIT_NS)
                if PROFILE:
                    gl.store(prof + t * 4 + 1, now())
                allreduce_task(rec, a, base_t, B, D, NR, ARD)
        if kind == K_EMBED:
            embed_task(rec, a, base_t, base_i, B, V, D, BD, peer_off + 2 * NR, PUSH, NR)
        elif kind == K_MERGE:
            merge_task(rec, a, base_t, base_f, HQ, HD, NSPLIT, NSP2, CHM, LM)
        elif kind == K_ARGMAX:
            argmax_task(a, base_f, base_i, B, BP, NT)
        elif (kind != K_ATTN) & (kind != K_ALLREDUCE):
            if MMA:
                ok, i = gemv_mma(kind, gt, rec, a, base_t, base_f, base_i, ring, xbuf, rbuf, accbuf, ok, i, err, B, BP,
                                 KXB, RG, CK, GB, SLOTS, BARS, WAIT_NS, HQ, HKV, HD, S, NT, EPS, D, PROFILE,
                                 prof + (n_prof + t) * 4, QKN, NSS, peer_off + 2 * NR, PUSH, NR)
            else:
                ok, i = gemv_fma(kind, rec, a, base_t, base_f, base_i, ring, bars, xbuf, ok, i, err, B, BP, XB, KXB,
                                 RG, CK, SLOTS, BARS, WAIT_NS, HQ, HKV, HD, S, NT, EPS, AL, peer_off + 2 * NR, PUSH, NR)
        if PROFILE:  # the publish (this barrier, the release add): prof column 3 = worker + (ns at the barrier) << 16
            t_pub = now()  # + (ns of the whole publish) << 40 (read back by profile.trace.sm_of / publish_of)
        barrier()  # every store of the task issued (and xbuf free for the next one)
        if PROFILE:
            t_bar = now()
        if not MMA:
            sig = gl.load(rec + F_SIGNAL)
        if sig >= 0:
            if TP:  # another rank reads this event (and the rows behind it): a system-scope release
                if PUSH:  # own counter (this rank's readers), then each peer's receive counter (rows pushed there)
                    gl.atomic_add(ev_cnt + sig, 1, sem="release", scope="gpu")
                    if gl.load(rec + F_SYS) != 0:
                        for q in gl.static_range(NR):
                            if gl.load(peer_off + 2 * NR + q) != 0:
                                gl.atomic_add(ev_cnt + gl.load(peer_off + NR + q) + sig, 1, sem="release", scope="sys")
                elif gl.load(rec + F_SYS) != 0:
                    gl.atomic_add(ev_cnt + sig, 1, sem="release", scope="sys")
                else:
                    gl.atomic_add(ev_cnt + sig, 1, sem="release", scope="gpu")
            else:
                gl.atomic_add(ev_cnt + sig, 1, sem="release", scope="gpu")
        if PROFILE:
            t_end = now()
            gl.store(prof + t * 4 + 2, t_end)
            gl.store(prof + t * 4 + 3, wid.to(gl.int64) + ((t_bar - t_pub) << 16) + ((t_end - t_pub) << 40))
    if i != n_chunks:
        record(err, 4, -1, i, n_chunks, 0)


@gluon.jit
def stream_megakernel(w_ptr, qrec, qoff, wl, argtab, chunk_off, ev_cnt, epoch_ptr, done_ptr, err, prof,
                      base_t, base_f, base_i, rwl, peer_off, qbeg, qend, cbeg, cend, PROFILE: gl.constexpr,
                      B: gl.constexpr, BP: gl.constexpr,
                      XB: gl.constexpr, KXB: gl.constexpr,
                      RG: gl.constexpr, CK: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr,
                      WAIT_NS: gl.constexpr, MAXA: gl.constexpr, V: gl.constexpr, D: gl.constexpr,
                      HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
                      SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr, BN: gl.constexpr,
                      NSP2: gl.constexpr, CHM: gl.constexpr, BD: gl.constexpr, NT: gl.constexpr,
                      EPS: gl.constexpr, SM_SCALE: gl.constexpr, MMA: gl.constexpr = False,
                      GB: gl.constexpr = 8, TP: gl.constexpr = False, NR: gl.constexpr = 1, ARD: gl.constexpr = 1,
                      NTA: gl.constexpr = 1, ACCG: gl.constexpr = 8, FOLD: gl.constexpr = False,
                      NGP: gl.constexpr = 2, FIRST: gl.constexpr = True,
                      LAST: gl.constexpr = True, PDL: gl.constexpr = False, ATTN_TC: gl.constexpr = 0,
                      QKN: gl.constexpr = False, NSS: gl.constexpr = 0, PUSH: gl.constexpr = False):
    """Grid (n_workers,), one CTA per SM, all co-resident. w_ptr: the packed weight stream (model dtype, 16-byte
    aligned; stream_pack: [chunks, RG, CK], 16 KB per chunk, contiguous); worker w streams chunks
    chunk_off[w]:chunk_off[w+1].
    qrec int32 [positions + 1, REC], qoff int32 [W + 1], wl int32 [n, 2] (event, expected), argtab int64
    [ops, MAXA] (buffer offsets in 16-byte units from base_t / base_f / base_i), ev_cnt int32 (monotonic
    counters), epoch / done int32 [1], err int32 [ERR_TASKS + 3 x tasks] (stream_base: the first failure, then a slot per task), prof int64 [2 x tasks, 4] (PROFILE: start, dependencies
    satisfied, end in ns of %globaltimer, worker + (ns at the last barrier) << 16 + (ns of the publish) << 40; then per task the tensor-core GEMV's sub-timings,
    stream_mma.gemv_mma, attention's, stream_attn.attn_task, and with TP an all-reduce task's local waits done in
    column 0, before its remote waits). Shared memory: the ring (SLOTS x 16 KB), xbuf
    [XB, KXB, CK] (the activation of a GEMV task's first XB <= B batch rows; the others are re-read from L2 per
    chunk) and attention's warp-merge scratch fp32 [8, RP, HD], 2 SLOTS mbarriers at byte BARS. MMA
    (gemv="mma"): instead of xbuf, the staged activation tile [4, 16, CK/4], the block's per-warp partial sums
    [ACCG >= GB, 4, 16, RG] fp32 (more groups where attention's scratch needs them: stream_smem.acc_groups) and
    (stream_base.mma_raw_tile: batch 5-8 at CK 1024) the raw tile its cp.async prefetch fills [4, RB, CK/4]; the
    ring slots hold chunks in the layout of stream_base.mma_weight_bases (both layouts: stream_base.mma_shared_layouts).

    Tensor parallel (constexpr TP; off, the kernel is the single-GPU one): all-reduce tasks (NR ranks, ARD
    columns per tile) wait on their local producers, then on the same events in every peer's counters
    (``rwl`` int32 [m, 3] = (event, expected, peer), ``ev_cnt + peer_off[peer]``: int64 [ranks] elements from
    this rank's counters to each rank's) with ``ld.acquire.sys``; tasks whose record has F_SYS signal with a
    system-scope release; err[ERR_RSLOT:ERR_RSLOT + 6] holds the remote failure (stream_base). PUSH (the push
    all-reduce, dist/tp_megakernel.py): ``peer_off`` int64 [3 x ranks] = (where the remote waits spin: this
    rank's own receive counters per sending peer; where this rank signals in each peer's receive counters; the
    element offsets from this rank's pool to each peer's, 0 for itself): a producer read remotely stores its
    rows into every peer's pool too (stream_base.push_rows), then adds to its own counter (gpu scope) and to each
    peer's receive counter (system-scope release), so an all-reduce task reads and polls only its own memory.

    Segments (exec.stream_segments: the separate-kernel modes on these bodies): worker w runs the queue positions
    qbeg[w]:qend[w] and streams the chunks cbeg[w]:cend[w] (the megakernel: qoff[w]:qoff[w+1], chunk_off[w]:
    chunk_off[w+1]); only the step's LAST kernel counts the epoch. PDL: every kernel lets the next one launch at
    once (``griddepcontrol.launch_dependents``), so its loader streams weights while the previous kernel's last
    tasks run; the dependency waits on the event counters order the tasks as in the megakernel; the FIRST kernel
    of a step waits for the previous step to complete before reading the epoch, and every kernel waits for its
    predecessor before it exits (the step's kernels complete in order)."""
    wid = gl.program_id(0)
    n_workers = gl.num_programs(0)
    if PDL:  # a step's first kernel waits for the previous step's last (the epoch, the tokens); the next may launch
        if FIRST:
            gdc_wait()
        gdc_launch_dependents()
    epoch = gl.load(epoch_ptr, volatile=True)
    wdt: gl.constexpr = w_ptr.dtype.element_ty
    ring = gl.allocate_shared_memory(wdt, [SLOTS, 32, 256],  # a chunk as the [32, 256] box of its bytes
                                     gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2))
    if MMA:
        xbuf = gl.allocate_shared_memory(wdt, [4, 16, CK // 4], mma_shared_layouts(CK, RG)[1])
        accbuf = gl.allocate_shared_memory(gl.float32, [ACCG, 4, 16, RG],
                                           gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        if mma_raw_tile(B, CK):  # the raw activation tile the cp.async prefetch fills (stream_stage.copy_a)
            rbuf = gl.allocate_shared_memory(wdt, [4, mma_raw_rows(B), CK // 4],
                                             gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        else:
            rbuf = xbuf
    else:
        xbuf = gl.allocate_shared_memory(wdt, [XB, KXB, CK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        # the CUDA-core path's accbuf: attention's warp-merge scratch fp32 [8, RP, HD] (stream_plan.fma_xbuf_bytes)
        accbuf = gl.allocate_shared_memory(gl.float32, [8, RP, HD], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        rbuf = xbuf
    bars = gl.allocate_shared_memory(gl.int64, [2 * SLOTS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(SLOTS):
        mbarrier.init(bars.index(j), count=1)          # ready: the loader's expect + the copy's bytes
    for j in gl.static_range(SLOTS, 2 * SLOTS):
        mbarrier.init(bars.index(j), count=4)          # empty: one arrive per consumer warp
    c0 = gl.load(cbeg + wid)
    n_chunks = gl.load(cend + wid) - c0
    gl.warp_specialize([
        (_consumer, (ring, bars, xbuf, rbuf, accbuf, qrec, qoff, qbeg, qend, wl, argtab, ev_cnt, err, prof, base_t,
                     base_f, base_i, wid,
                     epoch, n_chunks, PROFILE, B, BP, XB, KXB, RG, CK, SLOTS, BARS, WAIT_NS, MAXA, V, D, HQ, HKV, HD, S,
                     SPLIT, NSPLIT, RP, BN, NSP2, CHM, BD, NT, EPS, SM_SCALE, MMA, GB, rwl, peer_off, TP, NR, ARD,
                     NTA, ACCG, FOLD, NGP, ATTN_TC, QKN, NSS, PUSH)),
        (_loader, (w_ptr, ring, bars, err, c0, n_chunks, SLOTS, BARS, WAIT_NS)),
    ], [1], [24])
    if PDL:  # complete only after the previous kernel: the step's kernels complete in order
        gdc_wait()
    if LAST:
        done = gl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
        if done == n_workers * epoch - 1:
            gl.atomic_add(epoch_ptr, 1, sem="release", scope="gpu")
