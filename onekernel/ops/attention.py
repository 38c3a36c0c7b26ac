"""Decode attention as flash-decoding: split-KV partials, then a log-sum-exp merge.

Source: Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov, "Flash-Decoding for long-context inference"
(2023), and the online softmax of FlashAttention (Dao et al., 2022).

Layouts (model dtype ``T`` = fp32/bf16/fp16, softmax and accumulation always fp32):
  ``seq_lens`` int32 [B]: position of the token being decoded; row b attends to KV positions 0..seq_lens[b]
  inclusive. Read from memory, so one compiled kernel serves every step.
  q T [B, Hq, hd] (RoPE applied); k_cache/v_cache T [B, Hkv, S, hd] (this step's k/v already at row
  seq_lens[b]); merged output T [B, Hq*hd] (``add_attn_merge``; the O-projection can merge the partials
  itself instead: ops/oproj_merge.py). GQA: q head h uses kv head h // (Hq // Hkv).
  Partials: o_part fp32 [B, Hq, NSPLIT, hd], lse_part fp32 [B, Hq, NSPLIT].

``attn_partial`` tile (b, g, s), s-th split of kv head g: positions [s*SPLIT, min((s+1)*SPLIT, len_b)),
len_b = seq_lens[b] + 1. With x_j = scale * q . k_j for the R = Hq/Hkv heads of group g (K/V read once):
    O_s = sum_j exp(x_j - lse_s) v_j,   lse_s = log sum_j exp(x_j)        (normalized partial output)
An empty split (start >= len_b) reads no K/V and writes O_s = 0, lse_s = -inf.
Batch invariance: SPLIT/NSPLIT come from Hkv, the group Hq/Hkv, the head dim and the cache length only
(``choose_split``; or the ONEKERNEL_ATTN_SPLIT measurement switch), and every tile works on one sequence b, so row
b's result never depends on B.
``attn_merge`` tile (b, h): with LSE = log sum_s exp(lse_s) (the max is subtracted first),
    attn[b, h] = sum_s exp(lse_s - LSE) O_s
which equals softmax(scale * q K^T) V over all positions; splits with lse_s = -inf get weight 0.

The QK^T and PV products use ``tl.dot`` on fp32 operands with the group's heads padded to GP >= 16 rows
(the tensor-core minimum; the kernel is memory bound so padding is free). For a bf16/fp16 model the dot
runs in tf32, which represents bf16 K/V/q exactly (only P is rounded, to 2^-11); for fp32 it is "ieee".
``seq_lens`` is an "input" buffer (host-written before the step), so the prologue reads it and does the
split/address math; q and the cache are activations and are read in the body with ``cache_modifier=".cg"``.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from onekernel.errors import InputError
from onekernel.graph.ir import Buffer, Graph, Op, Task
from onekernel.ops.base import OpKind
from onekernel.ops.tiling import region

BLOCK_N = 32  # KV rows per inner iteration (H200 bf16: 96 regs, 43 KiB smem; 64 needs 78 KiB and was slower)
SPLITS = (64, 128, 256)
# groups of more than WIDE_GROUP query heads per KV head (Llama-3.1-70B's 8) also take SPLIT 32 while it makes at most
# WIDE_MAX_TILES tiles per sequence, Hkv x NSPLIT (choose_split)
WIDE_GROUP, WIDE_SPLITS, WIDE_MAX_TILES = 4, (32, 64, 128, 256), 16
# choose_split: at most this many waves of SMs of tiles per sequence at full context, for head dims <= 64 / above
SPLIT_WAVES_SMALL_HD, SPLIT_WAVES = 2, 4
SMALL_HD_FROM = 2048  # the 2-wave bound applies to caches longer than this (measured at 4096)
# a measurement switch: ONEKERNEL_ATTN_SPLIT=N gives every attention op SPLIT N (a power of two >= 16) instead of
# choose_split's (an explicit ``split`` argument still wins); checked where it is used (split_override)
SPLIT_ENV = os.environ.get("ONEKERNEL_ATTN_SPLIT", "")


def split_override() -> int | None:
    """ONEKERNEL_ATTN_SPLIT as an int, None when unset or empty. Raises InputError unless it is a power of two >= 16
    (the kernels' key blocks divide it)."""
    text = SPLIT_ENV.strip()
    if not text:
        return None
    n = int(text) if text.isdecimal() and len(text) <= 6 else 0
    if n < 16 or n & (n - 1):
        raise InputError(f"ONEKERNEL_ATTN_SPLIT must be a power of two >= 16 (a measurement switch), got {text!r:.40}; "
                         "unset it for ops.attention.choose_split's split")
    return n


@triton.jit
def attn_partial_prologue(tile, q, k_cache, v_cache, seq_lens, o_part, lse_part,
                          HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, S: tl.constexpr,
                          SPLIT: tl.constexpr, NSPLIT: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
                          SM_SCALE: tl.constexpr):
    b = tile // (HKV * NSPLIT)
    g = (tile // NSPLIT) % HKV
    s = tile % NSPLIT
    length = tl.load(seq_lens + b) + 1
    end = tl.minimum(tl.minimum(length, s * SPLIT + SPLIT), S)  # never past the cache
    return b, g, s, end


@triton.jit
def attn_partial_body(tile, b, g, s, end, q, k_cache, v_cache, seq_lens, o_part, lse_part,
                      HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, S: tl.constexpr,
                      SPLIT: tl.constexpr, NSPLIT: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
                      SM_SCALE: tl.constexpr):
    R: tl.constexpr = HQ // HKV
    rows = tl.arange(0, GP)
    d = tl.arange(0, HD)
    hmask = rows < R
    heads = g * R + rows
    qv = tl.load(q + (b * HQ + heads)[:, None] * HD + d[None, :], mask=hmask[:, None], other=0.0,
                 cache_modifier=".cg").to(tl.float32)
    qk_scale = SM_SCALE * 1.4426950408889634  # exp(x) = exp2(x * log2 e)
    kv_off = (b * HKV + g).to(tl.int64) * (S * HD)
    kb = k_cache + kv_off
    vb = v_cache + kv_off
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, HD], tl.float32)
    for n0 in range(s * SPLIT, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        kv_ptr = n[:, None] * HD + d[None, :]
        k = tl.load(kb + kv_ptr, mask=nmask[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        v = tl.load(vb + kv_ptr, mask=nmask[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        if q.dtype.element_ty == tl.float32:
            x = tl.dot(qv, tl.trans(k), input_precision="ieee")
        else:
            x = tl.dot(qv, tl.trans(k), input_precision="tf32")
        x = tl.where(nmask[None, :], x * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 1))  # finite: n0 < end, so one column is valid
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(x - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        if q.dtype.element_ty == tl.float32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p, v, input_precision="tf32")
        acc = acc * alpha[:, None] + pv
        m = m_new
    nonempty = l > 0.0
    o = acc / tl.where(nonempty, l, 1.0)[:, None]
    lse = tl.where(nonempty, (m + tl.log2(tl.where(nonempty, l, 1.0))) * 0.6931471805599453, float("-inf"))
    slot = (b * HQ + heads) * NSPLIT + s
    tl.store(o_part + slot[:, None] * HD + d[None, :], o, mask=hmask[:, None])
    tl.store(lse_part + slot, lse, mask=hmask)


@triton.jit
def attn_merge_prologue(tile, o_part, lse_part, out, HQ: tl.constexpr, HD: tl.constexpr,
                        NSPLIT: tl.constexpr, NSP2: tl.constexpr, CH: tl.constexpr):
    return tile // HQ, tile % HQ


@triton.jit
def attn_merge_body(tile, b, h, o_part, lse_part, out, HQ: tl.constexpr, HD: tl.constexpr,
                    NSPLIT: tl.constexpr, NSP2: tl.constexpr, CH: tl.constexpr):
    row = b * HQ + h
    sp = tl.arange(0, NSP2)
    lse = tl.load(lse_part + row * NSPLIT + sp, mask=sp < NSPLIT, other=float("-inf"), cache_modifier=".cg")
    mx = tl.max(lse, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    tot = tl.sum(tl.exp(lse - mx), 0)
    n_live = tl.sum((lse > float("-inf")).to(tl.int32), 0)  # live splits are a prefix: skip the rest
    d = tl.arange(0, HD)
    acc = tl.zeros([HD], tl.float32)
    for c in range(0, n_live, CH):
        idx = c + tl.arange(0, CH)
        lc = tl.load(lse_part + row * NSPLIT + idx, mask=idx < NSPLIT, other=float("-inf"), cache_modifier=".cg")
        live = lc > float("-inf")  # skip the O of empty splits: no memory traffic, no 0 * garbage
        oc = tl.load(o_part + (row * NSPLIT + idx)[:, None] * HD + d[None, :], mask=live[:, None], other=0.0,
                     cache_modifier=".cg")
        acc += tl.sum(oc * tl.exp(lc - mx)[:, None], 0)
    res = acc / tl.where(tot > 0.0, tot, 1.0)
    tl.store(out + row * HD + d, res.to(out.dtype.element_ty))


def _partial_reference(op: Op, t: dict) -> None:
    p = op.params
    a = op.args
    q, k, v, sl = t[a["q"]].float(), t[a["k_cache"]].float(), t[a["v_cache"]].float(), t[a["seq_lens"]]
    o, lse = t[a["o_part"]], t[a["lse_part"]]
    R, SPLIT = p["HQ"] // p["HKV"], p["SPLIT"]
    o.zero_()
    lse.fill_(float("-inf"))
    for b in range(q.shape[0]):
        n = min(int(sl[b]) + 1, p["S"])
        for s in range(p["NSPLIT"]):
            lo, hi = s * SPLIT, min(n, (s + 1) * SPLIT)
            if lo >= hi:
                continue
            kk = k[b, :, lo:hi].repeat_interleave(R, 0)  # [Hq, n, hd]
            vv = v[b, :, lo:hi].repeat_interleave(R, 0)
            x = torch.einsum("hd,hnd->hn", q[b], kk) * p["SM_SCALE"]
            lse[b, :, s] = torch.logsumexp(x, -1)
            o[b, :, s] = torch.einsum("hn,hnd->hd", torch.softmax(x, -1), vv)


def merge_partials(o: torch.Tensor, lse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """PyTorch flash-decoding merge: o fp32 [B, Hq, NSPLIT, hd], lse fp32 [B, Hq, NSPLIT] -> [B, Hq*hd] in
    ``dtype`` (merged in fp32, then cast); empty splits (lse = -inf) weigh 0."""
    total = torch.logsumexp(lse, -1, keepdim=True)  # [B, Hq, 1]
    w = torch.nan_to_num(torch.exp(lse - total), nan=0.0)
    return (w[..., None] * o).sum(2).reshape(o.shape[0], -1).to(dtype)


def _merge_reference(op: Op, t: dict) -> None:
    out = t[op.args["out"]]
    out.copy_(merge_partials(t[op.args["o_part"]], t[op.args["lse_part"]], out.dtype))


ATTN_PARTIAL = OpKind(
    "attn_partial", attn_partial_prologue, attn_partial_body,
    ("q", "k_cache", "v_cache", "seq_lens", "o_part", "lse_part"),
    ("HQ", "HKV", "HD", "S", "SPLIT", "NSPLIT", "GP", "BLOCK_N", "SM_SCALE"), 4, _partial_reference)
ATTN_MERGE = OpKind(
    "attn_merge", attn_merge_prologue, attn_merge_body, ("o_part", "lse_part", "out"),
    ("HQ", "HD", "NSPLIT", "NSP2", "CH"), 2, _merge_reference)


def choose_split(n_kv_heads: int, max_seq_len: int, n_sms: int = 132, head_dim: int = 128,
                 group: int = 1) -> tuple[int, int]:
    """(SPLIT, NSPLIT): the smallest SPLIT in (64, 128, 256) (WIDE_SPLITS, from 32, for a ``group`` of more than
    WIDE_GROUP query heads per KV head; below) whose per-sequence tile count Hkv*NSPLIT at full
    context is <= W waves of ``n_sms`` (else 256); W = SPLIT_WAVES_SMALL_HD (2) for ``head_dim`` <= 64 and caches
    of more than SMALL_HD_FROM (2048) positions, else SPLIT_WAVES (4). Small splits keep SMs busy at short context,
    big ones cut the per-tile latency chain (and the merges) at long context. So caches of <= 2048 positions keep
    the 4-wave choice for every model (their kernels and the dead-tile skip's 16 splits per KV head, measured at 4
    waves); for 8 KV heads SPLIT 64 then holds up to 2048 positions at head dim <= 64, 4224 above.

    ``group`` = Hq / Hkv: a group of more than WIDE_GROUP (4) query heads per KV head may also take SPLIT 32
    (WIDE_SPLITS) where that makes at most WIDE_MAX_TILES (16) tiles per sequence, Hkv x NSPLIT (one KV head: caches
    of up to 512 positions, the TP=8 shard of Llama-3.1-70B, where it was timed). A tile's work grows with the group, and such a group runs the streaming kernel's CUDA-core
    attention (the tensor-core one takes at most 4 heads), whose warps walk their quarter of the split in blocks of
    at most 4096 products (exec.stream_smem.attn_bn): 4 positions at Llama-3.1-70B's 8 heads and head_dim 128, so
    SPLIT 64 is 4 dependent blocks per warp, SPLIT 32 two. Measured on the H200 (run 41, call 397,
    ``ONEKERNEL_ATTN_SPLIT``, rank 0's shard run alone, a full cache of 512 positions, megakernel ms at B = 1 / 8):
    Llama-3.1-70B at TP=8 (8 heads on 1 KV head) SPLIT 64 6.028 / 6.694, 32 5.748 / 6.327, 16 5.903 / 6.621 (16: 32
    splits for the last tile to merge); Llama-3.1-8B at TP=8
    (4 heads on 1) 1.189 / 1.404, 1.121 / 1.413, 1.161 / 1.437 and at TP=4 (4 on 2) 1.401 / 1.563, 1.388 / 1.700,
    1.444 / 1.827. So groups of 4 or fewer heads keep 64. In a full cache of 4096 positions (call 399) the 70B shard's
    SPLIT 32 lost: 8.214 / 14.609 against 6.572 / 11.797 at 64 (128 splits of 32 for the last tile to merge, and
    twice the warp merges), hence the bound; between 16 and 128 tiles nothing was timed, nor the 70B model's 2-8 KV
    heads (TP=1-4), which keep 64 at 512 positions.

    Never depends on the batch size: the split fixes the flash-decoding merge order, so a B-dependent split
    would make a sequence's output depend on how many other sequences share the step (batch invariance).
    Measured on the H200 (run 32, ms per step at B = 1 / 8 / 16, a full cache of 4096 positions, each split its own
    process, call 323):
    - Llama-3.2-1B (head dim 64): SPLIT 64 (4 waves) megakernel 0.950 / 1.559 / 2.285, graph 1.080 / 1.551 / 2.029, pdl
      1.129 / 1.791 / 2.516; SPLIT 128 (2 waves) megakernel 0.923 / 1.458 / 1.986, graph 1.078 / 1.484 / 1.917, pdl
      1.090 / 1.653 / 2.233; SPLIT 256 megakernel 0.895 / 1.418 / 2.039, graph 1.098 / 1.452 / 1.864, pdl 1.064 / 1.620
      / 2.252. 128 is at least as fast as 64 in every mode and batch.
    - Llama-3.1-8B (head dim 128), megakernel at B = 1 / 8: SPLIT 64 4.255 / 6.032, 256 4.080 / 6.265 (call 323); 64
      4.193 / 5.989, 128 4.210 / 6.466 (call 324). Larger splits lose at B = 8, so head dims above 64 keep 4 waves.
    Earlier, the Triton partial+merge alone (Hq/Hkv/hd = 32/8/128, S = 8192, CUDA graph, us at L = 512/2048/8192):
    B=1 SPLIT 64: 9.3/10.8/19.6, 128: 9.9/13.1/15.4, 256: 13.3/13.6/14.7;
    B=8 SPLIT 64: 33/47/100, 128: 24/36/84, 256: 22/32/76 (PyTorch SDPA: B=1 7.7/7.3/11.2, B=8 7.8/22/67)."""
    waves = SPLIT_WAVES_SMALL_HD if head_dim <= 64 and max_seq_len > SMALL_HD_FROM else SPLIT_WAVES
    for split in (WIDE_SPLITS if group > WIDE_GROUP else SPLITS):
        nsplit = -(-max_seq_len // split)
        if split < SPLITS[0] and n_kv_heads * nsplit > WIDE_MAX_TILES:
            continue
        if n_kv_heads * nsplit <= waves * n_sms:
            return split, nsplit
    return SPLITS[-1], -(-max_seq_len // SPLITS[-1])


def add_attn_partial(graph: Graph, name: str, q: Buffer, k_cache: Buffer, v_cache: Buffer, seq_lens: Buffer, *,
                     split: int | None = None, n_sm: int = 132) -> tuple[Buffer, Buffer]:
    """Append the split-KV partials of decode attention (module doc) and return them: ``{name}.o_part`` fp32
    [B, Hq, NSPLIT, hd] and ``{name}.lse_part`` fp32 [B, Hq, NSPLIT] (scratch).

    q [B, Hq, hd] (RoPE applied), k_cache/v_cache [B, Hkv, S, hd] (model dtype; this step's k/v already at row
    seq_lens[b]), seq_lens int32 [B]. ``split`` overrides :func:`choose_split` (a multiple of 16; ``n_sm`` is
    its SM count), as ONEKERNEL_ATTN_SPLIT does when ``split`` is None (InputError unless a power of two >= 16).
    Raises ValueError unless Hq % Hkv == 0 and hd is a power of two >= 16.
    Task costs at full context (every split full): bytes = R*hd*e (q) + 2*rows*hd*e (K, V) + 4 (seq_len) +
    R*(hd+1)*4 (partials), flops = 4*R*rows*hd (QK^T and PV) + 5*R*rows (softmax), rows = KV rows in the split,
    R = Hq/Hkv, e = element size."""
    B, HQ, HD = q.shape
    _, HKV, S, _ = k_cache.shape
    if HQ % HKV or HD & (HD - 1) or HD < 16 or k_cache.shape != (B, HKV, S, HD) or v_cache.shape != k_cache.shape:
        raise ValueError(f"{name}: attention needs Hq % Hkv == 0, a power-of-two head_dim >= 16 and caches "
                         f"[B, Hkv, S, hd] (got q {q.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape})")
    R = HQ // HKV
    split = split or split_override()
    SPLIT, NSPLIT = choose_split(HKV, S, n_sm, HD, R) if split is None else (split, -(-S // split))
    e = q.nbytes // (B * HQ * HD)
    o_part = graph.add_buffer(f"{name}.o_part", (B, HQ, NSPLIT, HD), torch.float32, "scratch")
    lse_part = graph.add_buffer(f"{name}.lse_part", (B, HQ, NSPLIT), torch.float32, "scratch")
    tasks = []
    for b in range(B):
        for g in range(HKV):
            hs = (g * R, g * R + R)
            for s in range(NSPLIT):
                lo, hi = s * SPLIT, min(S, (s + 1) * SPLIT)
                kv = ((b, b + 1), (g, g + 1), (lo, hi), (0, HD))
                tasks.append(Task(
                    0, len(tasks),
                    reads=(region(q, (b, b + 1), hs, (0, HD)), region(k_cache, *kv), region(v_cache, *kv),
                           region(seq_lens, (b, b + 1))),
                    writes=(region(o_part, (b, b + 1), hs, (s, s + 1), (0, HD)),
                            region(lse_part, (b, b + 1), hs, (s, s + 1))),
                    bytes=R * HD * e + 2 * (hi - lo) * HD * e + 4 + R * (HD + 1) * 4,
                    flops=4 * R * (hi - lo) * HD + 5 * R * (hi - lo)))
    args = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "seq_lens": seq_lens, "o_part": o_part,
            "lse_part": lse_part}
    graph.add_op(Op(name, ATTN_PARTIAL, {role: b.name for role, b in args.items()},
                    {"HQ": HQ, "HKV": HKV, "HD": HD, "S": S, "SPLIT": SPLIT, "NSPLIT": NSPLIT,
                     "GP": max(16, triton.next_power_of_2(R)), "BLOCK_N": min(BLOCK_N, SPLIT),
                     "SM_SCALE": 1.0 / math.sqrt(HD)}), tasks)
    return o_part, lse_part


def add_attn_merge(graph: Graph, name: str, o_part: Buffer, lse_part: Buffer, dtype: torch.dtype) -> Buffer:
    """Append the log-sum-exp merge of the partials (module doc) and return ``{name}.out`` [B, Hq*hd] in
    ``dtype`` (the model dtype). Task costs: bytes = NSPLIT*(hd+1)*4 + hd*e, flops = 2*NSPLIT*hd + 3*NSPLIT."""
    B, HQ, NSPLIT, HD = o_part.shape
    out = graph.add_buffer(f"{name}.out", (B, HQ * HD), dtype, "activation")
    e = out.nbytes // (B * HQ * HD)
    NSP2 = triton.next_power_of_2(NSPLIT)
    tasks = [Task(0, b * HQ + h,
                  reads=(region(o_part, (b, b + 1), (h, h + 1), (0, NSPLIT), (0, HD)),
                         region(lse_part, (b, b + 1), (h, h + 1), (0, NSPLIT))),
                  writes=(region(out, (b, b + 1), (h * HD, h * HD + HD)),),
                  bytes=NSPLIT * (HD + 1) * 4 + HD * e, flops=2 * NSPLIT * HD + 3 * NSPLIT)
             for b in range(B) for h in range(HQ)]
    graph.add_op(Op(name, ATTN_MERGE, {"o_part": o_part.name, "lse_part": lse_part.name, "out": out.name},
                    {"HQ": HQ, "HD": HD, "NSPLIT": NSPLIT, "NSP2": NSP2, "CH": min(NSP2, max(1, 4096 // HD))}),
                 tasks)
    return out
