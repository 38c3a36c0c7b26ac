"""The activation staging of the streaming megakernel's tensor-core GEMV (Gluon, sm_90; ``exec.stream_mma``): the
[16, CK] activation tile of a k-chunk, batch rows padded to 16, as [4 warp k-slices, 4-row quads, CK/4]: RMSNorm's
rstd per row (rstd16 over the rows, or rstd_partials from the producer's per-task sums of squares), the tile's loads into registers (load_a) or cp.async copies into shared memory (copy_a,
raw_a), and its RMSNorm'd store into the staged tile operand A is read from (store_a; HF's rounding points, bf16 by
packed conversions: norm_bf16). A row's values and their order never depend on the batch size (batch invariance).
docs/DESIGN.md, "Tensor cores in the streaming megakernel", "The activation prefetch by batch", "One shared store per
buffer".
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from onekernel.ops.gemv_rows import rnd

# the activation tile's live quads copied and stored as one (one_stage); STREAM_ONE_STAGE=0: one per quad
ONE_STAGE = gl.constexpr(os.environ.get("STREAM_ONE_STAGE", "1") == "1")


@gluon.jit
def stack(t):
    """The 2, 4 or 8 tensors of tuple t (one 3-D shape [S0, S1, S2] and layout) as one tensor [len(t), S0, S1, S2],
    index g holding t[g]: joined pairwise (``gl.join``: a new last dim, index 0 the first operand; the last join's dim
    is the high bit of g), then permuted and reshaped, which only relabel registers (no data moves). One shared-memory
    store of it replaces len(t) stores into one buffer, between which Triton's barrier pass puts a CTA barrier each."""
    S0: gl.constexpr = t[0].shape[0]
    S1: gl.constexpr = t[0].shape[1]
    S2: gl.constexpr = t[0].shape[2]
    if len(t) == 2:
        j = gl.permute(gl.join(t[0], t[1]), [3, 0, 1, 2])
    elif len(t) == 4:
        j = gl.permute(gl.join(gl.join(t[0], t[1]), gl.join(t[2], t[3])), [4, 3, 0, 1, 2])
    else:
        j = gl.permute(gl.join(gl.join(gl.join(t[0], t[1]), gl.join(t[2], t[3])),
                               gl.join(gl.join(t[4], t[5]), gl.join(t[6], t[7]))), [5, 4, 3, 0, 1, 2])
    return gl.reshape(j, [len(t), S0, S1, S2])


@gluon.constexpr_function
def stage_layout(CK):
    """[4 warps, 4 batch rows, CK/4] staging layout: 8 consecutive k per thread (16-byte accesses), warp w holds
    the k-slice its MMA reads."""
    KS = CK // 4
    TK = 32 if KS >= 256 else KS // 8
    return gl.BlockedLayout([1, 1, 8], [1, 32 // TK, TK], [4, 1, 1], [2, 1, 0])


@gluon.jit
def rstd16(x, K, B: gl.constexpr, CK: gl.constexpr, EPS: gl.constexpr, D: gl.constexpr):
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


@gluon.constexpr_function
def ss_cols(NSS):
    """The columns of rstd_partials' tile: NSS rounded up to a power of two, at least 8 (one thread's run)."""
    return max(8, 1 << max(0, (int(NSS) - 1).bit_length()))


@gluon.jit
def rstd_partials(ss, K, B: gl.constexpr, NSS: gl.constexpr, CK: gl.constexpr, EPS: gl.constexpr):
    """rstd16's result (4 quads of fp32 [4], rows >= B: 0) from the RMSNorm partials of x's producer: ss fp32
    [B, NSS], ss[b, j] = the sum of squares of row b of the outputs residual GEMV task j stored (rounded to the model
    dtype, as the reader loads them; stream_mma.gemv_mma), so rstd = rsqrt(sum_j ss[b, j] / K + EPS) (RMSNorm,
    Zhang and Sennrich 2019, eq. 4; HF LlamaRMSNorm's mean of squares in fp32). Per quad that holds a row < B one
    [4, ss_cols(NSS)] tile (``.cg``: another SM wrote it; columns >= NSS masked to 0), summed along its row in the
    layout's order (8 consecutive columns a thread, then across lanes; a tile narrower than 256 columns repeats
    columns over the lanes, which the reduction counts once), an order that depends on NSS, not on B: row b's rstd is
    the same for every batch (batch invariance). One L2 round trip of B * NSS * 4 bytes instead of rstd16's B * K * 2."""
    SL3: gl.constexpr = stage_layout(CK)
    RQ: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, SL3))
    TL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    r4 = gl.arange(0, 4, layout=gl.SliceLayout(1, TL))
    cols = gl.arange(0, ss_cols(NSS), layout=gl.SliceLayout(0, TL))[None, :]
    rs = ()
    for q in gl.static_range(4):
        rows = q * 4 + r4
        s = gl.zeros([4], gl.float32, gl.SliceLayout(1, TL))
        if q * 4 < B:
            v = gl.load(ss + rows[:, None] * NSS + cols, mask=(rows[:, None] < B) & (cols < NSS), other=0.0,
                        cache_modifier=".cg")
            s = gl.sum(v, axis=1)
        rs = rs + (gl.convert_layout(gl.where(rows < B, gl.rsqrt(s / K + EPS), 0.0), RQ),)
    return rs


