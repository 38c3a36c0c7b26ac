"""The Triton building blocks every row-tiled GEMV op shares (gemv.py, qkv.py, lm_head.py, oproj_merge.py; the
streaming megakernel calls ``rnd`` and ``silu`` from Gluon): rounding to the model dtype, SiLU, weight and
activation chunk loads, RMSNorm, per-row dot products and their batch-invariant accumulation.

Numerics mirror HF transformers (modeling_llama.py) in the model dtype ``dt`` (bf16/fp16/fp32):
* ``F.linear`` = fp32 accumulation of dt products, rounded to dt;
* LlamaRMSNorm(x) = ``w * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(dt)`` -> the product rounded to dt;
* residual ``x + y`` = fp32 sum of two dt values rounded to dt;
* LlamaMLP: ``silu(x Wg^T) * (x Wu^T)``, each step rounded to dt (silu computed in fp32).
Kernels never do dt arithmetic: load, ``.to(tl.float32)``, compute, round with ``rnd(x, dt)`` where HF rounds.

Batch invariance: row b's outputs are bitwise the same for every batch size B (1..16) given row b's inputs.
Tile shapes (BLOCK_N, BLOCK_K) never depend on B, and every per-row reduction has operands whose shape and
layout do not depend on B: the dot product of row b is ``tl.sum(x_b[None, :] * W_chunk, axis=1)`` over the
[R, BLOCK_K] weight chunk (``row_dot``), selected into row b of a [BLOCK_B, R] chunk tile and added to the fp32
accumulator chunk by chunk in k order (``mac_rows2d``: selects and elementwise adds only, so the
accumulator's layout cannot change a value); RMSNorm's sum of squares is a 1-D [NK] vector per row, NK from K
alone (``rms_rstd``), and a row's rstd is read back from the [BLOCK_B] vector by an exact select
(``row_of``); qkv's q/k norm keeps per-row [2P] accumulators (``gemv_rows_t``) for its per-row sums.

Compile time (issue 12): the loops over the batch rows and over K are runtime loops, so the compiled code does
not grow with B or K (it used to unroll B x K / BLOCK_K loads: minutes to compile at batch 8); only qkv's q/k
norm (Qwen3) still unrolls the rows. Latency is kept where it was: the row loops load row b + 1's chunk before
reducing row b's, the RMSNorm pass loads up to 4 rows at once, and at B = 1 the loops fold away (the same
loads as before). This is the CUDA-core path (``gemv="fma"``): B FMAs per weight element, which made batch 8
cost ~3x batch 1 on the H200; the tensor-core path (``gemv="mma"``, the same ops' ``MMA`` switch) is in
ops/gemv_mma.py.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# GPU: libdevice exp/cos/sin (as accurate as PyTorch's CUDA math); the interpreter has no libdevice.
PRECISE_MATH = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def rnd(x, dt: tl.constexpr):
    """fp32 x rounded to the nearest (ties to even) value of dtype dt, returned as fp32.

    Done with integer bit operations because the compiler folds ``x.to(bf16).to(fp32)`` back to ``x``
    (seen on an H200 with Triton 3.6: RoPE outputs lost their intermediate rounding). fp16: normal range
    by bits, the subnormal range by adding and subtracting 0.75 (fp32 ulp 2^-24 = the fp16 subnormal step),
    |x| > 65504 -> inf. fp32: x unchanged."""
    if dt == tl.bfloat16:
        u = x.to(tl.int32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & -65536
        return u.to(tl.float32, bitcast=True)
    elif dt == tl.float16:
        u = x.to(tl.int32, bitcast=True)
        u = (u + 0xFFF + ((u >> 13) & 1)) & -8192
        y = u.to(tl.float32, bitcast=True)
        y = tl.where(tl.abs(x) < 6.103515625e-05, (x + 0.75) - 0.75, y)
        return tl.where(tl.abs(y) > 65504.0, x * float("inf"), y)
    else:
        return x


@triton.jit
def silu(x):
    """x / (1 + exp(-x)) in fp32 with IEEE division (PyTorch's CUDA silu formula)."""
    if PRECISE_MATH:
        e = libdevice.exp(-x)
    else:
        e = tl.exp(-x)
    return tl.math.div_rn(x, 1.0 + e)

@triton.jit
def load_w_chunk(w, rows, rmask, k0, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Weight chunk ``W[rows, k0:k0+BLOCK_K]`` (model dtype, 0 outside); rows int64 [R], rmask bool [R]."""
    ok = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w + rows[:, None] * K + ok[None, :], mask=rmask[:, None] & (ok[None, :] < K), other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def last_chunk(K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Start column of the last BLOCK_K chunk of K columns."""
    return ((K - 1) // BLOCK_K) * BLOCK_K


# The RMSNorm pass loads each row in chunks of NK = min(next_pow2(K), NORM_CHUNK) columns (the whole row of every
# benchmark model: one memory round trip) and RR = NORM_ELEMS // NK rows at a time (at most 4): a fixed number
# of registers and a fixed amount of code whatever B and K are.
NORM_CHUNK = tl.constexpr(4096)
NORM_ELEMS = tl.constexpr(8192)


@triton.jit
def _row_group(x, b0, B: tl.constexpr, k0, K: tl.constexpr, NK: tl.constexpr, RR: tl.constexpr):
    """Rows b0 .. b0 + RR - 1 of x [B, K] at columns k0 .. k0 + NK - 1: a tuple of RR [NK] vectors in the model
    dtype (0 for rows >= B and columns >= K; ``.cg``: written by other CTAs), every load of the group issued
    before any is used."""
    ok = tl.arange(0, NK)
    vs = ()
    for r in tl.static_range(RR):
        m = tl.where(b0 + r < B, k0 + ok < K, False)
        vs = vs + (tl.load(x + (b0 + r) * K + k0 + ok, mask=m, other=0.0, cache_modifier=".cg"),)
    return vs


@triton.jit
def rms_rstd(x, B: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr, EPS: tl.constexpr):
    """fp32 [BLOCK_B]: ``rsqrt(mean_k(x[b, k]^2) + eps)`` for each row b < B of activation x [B, K] (HF
    LlamaRMSNorm); rows >= B are 0. Read row b with ``row_of``.

    Batch-invariant: row b is loaded as its own [NK] vectors (NK from K alone), squares accumulate
    elementwise over the chunks in k order and one 1-D ``tl.sum`` finishes the row, so the layout and
    summation order never depend on B. Runtime loops over groups of RR rows and over the chunks (the compiled
    code does not grow with B or K); the RR loads of a group are issued together (rows >= B masked off, and
    folded away at B = 1), so a batch of B rows costs ceil(B / RR) memory round trips."""
    NK: tl.constexpr = min(triton.next_power_of_2(K), NORM_CHUNK)
    RR: tl.constexpr = max(1, min(4, NORM_ELEMS // NK))
    ob = tl.arange(0, BLOCK_B)
    rstd = tl.zeros([BLOCK_B], tl.float32)
    for b0 in range(0, B, RR):
        ss = ()
        for r in tl.static_range(RR):
            ss = ss + (tl.zeros([NK], tl.float32),)
        for k0 in range(0, K, NK):
            vs = _row_group(x, b0, B, k0, K, NK, RR)
            nss = ()
            for r in tl.static_range(RR):
                v = vs[r].to(tl.float32)
                nss = nss + (ss[r] + v * v,)
            ss = nss
        for r in tl.static_range(RR):
            rstd = tl.where(ob == b0 + r, tl.math.rsqrt(tl.sum(ss[r], axis=0) / K + EPS), rstd)
    return rstd


@triton.jit
def rms_norm_rows(x, nw, out, B: tl.constexpr, K: tl.constexpr, EPS: tl.constexpr, OS: tl.constexpr):
    """out[b, :] = LlamaRMSNorm(x[b, :]) for the rows b < B of x [B, K] (model dtype dt; norm weights nw [K]):
    ``(rnd(x * rstd, dt) * w).to(dt)`` elementwise (``norm_xt``'s values) with ``rms_rstd``'s rstd (the same loads,
    squares and 1-D sums: the same bits for every B). out: B rows of K in dt, OS elements apart; rows >= B are not
    written. Groups of RR rows (at most 4 and at most next_pow2(B)); where a row fits one NK chunk (every benchmark
    model) the next group's loads are issued before this group's sums, and each row is normalised from the values
    loaded for its sum; wider rows take ``rms_rstd`` and are loaded a second time. The caller orders these stores
    before its loads of ``out`` (a CTA barrier)."""
    NK: tl.constexpr = min(triton.next_power_of_2(K), NORM_CHUNK)
    RR: tl.constexpr = max(1, min(4, NORM_ELEMS // NK, triton.next_power_of_2(B)))
    ok = tl.arange(0, NK)
    if K <= NK:
        g = tl.load(nw + ok, mask=ok < K, other=0.0).to(tl.float32)
        vs = _row_group(x, 0, B, 0, K, NK, RR)
        for b0 in range(0, B, RR):
            nvs = _row_group(x, b0 + RR, B, 0, K, NK, RR)  # the next group in flight (masked off past B)
            for r in tl.static_range(RR):
                v = vs[r].to(tl.float32)
                rs = tl.math.rsqrt(tl.sum(tl.zeros([NK], tl.float32) + v * v, axis=0) / K + EPS)
                tl.store(out + (b0 + r) * OS + ok, (rnd(v * rs, vs[r].dtype) * g).to(vs[r].dtype),
                         mask=(b0 + r < B) & (ok < K))
            vs = nvs
    else:  # wider rows: every row's rstd by rms_rstd, then each group loaded again and normalised
        BB: tl.constexpr = triton.next_power_of_2(B)
        ob = tl.arange(0, BB)
        rstd = rms_rstd(x, B, K, BB, EPS)
        for b0 in range(0, B, RR):
            for k0 in range(0, K, NK):
                vs = _row_group(x, b0, B, k0, K, NK, RR)
                g = tl.load(nw + k0 + ok, mask=k0 + ok < K, other=0.0).to(tl.float32)
                for r in tl.static_range(RR):
                    h = rnd(vs[r].to(tl.float32) * row_of(rstd, ob, b0 + r), vs[r].dtype)
                    tl.store(out + (b0 + r) * OS + k0 + ok, (h * g).to(vs[r].dtype), mask=(b0 + r < B) & (k0 + ok < K))


@triton.jit
def row_of(v, ob, b):
    """Element b of a per-row vector v [BLOCK_B] (ob = arange(0, BLOCK_B)) as a scalar, exactly: a select
    and a sum of zeros."""
    return tl.sum(tl.where(ob == b, v, 0), axis=0)


@triton.jit
def row_rstd(rstd, ob, b, NORM: tl.constexpr):
    """Row b's rstd (``rms_rstd``) when NORM, else a placeholder 1.0."""
    if NORM:
        r = row_of(rstd, ob, b)
    else:
        r = 1.0
    return r


@triton.jit
def load_nw_chunk(nw, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    """RMSNorm weight chunk ``nw[k0:k0+BLOCK_K]`` as fp32 (0 outside); a placeholder 0.0 when not NORM."""
    if NORM:
        ok = k0 + tl.arange(0, BLOCK_K)
        g = tl.load(nw + ok, mask=ok < K, other=0.0).to(tl.float32)
    else:
        g = 0.0
    return g


@triton.jit
def load_x_raw(x, b, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, ok_b):
    """Activation chunk ``x[b, k0:k0+BLOCK_K]`` [BLOCK_K] in the model dtype (0 outside, and everywhere unless
    the scalar ``ok_b``: a prefetch past the last row reads nothing)."""
    ok = k0 + tl.arange(0, BLOCK_K)
    return tl.load(x + b * K + ok, mask=tl.where(ok_b, ok < K, False), other=0.0, cache_modifier=".cg")


@triton.jit
def norm_x(v, g, rstd_b, NORM: tl.constexpr):
    """NORM: HF RMSNorm applied to an activation chunk v (model dtype): ``(w * (x * rstd).to(dt)).to(dt)``, norm
    weight chunk g (fp32), rstd_b scalar; else v unchanged."""
    if NORM:
        h = rnd(v.to(tl.float32) * rstd_b, v.dtype)
        v = rnd(h * g, v.dtype).to(v.dtype)
    return v


@triton.jit
def load_x_row(x, g, rstd_b, b, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    """Activation chunk ``x[b, k0:k0+BLOCK_K]`` [BLOCK_K] in the model dtype (0 outside), normed if NORM
    (``norm_x``)."""
    return norm_x(load_x_raw(x, b, k0, K, BLOCK_K, True), g, rstd_b, NORM)


@triton.jit
def row_dot(xb, wv):
    """fp32 [R]: ``wv[R, BK] @ xb[BK]``, one 2-D reduce over the [R, BK] product tile. Its shape and layout
    (that of the weight chunk) are the same for every batch row and every B: the batch-invariant core."""
    return tl.sum(xb.to(tl.float32)[None, :] * wv.to(tl.float32), axis=1)


@triton.jit
def zero_rows(B: tl.constexpr, R: tl.constexpr):
    """Tuple of B fp32 [R] zero accumulators (one per batch row)."""
    acc = ()
    for b in tl.static_range(B):
        acc = acc + (tl.zeros([R], tl.float32),)
    return acc


@triton.jit
def stack_rows(rows_t, B: tl.constexpr, BLOCK_B: tl.constexpr, R: tl.constexpr):
    """[BLOCK_B, R] from a tuple of B [R] vectors (rows >= B are 0); selects only, no arithmetic."""
    ob = tl.arange(0, BLOCK_B)
    out = tl.zeros([BLOCK_B, R], tl.float32)
    for b in tl.static_range(B):
        out = tl.where(ob[:, None] == b, rows_t[b][None, :], out)
    return out


@triton.jit
def mac_rows(acc, x, nw, rstd, wv, k0, B: tl.constexpr, BLOCK_B: tl.constexpr, K: tl.constexpr,
             BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    """acc[b] (fp32 [R]) += (norm?)x[b, k0:k0+BK] . wv[R, BK] for every batch row b (tuple in, tuple out)."""
    g = load_nw_chunk(nw, k0, K, BLOCK_K, NORM)
    ob = tl.arange(0, BLOCK_B)
    new = ()
    for b in tl.static_range(B):
        xb = load_x_row(x, g, row_rstd(rstd, ob, b, NORM), b, k0, K, BLOCK_K, NORM)
        new = new + (acc[b] + row_dot(xb, wv),)
    return new


@triton.jit
def gemv_rows_t(w0, x, nw, rstd, w, rows, rmask, B: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
                R: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    """Tuple of B fp32 [R]: row b = (norm?)x[b, :] @ W[rows, :]^T, given the prefetched first chunk
    w0 = W[rows, :BLOCK_K]. Per row: chunk sums ``row_dot`` added in k order to an fp32 accumulator, the
    same operations for every b and every B (rstd: [BLOCK_B] from ``rms_rstd``, unused unless NORM). Unrolled
    over the B rows (a tuple): only qkv_rope's per-head q/k norm needs per-row vectors; ``gemv_rows`` loops."""
    acc = zero_rows(B, R)
    wv = w0
    for k0 in range(BLOCK_K, K, BLOCK_K):  # double-buffered: chunk k0 is in flight while k0 - BK is reduced
        nxt = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
        acc = mac_rows(acc, x, nw, rstd, wv, k0 - BLOCK_K, B, BLOCK_B, K, BLOCK_K, NORM)
        wv = nxt
    return mac_rows(acc, x, nw, rstd, wv, last_chunk(K, BLOCK_K), B, BLOCK_B, K, BLOCK_K, NORM)


@triton.jit
def mac_rows2d(acc, x, nw, rstd, wv, k0, B: tl.constexpr, BLOCK_B: tl.constexpr, K: tl.constexpr,
               BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    """acc [BLOCK_B, R] += (norm?)x[b, k0:k0+BK] . wv[R, BK] row by row: each row's chunk sum (``row_dot``)
    is selected into a [BLOCK_B, R] chunk tile, added once; row b gets exactly ``acc_b + row_dot_b`` for any B.
    A runtime loop over the rows (the compiled code does not grow with B) that loads row b + 1's chunk before
    reducing row b's. (A [BLOCK_B, R] accumulator uses far
    fewer registers at B = 8..16 than a tuple of per-row ones: those sit in the weight chunk's slice layout.)"""
    g = load_nw_chunk(nw, k0, K, BLOCK_K, NORM)
    ob = tl.arange(0, BLOCK_B)
    cs = tl.zeros_like(acc)
    xn = load_x_raw(x, 0, k0, K, BLOCK_K, True)
    for b in range(B):
        xb = norm_x(xn, g, row_rstd(rstd, ob, b, NORM), NORM)
        xn = load_x_raw(x, b + 1, k0, K, BLOCK_K, b + 1 < B)  # in flight during row b's reduction
        cs = tl.where(ob[:, None] == b, row_dot(xb, wv)[None, :], cs)
    return acc + cs


@triton.jit
def gemv_rows(w0, x, nw, rstd, w, rows, rmask, B: tl.constexpr, K: tl.constexpr, BLOCK_B: tl.constexpr,
              R: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    """fp32 [BLOCK_B, R] = (norm?)x[B, K] @ W[rows, :]^T (rows >= B are 0), given the prefetched first chunk
    w0 = W[rows, :BLOCK_K]; the same per-row operations as ``gemv_rows_t``, bitwise."""
    acc = tl.zeros([BLOCK_B, R], tl.float32)
    wv = w0
    for k0 in range(BLOCK_K, K, BLOCK_K):  # double-buffered, as in gemv_rows_t
        nxt = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
        acc = mac_rows2d(acc, x, nw, rstd, wv, k0 - BLOCK_K, B, BLOCK_B, K, BLOCK_K, NORM)
        wv = nxt
    return mac_rows2d(acc, x, nw, rstd, wv, last_chunk(K, BLOCK_K), B, BLOCK_B, K, BLOCK_K, NORM)


@triton.jit
def tile_rows(tile, N: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr = 0):
    """(rows int64 [BLOCK_N], mask) of a row tile: rows tile*BLOCK_N + [0, BLOCK_N), or, with ROWS (0 < ROWS <=
    BLOCK_N), tile*ROWS + [0, BLOCK_N) of which the first ROWS are the tile's (the others masked: their loads never
    issue); rows >= N masked."""
    if ROWS == 0:
        rows = tile.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        return rows, rows < N
    r = tl.arange(0, BLOCK_N)
    rows = tile.to(tl.int64) * ROWS + r
    return rows, (r < ROWS) & (rows < N)


def rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm over the last dim (fp32 normalise, cast to x.dtype, multiply by w)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)
