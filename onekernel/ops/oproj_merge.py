"""``oproj_merge``: the flash-decoding merge fused into the O-projection GEMV + residual (one stage less per layer).

Computes, for layer i (model dtype ``dt`` = fp32/bf16/fp16; merge and accumulation in fp32):

    attn[b, h*HD + d] = rnd_dt( sum_s exp(lse[b, h, s] - LSE[b, h]) * O[b, h, s, d] ),
                        LSE[b, h] = log sum_s exp(lse[b, h, s])   (the max over s subtracted first)
    out[b, n]         = rnd_dt( res[b, n] + rnd_dt( sum_k attn[b, k] * w[n, k] ) )

Inputs: ``o_part`` fp32 [B, Hq, NSPLIT, HD] and ``lse_part`` fp32 [B, Hq, NSPLIT] (the split-KV partials of
``attn_partial``, ops/attention.py: normalized partial outputs and natural-log sum-exp per split; an empty
split has lse = -inf), ``w`` dt [N, K] with K = Hq*HD (wo), ``res`` dt [B, N] (residual stream x.{i}).
Output: ``out`` dt [B, N] (h.{i}). Equals ``attn_merge`` followed by ``gemv_residual`` (same rounding points:
the merged value is rounded to dt with ``rnd`` exactly where ``attn_merge`` stores it in dt).
Math source: Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov, "Flash-Decoding for long-context
inference" (2023): the log-sum-exp combination of split-KV partial softmax outputs.

Tile = BLOCK_N output rows for all B batch rows, tiled like ``gemv_residual`` (ops/tiling.py ``gemv_blocks``).
The x operand is never read from memory: for each BLOCK_K chunk (k -> head h = k // HD, d = k % HD) every tile
computes the merged chunk of each batch row from the partials, CH splits at a time ([CH, BLOCK_K] lse and O
tiles loaded together; a running max rescales the sums when a later chunk raises it, so with all live splits
in one chunk, the usual case, it is ``attn_merge``'s arithmetic). Empty splits (lse = -inf) weigh 0 and their
O is never read; the live splits of a row are a prefix (split s is live iff s*SPLIT <= seq_lens[b]), counted
once per row from head 0's lse.
Every tile re-reads all partials of its rows (from L2): cheap while they are small, which is why
models/decode_graph.py uses this op only below a partials-size threshold.
Batch invariance: every per-row value is computed from [CH, BLOCK_K] / [BLOCK_K] tiles of that row alone (CH
from NSPLIT and BLOCK_K, never from B), and the GEMV is
``row_dot`` selected into a [BLOCK_B, BLOCK_N] accumulator (``mac_rows2d``'s pattern, ops/gemv_rows.py), or
with ``MMA`` the rows' merged chunks selected into a [16, BLOCK_K] tile for one tensor-core product per chunk
(ops/gemv_mma.py); tile shapes never depend on B, so row b's output is bitwise the same for every B.
The prologue loads only the tile's first weight chunk (weights are ready before the step); partials and the
residual are activations, read in the body with ``cache_modifier=".cg"``.
"""
from __future__ import annotations

import torch.nn.functional as F
import triton
import triton.language as tl

from onekernel.graph.ir import Buffer, Graph, Op
from onekernel.ops.attention import merge_partials
from onekernel.ops.base import OpKind
from onekernel.ops.gemv_mma import COLS, mma_acc
from onekernel.ops.gemv_rows import last_chunk, load_w_chunk, rnd, row_dot, row_of, tile_rows
from onekernel.ops.tiling import Tiling, gemv_blocks, region, row_tiled_tasks

# Elements of one [CH, BLOCK_K] partials tile (CH splits x BLOCK_K columns; CH = min(next_pow2(NSPLIT),
# MERGE_TILE_ELEMS // BLOCK_K), never B-dependent): 1024 fp32 = 8 registers per thread at 4 warps per tile.
# sm_90 registers / spills of the SmolLM2-135M kernel (scripts/compile_check.py), batch 1 and 8:
# 1024 -> 72 / 96, no spills; 2048 -> 96 / 128 + 16 B spilled; 4096 -> 154 at batch 1. Larger CH means fewer
# memory round trips per chunk when many splits are live (CH = 2 at BLOCK_K = 512).
MERGE_TILE_ELEMS = 1024


