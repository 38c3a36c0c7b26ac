"""The streaming megakernel's tensor-core GEMV body (Gluon, sm_90; a ``gemv="mma"`` step): per k-major block of
GB chunk groups and per k-chunk, the [16, CK] activation tile (batch padded to 16, RMSNorm applied) is staged
once in shared memory and loaded once as operand A, then every chunk of the block is operand B straight from its
ring slot (``ldmatrix``), ``mma.sync`` m16n8k16 with fp32 accumulators, each warp a fixed CK/4 k-slice; the
warps' partials are summed in a fixed order per block and fed to the epilogues of ``exec.stream_epilogue``.
docs/DESIGN.md, "Tensor cores in the streaming megakernel"; the worker loop that calls it: ``exec.stream_device``.
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from onekernel.exec.stream_base import (F_IDX, K_GATEUP, K_LMHEAD, K_QKV, K_RESID, MMA_CHAINS, barrier, mma_async_a,
                                        mma_direct_a, mma_shared_layouts, mma_split, now, smem_addr, view, wait_bounded,
                                        warp_release)
from onekernel.exec.stream_epilogue import gateup_out, lm_out, qk_norm_head, qkv_buffers, qkv_out, rope_cos_sin
from onekernel.ops.gemv_rows import rnd

# a block's GB group sums to accbuf in one store (_stack8); STREAM_STACK_ACC=0: one store per group
STACK_ACC = gl.constexpr(os.environ.get("STREAM_STACK_ACC", "1") == "1")
# the activation tile's live quads copied and stored as one (one_stage); STREAM_ONE_STAGE=0: one per quad
ONE_STAGE = gl.constexpr(os.environ.get("STREAM_ONE_STAGE", "1") == "1")


# ----------------------------------------------------------------------------------------------- GEMV, tensor cores
# gemv="mma" (consts MMA): per chunk ``acc[w] [16, RG] += A[w] [16, CK/4] @ W[w] [CK/4, RG]`` with mma.sync
# m16n8k16 (fp32 accumulate), warp w taking the chunk's k-slice w (A: the [16, CK] activation tile staged in
# shared memory, batch rows >= B zero; W: the ring slot, chunk packed as [4, CK/4, RG] by stream_plan); per task
# the chunks come in k-major blocks of GB groups (stream_pack.mma_chunk_order) so one staged tile serves GB
# chunks; per chunk each warp runs SP = MMA_CHAINS independent chains over its k-slice's SP parts (the operands
# viewed as [4 * SP, ...], stream_base.split_k_bases), summed ((c0 + c1) + c2) + c3 into the group's sums; at a
# block's end the 4 warps' partials go to shared memory and each output is ((w0 + w1) + w2) + w3: the same
# instructions, shapes and sum order for every B (batch invariance).
@gluon.constexpr_function
def stage_layout(CK):
    """[4 warps, 4 batch rows, CK/4] staging layout: 8 consecutive k per thread (16-byte accesses), warp w holds
    the k-slice its MMA reads."""
    KS = CK // 4
    TK = 32 if KS >= 256 else KS // 8
    return gl.BlockedLayout([1, 1, 8], [1, 32 // TK, TK], [4, 1, 1], [2, 1, 0])


@gluon.jit
def _rstd16(x, K, B: gl.constexpr, CK: gl.constexpr, EPS: gl.constexpr, D: gl.constexpr):
    """RMSNorm's rstd of every batch row of x [B, K], as 4 quads of fp32 [4] (rows 4q..4q+3, in the staging
    layout's row slice; rows >= B: 0). Per k-chunk (a runtime loop: registers do not grow with K) a [4, CK] tile
    per quad that holds a row < B (quads past B: compile-time zeros), its squares summed along the chunk and
    added to the quad's sums in k order: row b's sum has the same operands and order for every B. A normed
    task's K is the hidden size D: where its k-chunks' tiles fit in registers together (quads x D / CK <= 4) the
    loop is unrolled over D (masked by K), so every load is in flight at once (one L2 round trip, not D / CK)."""
    SL3: gl.constexpr = stage_layout(CK)
    RQ: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, SL3))
    TL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    r4 = gl.arange(0, 4, layout=gl.SliceLayout(1, TL))
    cols = gl.arange(0, CK, layout=gl.SliceLayout(0, TL))[None, :]
    ss = ()
    for q in gl.static_range(4):
        ss = ss + (gl.zeros([4], gl.float32, gl.SliceLayout(1, TL)),)
    if ((B + 3) // 4) * (D // CK) <= 4:
        for k0 in gl.static_range(0, D, CK):
            ss = _rstd_step(x, K, k0, ss, r4, cols, B)
    else:
        for k0 in range(0, K, CK):
            ss = _rstd_step(x, K, k0, ss, r4, cols, B)
    rs = ()
    for q in gl.static_range(4):
        rows = q * 4 + r4
        rs = rs + (gl.convert_layout(gl.where(rows < B, gl.rsqrt(ss[q] / K + EPS), 0.0), RQ),)
    return rs


@gluon.jit
def _rstd_step(x, K, k0, ss, r4, cols, B: gl.constexpr):
    """_rstd16's quads' sums of squares plus k-chunk k0's."""
    new = ()
    for q in gl.static_range(4):
        s = ss[q]
        if q * 4 < B:
            rows = q * 4 + r4
            v = gl.load(x + rows[:, None] * K + k0 + cols, mask=(rows[:, None] < B) & (k0 + cols < K), other=0.0,
                        cache_modifier=".cg").to(gl.float32)
            s = s + gl.sum(v * v, axis=1)
        new = new + (s,)
    return new


