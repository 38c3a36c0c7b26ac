"""The streaming megakernel's tensor-core GEMV body (Gluon, sm_90; a ``gemv="mma"`` step): per k-major block of
GB chunk groups and per k-chunk, the [16, CK] activation tile (batch padded to 16, RMSNorm applied) is staged
once in shared memory and loaded once as operand A, then every chunk of the block is operand B straight from its
ring slot (``ldmatrix``), ``mma.sync`` m16n8k16 with fp32 accumulators, each warp a fixed CK/4 k-slice; the
warps' partials are summed in a fixed order per block and fed to the epilogues of ``exec.stream_epilogue``. The
activation tile's loads, copies and RMSNorm'd stores: ``exec.stream_stage``.
docs/DESIGN.md, "Tensor cores in the streaming megakernel"; the worker loop that calls it: ``exec.stream_device``.
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from onekernel.exec.stream_base import (F_IDX, F_SS, F_SYS, K_GATEUP, K_LMHEAD, K_QKV, K_RESID, MMA_CHAINS, barrier, mma_async_a,
                                        mma_direct_a, mma_shared_layouts, mma_split, now, push_rows, smem_addr, view,
                                        wait_bounded, warp_release)
from onekernel.exec.stream_epilogue import (gateup_out, lm_out, qk_norm_head, qkv_buffers, qkv_out, rope_cos_sin,
                                           ss_buffer)
from onekernel.exec.stream_stage import copy_a, load_a, raw_a, rstd16, rstd_partials, stack, stage_layout, store_a
from onekernel.ops.gemv_rows import rnd

# a block's GB group sums to accbuf in one store (stream_stage.stack); STREAM_STACK_ACC=0: one store per group
STACK_ACC = gl.constexpr(os.environ.get("STREAM_STACK_ACC", "1") == "1")


# ----------------------------------------------------------------------------------------------- GEMV, tensor cores
# gemv="mma" (consts MMA): per chunk ``acc[w] [16, RG] += A[w] [16, CK/4] @ W[w] [CK/4, RG]`` with mma.sync
# m16n8k16 (fp32 accumulate), warp w taking the chunk's k-slice w (A: the [16, CK] activation tile staged in
# shared memory, batch rows >= B zero; W: the ring slot, chunk packed as [4, CK/4, RG] by stream_plan); per task
# the chunks come in k-major blocks of GB groups (stream_pack.mma_chunk_order) so one staged tile serves GB
# chunks; per chunk each warp runs SP = MMA_CHAINS independent chains over its k-slice's SP parts (the operands
# viewed as [4 * SP, ...], stream_base.split_k_bases), summed ((c0 + c1) + c2) + c3 into the group's sums; at a
# block's end the 4 warps' partials go to shared memory and each output is ((w0 + w1) + w2) + w3: the same
# instructions, shapes and sum order for every B (batch invariance).
@gluon.jit
def _next_chunk(ring, ready0, empty0, ok, i, ps, err, t, SP: gl.constexpr, KS: gl.constexpr, RG: gl.constexpr,
                WSL: gl.constexpr, DB: gl.constexpr, SLOTS: gl.constexpr, WAIT_NS: gl.constexpr, PROFILE: gl.constexpr):
    """The stream's chunk i as operand B: wait for its ring slot (bounded; ``ok`` 0 after a timeout), ``ldmatrix``
    it into registers ([4 * SP, KS / SP, RG] in layout DB), release the slot per warp; (ok, i + 1, ps with the wait
    added to ps[1] under PROFILE, operand B)."""
    slot = i % SLOTS
    if PROFILE:
        t_w = now()
    ok = wait_bounded(ok, ready0 + 8 * slot, (i // SLOTS) & 1, err, 2, t, i, slot, WAIT_NS)
    if PROFILE:
        ps = (ps[0], ps[1] + (now() - t_w), ps[2])
    wb = view(ring.index(slot), ring.dtype, [4 * SP, KS // SP, RG], WSL).load(DB)
    warp_release(empty0 + 8 * slot, ok)
    return ok, i + 1, ps, wb


@gluon.jit
def _mma_block(ring, abuf, rbuf, accbuf, x, nw, K, rs, norm, pre, ng, nkb, more, ok, i, err, t, ps, B: gl.constexpr,
               RG: gl.constexpr, CK: gl.constexpr, GB: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr,
               WAIT_NS: gl.constexpr, ASYNC: gl.constexpr, DIRECT: gl.constexpr, PROFILE: gl.constexpr):
    """One k-major block of ng <= GB chunk groups (stream order: for kb, for each group): per kb the activation
    tile is staged once (store_a, CTA barriers around it) from the loads ``pre`` issued during the previous
    tile's chunks (registers; with ASYNC, cp.async copies into rbuf and the norm weights in registers; with DIRECT,
    cp.async copies into abuf itself, RMSNorm in place, the next tile's copies issued once every warp holds operand
    A, none past the task's last tile: ``more`` = a block follows), and the
    loads of the next tile (the next block's first one after the last) are issued; it is loaded into registers
    once (operand A), then each
    group's chunk is read from its ring slot (operand B, ``ldmatrix``), the slot released per warp, and
    ``mma_v2`` computes the chunk's SP chains from 0 (per warp: its k-slice's SP parts, [4 * SP, 16, RG]), summed
    into the group's fp32 [4, 16, RG] in a fixed order. Groups g >= ng are skipped
    (their accumulators stay 0). At the end each group's per-warp partials go to accbuf[g] (summed by _acc_of
    after a barrier): with GB 8, all groups in one store (stream_stage.stack; Triton's barrier pass puts a CTA barrier between
    two stores to one buffer, 7 per block before). PROFILE: ``ps`` = (ns staging tiles, ns waiting on ring slots, tiles staged + (ns of the
    staging spent before its first barrier: the wait for the tile's loads and the other warps) << 16) accumulates
    (the staging time runs from the tile's first barrier to the barrier after it: the wait for its loads
    included)."""
    KS: gl.constexpr = CK // 4
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])
    DA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    DB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    SP: gl.constexpr = mma_split(CK, MMA_CHAINS)
    WSL: gl.constexpr = mma_shared_layouts(CK, RG, SP)[0]
    ASL: gl.constexpr = mma_shared_layouts(CK, RG, SP)[1]
    ready0 = smem_addr(BARS)
    empty0 = smem_addr(BARS + 8 * SLOTS)
    z = gl.zeros([4 * SP, 16, RG], gl.float32, MMA)
    accs = ()
    for g in gl.static_range(GB):
        if SP == 1:
            accs = accs + (z,)
        else:
            accs = accs + (gl.sum(gl.reshape(z, [SP, 4, 16, RG]), axis=0),)
    for kb in range(nkb):
        if PROFILE:
            t_a = now()
        if ASYNC:
            async_copy.wait_group(0)  # this thread's copies of tile kb landed (the barrier: every thread's)
        barrier()  # every warp done with the previous tile
        if PROFILE:  # the wait for the tile's loads (and the other warps), counted above bit 16 of ps[2]
            ps = (ps[0], ps[1], ps[2] + ((now() - t_a) << 16))
        if DIRECT:  # the raw tile landed in abuf: RMSNorm in place, operand A, then the next tile's copies into abuf
            if norm != 0:  # each thread rewrites the elements it read (the same layout): no barrier between
                store_a(abuf, raw_a(abuf, pre, B, CK), rs, norm, B, CK)
                barrier()  # every warp's normed slice stored before operand A's ldmatrix
            xa = view(abuf, abuf.dtype, [4 * SP, 16, KS // SP], ASL).load(DA)
            barrier()  # every warp's operand A read before the copies overwrite abuf
            if PROFILE:
                ps = (ps[0] + (now() - t_a), ps[1], ps[2] + 1)
            if (kb + 1 < nkb) | more:  # no wrap-around copy: abuf is attention's between GEMV tasks
                pre = copy_a(abuf, x, nw, K, gl.where(kb + 1 < nkb, kb + 1, 0), norm, B, CK)
        else:
            if ASYNC:
                store_a(abuf, raw_a(rbuf, pre, B, CK), rs, norm, B, CK)
            else:
                store_a(abuf, pre, rs, norm, B, CK)
            barrier()  # (ASYNC: every read of rbuf done before the next copies overwrite it)
            if PROFILE:
                ps = (ps[0] + (now() - t_a), ps[1], ps[2] + 1)
            # the next tile's loads fly during this tile's chunks: tile kb + 1, or tile 0 of the next block (a
            # block's tiles depend on kb only); the last block's wrap-around load is an unused L2 read
            nxt = gl.where(kb + 1 < nkb, kb + 1, 0)
            if ASYNC:
                pre = copy_a(rbuf, x, nw, K, nxt, norm, B, CK)
            else:
                pre = load_a(x, nw, K, nxt, norm, B, CK)
            xa = view(abuf, abuf.dtype, [4 * SP, 16, KS // SP], ASL).load(DA)
        new = ()
        for g in gl.static_range(GB):
            acc = accs[g]
            if g < ng:
                ok, i, ps, wb = _next_chunk(ring, ready0, empty0, ok, i, ps, err, t, SP, KS, RG, WSL, DB, SLOTS,
                                            WAIT_NS, PROFILE)
                if SP == 1:
                    acc = mma_v2(xa, wb, acc)
                else:  # SP independent chains from 0, summed into the group's sums in a fixed order
                    acc = acc + gl.sum(gl.reshape(mma_v2(xa, wb, z), [SP, 4, 16, RG]), axis=0)
            new = new + (acc,)
        accs = new
    if STACK_ACC and GB == 8:  # one store (GB stores to one buffer get a CTA barrier between each two)
        rows = view(accbuf, gl.float32, [accbuf.shape[0] * 4, 16, RG], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        rows.slice(0, GB * 4).store(gl.reshape(stack(accs), [GB * 4, 16, RG]))
    else:
        for g in gl.static_range(GB):
            accbuf.index(g).store(accs[g])
    return ok, i, pre, ps


@gluon.constexpr_function
def _mma_out_layout(RG):
    """[BP, RG] layout of the MMA path's epilogues: rows over lanes, batch rows over warps (the CUDA-core
    path's AL replicates [BP, RG] in every lane: 128 values per thread at BP 16, RG 32, where RoPE's cos / sin
    spilled)."""
    return gl.BlockedLayout([1, 1], [32 // RG, RG], [4, 1], [1, 0])


@gluon.jit
def _acc_of(accbuf, g, BP: gl.constexpr, RG: gl.constexpr, AL: gl.constexpr):
    """fp32 [BP, RG] (layout AL) of group g of the block: the 4 warps' partials (accbuf[g], rows < BP)
    summed inside each thread (the warp axis in registers: the same order for every B)."""
    P3: gl.constexpr = gl.BlockedLayout([4, 1, 1], [1, 32 // RG, RG], [1, 4, 1], [2, 1, 0])  # slice 0: _mma_out_layout
    p = accbuf.index(g).slice(0, BP, dim=1).load(P3)
    return gl.convert_layout(gl.sum(p, axis=0), AL)


@gluon.jit
def gemv_mma(kind, gt, rec, a, base_t, base_f, base_i, ring, abuf, rbuf, accbuf, ok, i, err,
             B: gl.constexpr, BP: gl.constexpr, KXB: gl.constexpr, RG: gl.constexpr, CK: gl.constexpr,
             GB: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr, WAIT_NS: gl.constexpr, HQ: gl.constexpr,
             HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr, NT: gl.constexpr, EPS: gl.constexpr,
             D: gl.constexpr, PROFILE: gl.constexpr, sub, QKN: gl.constexpr = False, NSS: gl.constexpr = 0,
             pdelta=None, PUSH: gl.constexpr = False, NR: gl.constexpr = 1):
    """One GEMV task on the tensor cores (gemv="mma"): the units of stream_fma.gemv_fma in k-major blocks of GB chunk groups
    (GB / 2 units for gate_up; stream_pack.mma_chunk_order), each block's sums by _mma_block, then the same
    epilogues as gemv_fma per unit of the block (sums read back by _acc_of). ``gt``: the task's fields
    (stream_epilogue.gemv_task), loaded by the caller before its dependency wait. Every load of the epilogues
    (residual rows, positions, RoPE frequencies) is issued before the block whose sums they meet, so no L2
    round trip follows the last chunk but the stores. PROFILE: ``sub`` (int64 [4], the task's row of the
    runner's ``prof_sub``) = ns staging activation tiles, ns waiting on ring slots, ns in the epilogues (from the
    block's end to its outputs' stores) + (ns from the body's start to its first block: the operand pointers and the
    rstd pass) << 32, tiles staged + (ns of the staging spent waiting for the tiles' loads, before their first
    barrier) << 16; the rest of the task's time (prof: end - ready) is the fields, the chunks' ldmatrix / MMA and
    the release. PUSH (tensor parallel): a residual task whose signal a peer waits on (F_SYS) also stores its
    outputs into every peer's pool (stream_base.push_rows over ``pdelta``)."""
    dt: gl.constexpr = base_t.dtype.element_ty
    AL: gl.constexpr = _mma_out_layout(RG)
    if PROFILE:
        t_in = now()
    t, u0, nu, K, nkb, N, x, nw = gt
    norm = (kind != K_RESID).to(gl.int32)
    gpu = 1 + (kind == K_GATEUP).to(gl.int32)   # chunk groups per unit
    UB = GB // gpu                              # units per block
    # each activation tile's loads fly during the previous tile's chunks: in registers where they fit (one 4-row
    # quad: at CK = 1024 up to batch 4), else (ASYNC) as cp.async copies into rbuf (batch 5-8: 8 rows), above
    # batch 8 (DIRECT) into abuf itself (stream_base.mma_async_a, mma_direct_a). The first tile's loads fly during
    # the rstd pass
    ASYNC: gl.constexpr = mma_async_a(B, CK)
    DIRECT: gl.constexpr = mma_direct_a(B, CK)
    if DIRECT:  # the tiles go straight to abuf (no raw tile)
        pre = copy_a(abuf, x, nw, K, 0, norm, B, CK)
    elif ASYNC:
        pre = copy_a(rbuf, x, nw, K, 0, norm, B, CK)
    else:
        pre = load_a(x, nw, K, 0, norm, B, CK)
    bidx = gl.arange(0, BP, layout=gl.SliceLayout(1, AL))
    r = gl.arange(0, RG, layout=gl.SliceLayout(0, AL))
    bm = bidx[:, None] < B
    b64 = bidx.to(gl.int64)[:, None]
    isq = kind == K_QKV
    isr = kind == K_RESID
    q, kc, vc, pos, inv_freq = qkv_buffers(a, base_t, base_f, base_i, bidx, B, isq)
    res = base_t + gl.load(a + 1) * 8
    out = base_t + gl.load(a + 2) * 8
    if NSS > 0:  # RMSNorm partials (stream_plan.SS_PARTIALS): a residual task writes them, a normed one reads them
        ssf = gl.load(rec + F_SS)
        ssb = ss_buffer(kind, a, base_f)
    if norm != 0:
        if NSS > 0:
            if ssf != 0:  # x's producer summed its rows' squares: NSS partials a row, not the rows themselves
                rs = rstd_partials(ssb, K, B, NSS, CK, EPS)
            else:
                rs = rstd16(x, K, B, CK, EPS, D)
        else:
            rs = rstd16(x, K, B, CK, EPS, D)
    else:
        rs = rstd16(x, K, 0, CK, EPS, D)       # zeros, no loads
    CH: gl.constexpr = HD // RG
    P: gl.constexpr = RG // 2
    best = gl.full([BP], float("-inf"), gl.float32, gl.SliceLayout(1, AL))
    barg = gl.zeros([BP], gl.int32, gl.SliceLayout(1, AL))
    ssq = gl.zeros([BP], gl.float32, gl.SliceLayout(1, AL))  # a residual task's rows' sums of squares (NSS)
    ps = (0, 0, 0)
    epi = 0
    if PROFILE:  # the time before the first block (operand pointers, the rstd pass): above bit 32 of sub[2]
        t_b = now()
        z = t_b * 0
        ps = (z, z, z)
        epi = (t_b - t_in) << 32
    for ub in range(u0, u0 + nu, UB):
        ue = gl.minimum(ub + UB, u0 + nu)
        # the block's epilogue operands (masked to the kind that uses them): residual rows, RoPE frequencies
        pf = ()
        for j in gl.static_range(GB):
            u = ub + j
            offs = b64 * N + (u * RG + r)[None, :]
            m = bm & ((u * RG + r) < N)[None, :] & (u < ue)
            pf = pf + ((gl.load(res + offs, mask=m & isr, other=0.0, cache_modifier=".cg"),
                        gl.load(inv_freq + (u % CH) * P + (r % P), mask=isq & (u < ue), other=0.0)),)
        ok, i, pre, ps = _mma_block(ring, abuf, rbuf, accbuf, x, nw, K, rs, norm, pre, (ue - ub) * gpu, nkb,
                                    ue < u0 + nu, ok, i, err, t, ps, B, RG, CK, GB, SLOTS, BARS, WAIT_NS, ASYNC, DIRECT,
                                    PROFILE)
        if PROFILE:
            t_e = now()
        barrier()  # every warp's partials in accbuf
        if kind == K_RESID:
            if PUSH:
                sysf = gl.load(rec + F_SYS)
            for j in gl.static_range(GB):
                u = ub + j
                if u < ue:
                    offs = b64 * N + (u * RG + r)[None, :]
                    m = bm & ((u * RG + r) < N)[None, :]
                    acc = _acc_of(accbuf, j, BP, RG, AL)
                    if NSS > 0:  # and the stored values' squares (rows >= N and >= B are 0), in unit order
                        y = (pf[j][0].to(gl.float32) + rnd(acc, dt)).to(dt)
                        gl.store(out + offs, y, mask=m)
                        yf = y.to(gl.float32)
                        ssq = ssq + gl.sum(yf * yf, axis=1)
                    elif PUSH:
                        y = (pf[j][0].to(gl.float32) + rnd(acc, dt)).to(dt)
                        gl.store(out + offs, y, mask=m)
                        if sysf != 0:
                            push_rows(out + offs, y, m, pdelta, NR)
                    else:
                        gl.store(out + offs, (pf[j][0].to(gl.float32) + rnd(acc, dt)).to(dt), mask=m)
        elif kind == K_GATEUP:
            for u in range(ub, ue):
                gateup_out(_acc_of(accbuf, 2 * (u - ub), BP, RG, AL), _acc_of(accbuf, 2 * (u - ub) + 1, BP, RG, AL), u, r,
                           b64, bm, N, out, RG)
        elif kind == K_QKV:
            for j in gl.static_range(GB):
                u = ub + j
                if u < ue:
                    if QKN:  # the raw rows (no cos / sin: qk_norm_head normalises, then rotates, after the last block)
                        cs, sn = pf[j][1], pf[j][1]
                    else:
                        cs, sn = rope_cos_sin(pos, pf[j][1], dt)
                    qkv_out(_acc_of(accbuf, j, BP, RG, AL), cs, sn, u // CH, u % CH, r, bm, b64, pos, q, kc, vc, HQ,
                            HKV, HD, S, RG, BP, AL, not QKN)
        else:  # K_LMHEAD
            logits = base_f + gl.load(a + 2) * 4
            for u in range(ub, ue):
                best, barg = lm_out(_acc_of(accbuf, u - ub, BP, RG, AL), u, r, b64, bm, N, logits, best, barg, dt, RG)
        if PROFILE:
            epi = epi + (now() - t_e)
    if QKN:  # Qwen3 (stream_plan: a qkv task holds whole heads): each q / k head's RMSNorm, then RoPE
        if kind == K_QKV:
            if PROFILE:  # counted with the epilogues
                t_e = now()
            barrier()  # every warp's raw rows stored
            for h in range(u0 // CH, (u0 + nu) // CH):
                if h < HQ + HKV:
                    qk_norm_head(h, q, kc, base_t + gl.load(a + 7) * 8, base_t + gl.load(a + 8) * 8,
                                 base_i + gl.load(a + 5) * 4, inv_freq, B, BP, HQ, HKV, HD, S, EPS)
            if PROFILE:
                epi = epi + (now() - t_e)
    if PROFILE:
        gl.store(sub, ps[0])
        gl.store(sub + 1, ps[1])
        gl.store(sub + 2, epi)
        gl.store(sub + 3, ps[2])
    if NSS > 0:
        if (kind == K_RESID) & (ssf != 0):  # this task's column of the RMSNorm partials
            gl.store(ssb + bidx * NSS + gl.load(rec + F_IDX), ssq, mask=bidx < B)
    if ASYNC:  # the wrap-around copy: landed before the next task's copies can target rbuf
        async_copy.wait_group(0)
    if kind == K_LMHEAD:
        pmax = base_f + gl.load(a + 3) * 4
        pidx = base_i + gl.load(a + 4) * 4
        idx = gl.load(rec + F_IDX)
        gl.store(pmax + bidx * NT + idx, best, mask=bidx < B)
        gl.store(pidx + bidx * NT + idx, barg, mask=bidx < B)
    return ok, i