@gluon.jit
def _rstd_step(x, K, k0, ss, r4, cols, B: gl.constexpr):
    """rstd16's quads' sums of squares plus k-chunk k0's."""
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
def tile_index(kb, CK: gl.constexpr):
    """(k index [4 warp slices, 1, CK/4], row-in-quad index [1, 4, 1]) of activation tile kb in the staging
    layout: warp slice w holds k = kb*CK + w*CK/4 + [0, CK/4)."""
    KS: gl.constexpr = CK // 4
    SL3: gl.constexpr = stage_layout(CK)
    kk = kb * CK + gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, SL3)))[:, None, None] * KS + \
        gl.arange(0, KS, layout=gl.SliceLayout(0, gl.SliceLayout(1, SL3)))[None, None, :]
    r4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL3)))[None, :, None]
    return kk, r4


@gluon.jit
def load_a(x, nw, K, kb, norm, B: gl.constexpr, CK: gl.constexpr):
    """The loads of activation tile kb (store_a stages it): x[4q:4q+4, kb*CK:(kb+1)*CK] per 4-row quad that
    holds a row < B (quads past B: compile-time skipped), as [4 warp slices, 4 rows, CK/4] in the model dtype
    (0 past B and K), and the norm weights of the tile (0 unless norm)."""
    kk, r4 = tile_index(kb, CK)
    g = gl.load(nw + kk, mask=(kk < K) & (norm != 0), other=0.0)
    vs = (g,)
    for q in gl.static_range(4):
        if q * 4 < B:
            vs = vs + (gl.load(x + (q * 4 + r4) * K + kk, mask=((q * 4 + r4) < B) & (kk < K), other=0.0,
                               cache_modifier=".cg"),)
    return vs


@gluon.jit
def norm_bf16(y, g):
    """rnd(rnd(y, bf16) * g) as bf16 for fp32 y and bf16 g (RMSNorm's two rounding points, HF's order):
    ``cvt.rn.bf16x2.f32`` rounds two y to bf16, ``mul.rn.bf16x2`` multiplies them by two g and rounds once. A
    product of two bf16 values is exact in fp32 (16 significant bits) above fp32's subnormal range, so the packed
    multiply gives the bits of rounding the fp32 product: 1.5 instructions per value in all."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $2, $1; mul.rn.bf16x2 $0, t, $3; }",
        "=r,f,f,r", [y, g], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def store_a(abuf, vs, rs, norm, B: gl.constexpr, CK: gl.constexpr):
    """abuf [4, 16, CK/4] = the (RMSNorm?)tile load_a loaded, as [warp slice, batch row, k], for the quads that
    hold a row < B (abuf holds zeros in the others from the start: operand A's rows >= B are 0). RMSNorm as
    _fill_x / _xrow (HF's rounding points: ``rnd(rnd(x * rstd) * w)``), so the MMA multiplies the values
    F.linear does. bf16: both roundings by the hardware's packed conversions (norm_bf16, the same bits); fp16
    keeps rnd. Where one_stage(B) (2 or 4 live quads), the quads go to abuf in one store (_quads)."""
    dt: gl.constexpr = abuf.dtype
    outs = ()
    for q in gl.static_range(4):
        if q * 4 < B:
            v = vs[1 + q]
            if norm != 0:
                y = v.to(gl.float32) * rs[q][None, :, None]
                if dt == gl.bfloat16:
                    v = norm_bf16(y, gl.broadcast(vs[0], y)[0])
                else:
                    v = rnd(rnd(y, dt) * vs[0].to(gl.float32), dt).to(dt)
            if one_stage(B):
                outs = outs + (v,)
            else:
                abuf.slice(q * 4, 4, dim=1).store(v)
    if one_stage(B):  # one store: a store per quad would get a CTA barrier before each (one buffer)
        N: gl.constexpr = outs[0].shape[2]
        abuf.slice(0, len(outs) * 4, dim=1).store(gl.reshape(gl.permute(stack(outs), [1, 0, 2, 3]),
                                                              [4, len(outs) * 4, N]))


@gluon.jit
def copy_a(rbuf, x, nw, K, kb, norm, B: gl.constexpr, CK: gl.constexpr):
    """ASYNC (mma_async_a): the loads of activation tile kb as cp.async copies into rbuf [4, RB, CK/4] (or, DIRECT,
    abuf [4, 16, CK/4]): the quads that hold a row < B, 0 past B and K; one commit group; returns the tile's norm
    weights (registers, as load_a's). ``.cg``: L2 only, as every read of an activation another SM wrote this step.
    Where one_stage(B), one copy of all live quads' rows."""
    kk, r4 = tile_index(kb, CK)
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
def raw_a(rbuf, g, B: gl.constexpr, CK: gl.constexpr):
    """The tile copy_a copied (after its wait and a CTA barrier), read back as load_a returns it: (g, quads)."""
    SL3: gl.constexpr = stage_layout(CK)
    vs = (g,)
    for q in gl.static_range(4):
        if q * 4 < B:
            vs = vs + (rbuf.slice(q * 4, 4, dim=1).load(SL3),)
    return vs