@gluon.constexpr_function
def one_stage(B):
    """Whether the activation tile's quads are copied and stored as one (2 or 4 quads: batch 5-8 and 13-16; 3 quads
    stay one per quad, as do batch 1-4's single quad)."""
    return bool(ONE_STAGE) and (B + 3) // 4 in (2, 4)


@gluon.jit
def _quads(t):
    """The 2 or 4 tensors of tuple t ([4, 4, N] each, one layout: rows 4q.. of quad q) as one [4, 4 len(t), N];
    join and permute only relabel registers, no data moves."""
    N: gl.constexpr = t[0].shape[2]
    if len(t) == 2:
        return gl.reshape(gl.permute(gl.join(t[0], t[1]), [0, 3, 1, 2]), [4, 8, N])
    else:
        j = gl.join(gl.join(t[0], t[1]), gl.join(t[2], t[3]))  # [4, 4, N, q bit 0, q bit 1]
        return gl.reshape(gl.permute(j, [0, 4, 3, 1, 2]), [4, 16, N])


@gluon.jit
def _tile_index(kb, CK: gl.constexpr):
    """(k index [4 warp slices, 1, CK/4], row-in-quad index [1, 4, 1]) of activation tile kb in the staging
    layout: warp slice w holds k = kb*CK + w*CK/4 + [0, CK/4)."""
    KS: gl.constexpr = CK // 4
    SL3: gl.constexpr = stage_layout(CK)
    kk = kb * CK + gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, SL3)))[:, None, None] * KS + \
        gl.arange(0, KS, layout=gl.SliceLayout(0, gl.SliceLayout(1, SL3)))[None, None, :]
    r4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL3)))[None, :, None]
    return kk, r4


@gluon.jit
def _load_a(x, nw, K, kb, norm, B: gl.constexpr, CK: gl.constexpr):
    """The loads of activation tile kb (_store_a stages it): x[4q:4q+4, kb*CK:(kb+1)*CK] per 4-row quad that
    holds a row < B (quads past B: compile-time skipped), as [4 warp slices, 4 rows, CK/4] in the model dtype
    (0 past B and K), and the norm weights of the tile (0 unless norm)."""
    kk, r4 = _tile_index(kb, CK)
    g = gl.load(nw + kk, mask=(kk < K) & (norm != 0), other=0.0)
    vs = (g,)
    for q in gl.static_range(4):
        if q * 4 < B:
            vs = vs + (gl.load(x + (q * 4 + r4) * K + kk, mask=((q * 4 + r4) < B) & (kk < K), other=0.0,
                               cache_modifier=".cg"),)
    return vs


