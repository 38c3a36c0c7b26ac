"""The tensor-core (MMA) GEMV building blocks: the ``gemv="mma"`` path of every GEMV op (qkv.py, gemv.py,
lm_head.py, oproj_merge.py). ``ops/gemv_rows.py`` holds the CUDA-core (``"fma"``) path and the numerics both
share (``rnd``, ``rms_rstd``).

Shape: the batch is padded to ``MMA_COLS`` = 16 columns (activation rows b >= B are loaded as 0), and each
BLOCK_K chunk is one matrix product on the tensor cores, weights as the wide operand:

    acc[R, 16] (fp32) = tl.dot(W[rows, k0:k0+BK] (model dtype) [R, BK], h[0:16, k0:k0+BK]^T [BK, 16], acc)

chunks in k order, then ``tl.trans`` -> [16, R] for the epilogues (the layout the CUDA-core path returns, with
BLOCK_B = 16). ``tl.dot`` needs R, BK >= 16 (ops/tiling.py keeps BLOCK_N >= 16 on this path). On an H100/H200
Triton emits ``mma.sync`` (m16n8k16) for R < 64 and ``wgmma`` for R a multiple of 64 (scripts/mma_compile_check.py
checks the PTX); fp32 models use ``input_precision="ieee"`` (no TF32 rounding: the same products as
``F.linear`` in fp32, on CUDA cores).

Numerics (HF transformers, as ops/gemv_rows.py): RMSNorm is applied to the activation tile elementwise in fp32
with the row's rstd and rounded to the model dtype where LlamaRMSNorm rounds (``(w * (x * rstd).to(dt)).to(dt)``),
so the MMA's operands are exactly the dt values ``F.linear`` multiplies; products and sums are fp32 (bf16 x bf16
products are exact in fp32; the tensor cores' sum order inside one instruction is the hardware's), then the
result is rounded to dt where HF rounds. Against ``F.linear`` only the fp32 summation order differs.

Batch invariance: output element (n, b) depends only on weight row n and activation column b; every B runs the
same instructions on the same [R, BK] x [BK, 16] shapes (B only changes which columns hold zeros), in the same k
order, so column b's result is bitwise the same for every B = 1..16 (that each MMA column is computed the same
way wherever it sits is the hardware's: checked on the H200 by scripts/invariance_check.py). Batch 1 must take
this path too when the model uses it: a CUDA-core batch-1 run would sum in another order.
"""
from __future__ import annotations

import triton
import triton.language as tl

from onekernel.ops.gemv_rows import last_chunk, load_w_chunk, rnd
from onekernel.ops.tiling import MMA_COLS

COLS = tl.constexpr(MMA_COLS)  # the padded batch: the narrow MMA operand's width, and BLOCK_B on this path
# The chunk loop's depth, per op kind and shape (``STAGES`` of gemv_mma): 0 = weight and activation chunks
# double-buffered in registers (two chunks in flight); N >= 2 = Triton's software pipeliner (``tl.range(
# num_stages=N)``: cp.async copies of N - 1 chunks ahead into shared memory). Same chunks, same k order, same
# MMAs either way. Measured per op on the H200 (run 8 call 2, scripts/mma_ops.py, % of the copy bandwidth at
# depth 0 / 5): gemv_residual (16-row tiles) Llama-1B 2048x8192 40 / 60% (batch 8: 55 / 83%), Llama-8B
# 4096x14336 66 / 81% (87 / 116%, L2); gate_up with 64-row tiles (Llama-8B) 80 / 90%; but qkv_rope 29 / 25%,
# gate_up with 32-row tiles (Llama-1B, batch 8) 70 / 48%, lm_head 94 / 79%. So the residual GEMVs and the
# 64-row gate_up pipeline 5 deep, the rest keep the register double buffer.
DEEP = tl.constexpr(5)