@triton.jit
def live_splits(lse_part, b, HQ: tl.constexpr, NSPLIT: tl.constexpr, NSP2: tl.constexpr):
    """int32 scalar: the number of live splits (lse > -inf) of batch row b, counted on head 0 (every head of
    a row has the same live splits, and they are a prefix 0..n-1)."""
    sp = tl.arange(0, NSP2)
    l0 = tl.load(lse_part + b * (HQ * NSPLIT) + sp, mask=sp < NSPLIT, other=float("-inf"), cache_modifier=".cg")
    return tl.sum((l0 > float("-inf")).to(tl.int32), 0)


@triton.jit
def merge_chunk(o_part, lse_part, b, n_live, k0, K: tl.constexpr, HQ: tl.constexpr, HD: tl.constexpr,
                NSPLIT: tl.constexpr, CH: tl.constexpr, BLOCK_K: tl.constexpr, dt: tl.constexpr):
    """fp32 [BLOCK_K]: the merged attention output ``attn[b, k0:k0+BLOCK_K]`` rounded to dt (0 past K).

    Per element (head h = k // HD, d = k % HD), over the row's ``n_live`` live splits in blocks of CH:
    m = max_s lse_s, w_s = exp(lse_s - m), value = sum_s w_s O_s / sum_s w_s. A chunk loads its [CH, BLOCK_K]
    lse and O tiles together (one memory round trip per chunk); a later chunk with a larger max rescales the
    running sums by exp(m_old - m_new) (FlashAttention's online softmax), so with n_live <= CH this is exactly
    ``attn_merge``'s arithmetic. Splits >= n_live (empty) are masked: their O is never read, and a fully
    masked block changes nothing (weights exp(-inf) = 0, rescale exp(0) = 1). The loop over the blocks is
    unrolled (static), so the loads of every block are issued together: one memory round trip per chunk
    instead of one per block."""
    k = k0 + tl.arange(0, BLOCK_K)
    km = k < K
    base = (b * HQ + k // HD) * NSPLIT  # [BLOCK_K] index of (b, h, s=0) in lse_part
    d = k % HD
    m = tl.full([BLOCK_K], float("-inf"), tl.float32)
    tot = tl.zeros([BLOCK_K], tl.float32)
    acc = tl.zeros([BLOCK_K], tl.float32)
    for c in tl.static_range(0, NSPLIT, CH):  # unrolled: all live blocks' loads in flight at once
        sp = c + tl.arange(0, CH)
        live = (sp < n_live)[:, None] & km[None, :]
        slot = base[None, :] + sp[:, None]  # [CH, BLOCK_K]
        ls = tl.load(lse_part + slot, mask=live, other=float("-inf"), cache_modifier=".cg")
        ov = tl.load(o_part + slot * HD + d[None, :], mask=live, other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(ls, 0))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # only columns past K: their weights stay 0
        scale = tl.exp(m - m_new)
        ws = tl.exp(ls - m_new[None, :])
        tot = tot * scale + tl.sum(ws, 0)
        acc = acc * scale + tl.sum(ov * ws, 0)
        m = m_new
    return rnd(acc / tl.where(tot > 0.0, tot, 1.0), dt)


@triton.jit
def oproj_merge_prologue(tile, o_part, lse_part, w, res, out, B: tl.constexpr, N: tl.constexpr,
                         K: tl.constexpr, HQ: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr,
                         NSP2: tl.constexpr, CH: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, MMA: tl.constexpr):
    rows, rmask = tile_rows(tile, N, BLOCK_N)
    return load_w_chunk(w, rows, rmask, 0, K, BLOCK_K)


@triton.jit
def oproj_merge_mac(acc, o_part, lse_part, n_live, wv, k0, B: tl.constexpr, BLOCK_B: tl.constexpr,
                    K: tl.constexpr, HQ: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr,
                    CH: tl.constexpr, BLOCK_K: tl.constexpr, dt: tl.constexpr):
    """acc [BLOCK_B, R] += merged attn[b, k0:k0+BK] . wv[R, BK] row by row (``mac_rows2d``'s select-then-add:
    row b gets exactly ``acc_b + row_dot_b`` for any B, in a runtime loop over the rows); n_live: int32
    [BLOCK_B] per-row live split counts."""
    ob = tl.arange(0, BLOCK_B)
    cs = tl.zeros_like(acc)
    for b in range(B):
        xb = merge_chunk(o_part, lse_part, b, row_of(n_live, ob, b), k0, K, HQ, HD, NSPLIT, CH, BLOCK_K, dt)
        cs = tl.where(ob[:, None] == b, row_dot(xb, wv)[None, :], cs)
    return acc + cs


@triton.jit
def merged_tile(o_part, lse_part, n_live, k0, B: tl.constexpr, K: tl.constexpr, HQ: tl.constexpr,
                HD: tl.constexpr, NSPLIT: tl.constexpr, CH: tl.constexpr, BLOCK_K: tl.constexpr, dt: tl.constexpr):
    """The MMA path's activation tile: fp32 [16, BLOCK_K], row b < B = ``merge_chunk`` of row b (rows >= B are
    0), each row selected in (no arithmetic across rows); n_live: int32 [16]."""
    ob = tl.arange(0, COLS)
    xt = tl.zeros([COLS, BLOCK_K], tl.float32)
    for b in range(B):
        xb = merge_chunk(o_part, lse_part, b, row_of(n_live, ob, b), k0, K, HQ, HD, NSPLIT, CH, BLOCK_K, dt)
        xt = tl.where(ob[:, None] == b, xb[None, :], xt)
    return xt


@triton.jit
def oproj_merge_mma(w0, o_part, lse_part, n_live, w, rows, rmask, B: tl.constexpr, K: tl.constexpr,
                    HQ: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr, CH: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, dt: tl.constexpr):
    """fp32 [16, BLOCK_N] = merge(partials)[B, K] @ W[rows, :]^T on the tensor cores (ops/gemv_mma.py), weight
    chunks double-buffered."""
    acc = tl.zeros([BLOCK_N, COLS], tl.float32)
    wv = w0
    for k0 in range(BLOCK_K, K, BLOCK_K):
        nxt = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
        acc = mma_acc(acc, wv, merged_tile(o_part, lse_part, n_live, k0 - BLOCK_K, B, K, HQ, HD, NSPLIT, CH,
                                           BLOCK_K, dt))
        wv = nxt
    xt = merged_tile(o_part, lse_part, n_live, last_chunk(K, BLOCK_K), B, K, HQ, HD, NSPLIT, CH, BLOCK_K, dt)
    return tl.trans(mma_acc(acc, wv, xt))


@triton.jit
def oproj_merge_body(tile, w0, o_part, lse_part, w, res, out, B: tl.constexpr, N: tl.constexpr,
                     K: tl.constexpr, HQ: tl.constexpr, HD: tl.constexpr, NSPLIT: tl.constexpr,
                     NSP2: tl.constexpr, CH: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, MMA: tl.constexpr):
    """out[b, n] = (res[b, n] + (merge(o_part, lse_part)[b, :] @ w[n, :]).to(dt)).to(dt), the tile's rows n
    (MMA: on the tensor cores, BLOCK_B = 16)."""
    dt: tl.constexpr = out.dtype.element_ty
    rows, rmask = tile_rows(tile, N, BLOCK_N)
    ob = tl.arange(0, BLOCK_B)
    n_live = tl.zeros([BLOCK_B], tl.int32)
    for b in range(B):
        n_live = tl.where(ob == b, live_splits(lse_part, b, HQ, NSPLIT, NSP2), n_live)
    if MMA:
        acc = oproj_merge_mma(w0, o_part, lse_part, n_live, w, rows, rmask, B, K, HQ, HD, NSPLIT, CH, BLOCK_N,
                              BLOCK_K, dt)
    else:
        acc = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
        wv = w0
        for k0 in range(BLOCK_K, K, BLOCK_K):  # double-buffered weight chunks (ops/gemv_rows.py gemv_rows)
            nxt = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
            acc = oproj_merge_mac(acc, o_part, lse_part, n_live, wv, k0 - BLOCK_K, B, BLOCK_B, K, HQ, HD, NSPLIT,
                                  CH, BLOCK_K, dt)
            wv = nxt
        acc = oproj_merge_mac(acc, o_part, lse_part, n_live, wv, last_chunk(K, BLOCK_K), B, BLOCK_B, K, HQ, HD,
                              NSPLIT, CH, BLOCK_K, dt)
    m = (ob[:, None] < B) & rmask[None, :]
    offs = ob[:, None] * N + rows[None, :]
    r = tl.load(res + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(out + offs, (r + rnd(acc, dt)).to(dt), mask=m)


def oproj_merge_reference(op: Op, t: dict) -> None:
    """PyTorch reference: merge in fp32 (``merge_partials``, as ``attn_merge``'s reference), cast to the model
    dtype, then ``res + F.linear(attn, w)`` (as ``gemv_residual``'s)."""
    a = op.args
    out = t[a["out"]]
    attn = merge_partials(t[a["o_part"]], t[a["lse_part"]], out.dtype)
    out.copy_(t[a["res"]] + F.linear(attn, t[a["w"]]))


OPROJ_MERGE = OpKind(
    "oproj_merge", oproj_merge_prologue, oproj_merge_body, ("o_part", "lse_part", "w", "res", "out"),
    ("B", "N", "K", "HQ", "HD", "NSPLIT", "NSP2", "CH", "BLOCK_B", "BLOCK_N", "BLOCK_K", "MMA"), 1,
    oproj_merge_reference)


def add_oproj_merge(graph: Graph, name: str, o_part: Buffer, lse_part: Buffer, w: Buffer, res: Buffer, *,
                    tiling: Tiling = Tiling(), gemv: str = "fma", blocks: dict | None = None) -> Buffer:
    """Append ``out[B, N] = res + merge(o_part, lse_part)[B, K] @ w[N, K]^T`` tiled over N (module doc) and
    return ``out`` (``{name}.out``).

    o_part fp32 [B, Hq, NSPLIT, HD], lse_part fp32 [B, Hq, NSPLIT], w/res in the model dtype; K = Hq*HD.
    gemv: "fma" | "mma" (CUDA or tensor cores, ops/tiling.py ``check_gemv``). blocks: overrides of the tiling
    (BLOCK_N, BLOCK_K; CH = splits merged per partials tile; tests and tuning). Raises ValueError when the
    shapes do not fit together or for an unknown gemv path. Task costs, e = model element size: bytes =
    rows*K*e (weights) + B*Hq*NSPLIT*(HD+1)*4 (all partials of the batch, re-read by every tile) + 2*B*rows*e
    (res, out); flops = 2*B*rows*K + 5*B*K*NSPLIT (merge: max, exp, weight sum, multiply-add per split)."""
    B, HQ, NSPLIT, HD = o_part.shape
    K = HQ * HD
    N, Kw = w.shape
    if lse_part.shape != (B, HQ, NSPLIT) or Kw != K or res.shape != (B, N):
        raise ValueError(f"{name}: o_part {o_part.shape}, lse_part {lse_part.shape}, w {w.shape} and res "
                         f"{res.shape} do not fit [B, Hq, NSPLIT, HD], [B, Hq, NSPLIT], [N, Hq*HD], [B, N]")
    out = graph.add_buffer(f"{name}.out", (B, N), res.dtype, "activation")
    es = w.nbytes // (N * K)
    nsp2 = triton.next_power_of_2(NSPLIT)
    p = {"B": B, "N": N, "K": K, "HQ": HQ, "HD": HD, "NSPLIT": NSPLIT, "NSP2": nsp2, **gemv_blocks(N, K, B, tiling, gemv=gemv)}
    p["CH"] = max(1, min(nsp2, MERGE_TILE_ELEMS // p["BLOCK_K"]))
    p.update(blocks or {})
    part_bytes = B * HQ * NSPLIT * (HD + 1) * 4

    def make(t, n0, n1):
        rows = n1 - n0
        return ([region(o_part), region(lse_part), region(w, (n0, n1), (0, K)), region(res, (0, B), (n0, n1))],
                [region(out, (0, B), (n0, n1))],
                rows * K * es + part_bytes + 2 * B * rows * es, 2 * B * rows * K + 5 * B * K * NSPLIT)

    args = {"o_part": o_part, "lse_part": lse_part, "w": w, "res": res, "out": out}
    graph.add_op(Op(name, OPROJ_MERGE, {role: b.name for role, b in args.items()}, p),
                 row_tiled_tasks(N, p["BLOCK_N"], make))
    return out