@gluon.jit
def _norm_bf16(y, g):
    """rnd(rnd(y, bf16) * g) as bf16 for fp32 y and bf16 g (RMSNorm's two rounding points, HF's order):
    ``cvt.rn.bf16x2.f32`` rounds two y to bf16, ``mul.rn.bf16x2`` multiplies them by two g and rounds once. A
    product of two bf16 values is exact in fp32 (16 significant bits) above fp32's subnormal range, so the packed
    multiply gives the bits of rounding the fp32 product: 1.5 instructions per value in all."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $2, $1; mul.rn.bf16x2 $0, t, $3; }",
        "=r,f,f,r", [y, g], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def _store_a(abuf, vs, rs, norm, B: gl.constexpr, CK: gl.constexpr):
    """abuf [4, 16, CK/4] = the (RMSNorm?)tile _load_a loaded, as [warp slice, batch row, k], for the quads that
    hold a row < B (abuf holds zeros in the others from the start: operand A's rows >= B are 0). RMSNorm as
    _fill_x / _xrow (HF's rounding points: ``rnd(rnd(x * rstd) * w)``), so the MMA multiplies the values
    F.linear does. bf16: both roundings by the hardware's packed conversions (_norm_bf16, the same bits); fp16
    keeps rnd. Where one_stage(B) (2 or 4 live quads), the quads go to abuf in one store (_quads)."""
    dt: gl.constexpr = abuf.dtype
    outs = ()
    for q in gl.static_range(4):
        if q * 4 < B:
            v = vs[1 + q]
            if norm != 0:
                y = v.to(gl.float32) * rs[q][None, :, None]
                if dt == gl.bfloat16:
                    v = _norm_bf16(y, gl.broadcast(vs[0], y)[0])
                else:
                    v = rnd(rnd(y, dt) * vs[0].to(gl.float32), dt).to(dt)
            if one_stage(B):
                outs = outs + (v,)
            else:
                abuf.slice(q * 4, 4, dim=1).store(v)
    if one_stage(B):  # one store: a store per quad would get a CTA barrier before each (one buffer)
        abuf.slice(0, len(outs) * 4, dim=1).store(_quads(outs))


@gluon.jit
def _copy_a(rbuf, x, nw, K, kb, norm, B: gl.constexpr, CK: gl.constexpr):
    """ASYNC (mma_async_a): the loads of activation tile kb as cp.async copies into rbuf [4, RB, CK/4] (or, DIRECT,
    abuf [4, 16, CK/4]): the quads that hold a row < B, 0 past B and K; one commit group; returns the tile's norm
    weights (registers, as _load_a's). ``.cg``: L2 only, as every read of an activation another SM wrote this step.
    Where one_stage(B), one copy of all live quads' rows."""
    kk, r4 = _tile_index(kb, CK)
    if one_stage(B):  # one copy of every live quad's rows (a copy per quad: a CTA barrier between each two)
        NR: gl.constexpr = (B + 3) // 4 * 4
        r = gl.arange(0, NR, layout=gl.SliceLayout(0, gl.SliceLayout(2, stage_layout(CK))))[None, :, None]
        async_copy.async_copy_global_to_shared(rbuf.slice(0, NR, dim=1), x + r * K + kk, mask=(r < B) & (kk < K),
                                               cache_modifier=".cg")
    else:
        for q in gl.static_range(4):
            if q * 4 < B:
                async_copy.async_copy_global_to_shared(rbuf.slice(q * 4, 4, dim=1), x + (q * 4 + r4) * K + kk,
                                                       mask=((q * 4 + r4) < B) & (kk < K), cache_modifier=".cg")
    async_copy.commit_group()
    return gl.load(nw + kk, mask=(kk < K) & (norm != 0), other=0.0)


@gluon.jit
def _raw_a(rbuf, g, B: gl.constexpr, CK: gl.constexpr):
    """The tile _copy_a copied (after its wait and a CTA barrier), read back as _load_a returns it: (g, quads)."""
    SL3: gl.constexpr = stage_layout(CK)
    vs = (g,)
    for q in gl.static_range(4):
        if q * 4 < B:
            vs = vs + (rbuf.slice(q * 4, 4, dim=1).load(SL3),)
    return vs


@gluon.jit
def _mma_block(ring, abuf, rbuf, accbuf, x, nw, K, rs, norm, pre, ng, nkb, more, ok, i, err, t, ps, B: gl.constexpr,
               RG: gl.constexpr, CK: gl.constexpr, GB: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr,
               WAIT_NS: gl.constexpr, ASYNC: gl.constexpr, DIRECT: gl.constexpr, PROFILE: gl.constexpr):
    """One k-major block of ng <= GB chunk groups (stream order: for kb, for each group): per kb the activation
    tile is staged once (_store_a, CTA barriers around it) from the loads ``pre`` issued during the previous
    tile's chunks (registers; with ASYNC, cp.async copies into rbuf and the norm weights in registers; with DIRECT,
    cp.async copies into abuf itself, RMSNorm in place, the next tile's copies issued once every warp holds operand
    A, none past the task's last tile: ``more`` = a block follows), and the
    loads of the next tile (the next block's first one after the last) are issued; it is loaded into registers
    once (operand A), then each
    group's chunk is read from its ring slot (operand B, ``ldmatrix``), the slot released per warp, and
    ``mma_v2`` computes the chunk's SP chains from 0 (per warp: its k-slice's SP parts, [4 * SP, 16, RG]), summed
    into the group's fp32 [4, 16, RG] in a fixed order. Groups g >= ng are skipped
    (their accumulators stay 0). At the end each group's per-warp partials go to accbuf[g] (summed by _acc_of
    after a barrier): with GB 8, all groups in one store (_stack8; Triton's barrier pass puts a CTA barrier between
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
                _store_a(abuf, _raw_a(abuf, pre, B, CK), rs, norm, B, CK)
                barrier()  # every warp's normed slice stored before operand A's ldmatrix
            xa = view(abuf, abuf.dtype, [4 * SP, 16, KS // SP], ASL).load(DA)
            barrier()  # every warp's operand A read before the copies overwrite abuf
            if PROFILE:
                ps = (ps[0] + (now() - t_a), ps[1], ps[2] + 1)
            if (kb + 1 < nkb) | more:  # no wrap-around copy: abuf is attention's between GEMV tasks
                pre = _copy_a(abuf, x, nw, K, gl.where(kb + 1 < nkb, kb + 1, 0), norm, B, CK)
        else:
            if ASYNC:
                _store_a(abuf, _raw_a(rbuf, pre, B, CK), rs, norm, B, CK)
            else:
                _store_a(abuf, pre, rs, norm, B, CK)
            barrier()  # (ASYNC: every read of rbuf done before the next copies overwrite it)
            if PROFILE:
                ps = (ps[0] + (now() - t_a), ps[1], ps[2] + 1)
            # the next tile's loads fly during this tile's chunks: tile kb + 1, or tile 0 of the next block (a
            # block's tiles depend on kb only); the last block's wrap-around load is an unused L2 read
            nxt = gl.where(kb + 1 < nkb, kb + 1, 0)
            if ASYNC:
                pre = _copy_a(rbuf, x, nw, K, nxt, norm, B, CK)
            else:
                pre = _load_a(x, nw, K, nxt, norm, B, CK)
            xa = view(abuf, abuf.dtype, [4 * SP, 16, KS // SP], ASL).load(DA)
        new = ()
        for g in gl.static_range(GB):
            acc = accs[g]
            if g < ng:
                slot = i % SLOTS
                if PROFILE:
                    t_w = now()
                ok = wait_bounded(ok, ready0 + 8 * slot, (i // SLOTS) & 1, err, 2, t, i, slot, WAIT_NS)
                if PROFILE:
                    ps = (ps[0], ps[1] + (now() - t_w), ps[2])
                wb = view(ring.index(slot), ring.dtype, [4 * SP, KS // SP, RG], WSL).load(DB)
                warp_release(empty0 + 8 * slot, ok)
                i += 1
                if SP == 1:
                    acc = mma_v2(xa, wb, acc)
                else:  # SP independent chains from 0, summed into the group's sums in a fixed order
                    acc = acc + gl.sum(gl.reshape(mma_v2(xa, wb, z), [SP, 4, 16, RG]), axis=0)
            new = new + (acc,)
        accs = new
    if STACK_ACC and GB == 8:  # one store (GB stores to one buffer get a CTA barrier between each two)
        rows = view(accbuf, gl.float32, [accbuf.shape[0] * 4, 16, RG], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        rows.slice(0, GB * 4).store(gl.reshape(_stack8(accs), [GB * 4, 16, RG]))
    else:
        for g in gl.static_range(GB):
            accbuf.index(g).store(accs[g])
    return ok, i, pre, ps


@gluon.jit
def _stack8(t):
    """The 8 tensors of tuple t ([4, 16, RG] each, one layout) as one [8, 4, 16, RG] (index g: t[g]); join and
    permute only relabel registers, no data moves."""
    j0 = gl.join(gl.join(gl.join(t[0], t[1]), gl.join(t[2], t[3])), gl.join(gl.join(t[4], t[5]), gl.join(t[6], t[7])))
    return gl.reshape(gl.permute(j0, [5, 4, 3, 0, 1, 2]), [8, t[0].shape[0], t[0].shape[1], t[0].shape[2]])


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
             D: gl.constexpr, PROFILE: gl.constexpr, sub, QKN: gl.constexpr = False):
    """One GEMV task on the tensor cores (gemv="mma"): the units of stream_fma.gemv_fma in k-major blocks of GB chunk groups
    (GB / 2 units for gate_up; stream_pack.mma_chunk_order), each block's sums by _mma_block, then the same
    epilogues as gemv_fma per unit of the block (sums read back by _acc_of). ``gt``: the task's fields
    (stream_epilogue.gemv_task), loaded by the caller before its dependency wait. Every load of the epilogues
    (residual rows, positions, RoPE frequencies) is issued before the block whose sums they meet, so no L2
    round trip follows the last chunk but the stores. PROFILE: ``sub`` (int64 [4], the task's row of the
    runner's ``prof_sub``) = ns staging activation tiles, ns waiting on ring slots, ns in the epilogues (from the
    block's end to its outputs' stores), tiles staged + (ns of the staging spent waiting for the tiles' loads,
    before their first barrier) << 16; the rest of the task's time (prof: end - ready) is the
    fields, the rstd pass, the chunks' ldmatrix / MMA and the release."""
    dt: gl.constexpr = base_t.dtype.element_ty
    AL: gl.constexpr = _mma_out_layout(RG)
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
        pre = _copy_a(abuf, x, nw, K, 0, norm, B, CK)
    elif ASYNC:
        pre = _copy_a(rbuf, x, nw, K, 0, norm, B, CK)
    else:
        pre = _load_a(x, nw, K, 0, norm, B, CK)
    bidx = gl.arange(0, BP, layout=gl.SliceLayout(1, AL))
    r = gl.arange(0, RG, layout=gl.SliceLayout(0, AL))
    bm = bidx[:, None] < B
    b64 = bidx.to(gl.int64)[:, None]
    isq = kind == K_QKV
    isr = kind == K_RESID
    q, kc, vc, pos, inv_freq = qkv_buffers(a, base_t, base_f, base_i, bidx, B, isq)
    res = base_t + gl.load(a + 1) * 8
    out = base_t + gl.load(a + 2) * 8
    if norm != 0:
        rs = _rstd16(x, K, B, CK, EPS, D)
    else:
        rs = _rstd16(x, K, 0, CK, EPS, D)       # zeros, no loads
    CH: gl.constexpr = HD // RG
    P: gl.constexpr = RG // 2
    best = gl.full([BP], float("-inf"), gl.float32, gl.SliceLayout(1, AL))
    barg = gl.zeros([BP], gl.int32, gl.SliceLayout(1, AL))
    ps = (0, 0, 0)
    epi = 0
    if PROFILE:
        z = now() * 0
        ps = (z, z, z)
        epi = z
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
            for j in gl.static_range(GB):
                u = ub + j
                if u < ue:
                    offs = b64 * N + (u * RG + r)[None, :]
                    m = bm & ((u * RG + r) < N)[None, :]
                    acc = _acc_of(accbuf, j, BP, RG, AL)
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
    if ASYNC:  # the wrap-around copy: landed before the next task's copies can target rbuf
        async_copy.wait_group(0)
    if kind == K_LMHEAD:
        pmax = base_f + gl.load(a + 3) * 4
        pidx = base_i + gl.load(a + 4) * 4
        idx = gl.load(rec + F_IDX)
        gl.store(pmax + bidx * NT + idx, best, mask=bidx < B)
        gl.store(pidx + bidx * NT + idx, barg, mask=bidx < B)
    return ok, i