def mma_stages(kind: str, block_n: int, mma: bool, separate: bool = False) -> int:
    """The default chunk-loop depth (``STAGES`` op param) of a GEMV op of ``kind`` ("qkv_rope", "gemv_residual",
    "gate_up") with ``block_n`` weight rows per tile; 0 on the CUDA-core path, which has no such loop. An op's
    ``blocks={"STAGES": n}`` overrides it (tuning). The megakernel's tiles: the choices of the comment above. The
    separate kernels' (``separate``, Tiling "cover": one wave of tiles, ``Tiling.gemv_min_tiles``) the same, but gate_up
    in registers at every tile size (64-row tiles, chunks of 8192 elements per matrix).
    Measured (run 26 call 260, scripts/gemv_sweep.py, us per op, Llama-3.2-1B / Llama-3.1-8B at those tiles):
    - qkv_rope in registers 12.0 / 24.5, 3 deep 11.2 / 23.8; the 3-deep pipeline takes 121 KB of shared memory at 8B's
      64-row tiles, more than the 99 KB of an sm_86 / sm_89 GPU, where the tensor-core path runs too;
    - gate_up in registers 22.3 / 61.1, 3 deep 29.6 / 65.0, 5 deep 29.9 / 95.4;
    - o_proj 0 / 3 / 5 deep 7.0 / 6.8 / 6.5 (1B) and 14.6 / 13.1 / 12.4 (8B)."""
    if not mma or kind == "qkv_rope":
        return 0
    if kind == "gate_up":
        return int(DEEP) if block_n >= 64 and not separate else 0
    return int(DEEP)


@triton.jit
def load_xt(x, B: tl.constexpr, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, XS: tl.constexpr = 0):
    """Activation tile ``x[0:16, k0:k0+BLOCK_K]`` [16, BLOCK_K] in the model dtype, rows XS elements apart (0: K);
    0 for rows >= B and columns >= K (``.cg``: written by other CTAs)."""
    ob = tl.arange(0, COLS)
    ok = k0 + tl.arange(0, BLOCK_K)
    xs: tl.constexpr = K if XS == 0 else XS
    return tl.load(x + ob[:, None] * xs + ok[None, :], mask=(ob[:, None] < B) & (ok[None, :] < K), other=0.0,
                   cache_modifier=".cg")


@triton.jit
def norm_xt(v, nw, rstd, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    """NORM: HF RMSNorm of an activation tile v [16, BK] (model dtype) with per-row rstd [16] (``rms_rstd``)
    and norm weights ``nw[k0:k0+BK]``: ``rnd(rnd(v * rstd, dt) * w, dt)`` elementwise (``norm_x``'s values);
    else v. Returns the model dtype."""
    if NORM:
        ok = k0 + tl.arange(0, BLOCK_K)
        g = tl.load(nw + ok, mask=ok < K, other=0.0).to(tl.float32)
        h = rnd(v.to(tl.float32) * rstd[:, None], v.dtype)
        v = rnd(h * g[None, :], v.dtype).to(v.dtype)
    return v


@triton.jit
def mma_acc(acc, wv, xt):
    """acc [R, 16] += wv [R, BK] @ xt[16, BK]^T on the tensor cores (fp32 accumulate; fp32 operands without
    TF32)."""
    if wv.dtype == tl.float32:
        acc = tl.dot(wv, tl.trans(xt.to(wv.dtype)), acc, input_precision="ieee")
    else:
        acc = tl.dot(wv, tl.trans(xt.to(wv.dtype)), acc)
    return acc


@triton.jit
def gemv_mma(w0, x, nw, rstd, w, rows, rmask, B: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
             BLOCK_K: tl.constexpr, NORM: tl.constexpr, STAGES: tl.constexpr = 0, XS: tl.constexpr = 0):
    """fp32 [16, R] = (norm?)x[B, K] @ W[rows, :]^T on the tensor cores (rows >= B are 0; x's rows XS elements
    apart, 0: K), given the prefetched
    first weight chunk w0 = W[rows, :BLOCK_K]; rstd [16] from ``rms_rstd`` (unused unless NORM). Weight and
    activation chunks double-buffered: chunk k + 1's loads are issued before chunk k's MMA (STAGES 0), or
    pipelined STAGES deep through shared memory (the ``DEEP`` comment above)."""
    acc = tl.zeros([R, COLS], tl.float32)
    if STAGES > 0:
        acc = mma_acc(acc, w0, norm_xt(load_xt(x, B, 0, K, BLOCK_K, XS), nw, rstd, 0, K, BLOCK_K, NORM))
        for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
            wv = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
            acc = mma_acc(acc, wv, norm_xt(load_xt(x, B, k0, K, BLOCK_K, XS), nw, rstd, k0, K, BLOCK_K, NORM))
    else:
        wv = w0
        xv = load_xt(x, B, 0, K, BLOCK_K, XS)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            nxt = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
            nx = load_xt(x, B, k0, K, BLOCK_K, XS)
            acc = mma_acc(acc, wv, norm_xt(xv, nw, rstd, k0 - BLOCK_K, K, BLOCK_K, NORM))
            wv, xv = nxt, nx
        acc = mma_acc(acc, wv, norm_xt(xv, nw, rstd, last_chunk(K, BLOCK_K), K, BLOCK_K, NORM))
    return tl.trans(acc)
