"""The streaming megakernel's shared-memory budget (exec.stream_plan's constants; exec.stream_device allocates
what these count): the weight ring's chunk, the MMA path's staged tile, partial sums and raw tile, the CUDA-core
path's activation rows, attention's warp-merge scratch, the ring's slot count and the mbarriers' offset guess.
"""
from __future__ import annotations

import os

from onekernel.exec import stream_base as sd

CHUNK_ELEMS = 8192               # one chunk: 16 KB of a 2-byte dtype
SMEM_LIMIT = 232448              # H100/H200 dynamic shared memory per CTA (227 KB)
XBUF_SLOTS = 6                   # chunks' bytes a large batch's activation buffer may hold (less than the ring)
MMA_WARPS, MMA_ROWS = sd.MMA_WARPS, sd.MMA_ROWS
ATTN_TC = os.environ.get("STREAM_ATTN_TC", "1") == "1"   # tensor-core attention where it fits (attn_tc_bufs)
MMA_BLOCK_ROWS = 64  # weight rows per k-major block: GB = MMA_BLOCK_ROWS // RG chunk groups share a staged tile


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def mma_groups(rg: int) -> int:
    """GB: chunk groups per k-major block of the MMA path (even, so a gate_up block holds whole units)."""
    return max(2, MMA_BLOCK_ROWS // rg)


def acc_groups(rg: int, rp: int = 1, hd: int = 0) -> int:
    """ACCG: groups of the MMA path's partial-sum buffer [ACCG, 4, 16, RG] fp32: GB, or more (a power of two)
    where attention's warp-merge scratch, fp32 [8*RP, HD], needs them (Llama-3.1-70B); the kernel allocates it
    (stream_device.stream_megakernel) and views all of it as the scratch between GEMV tasks."""
    return max(mma_groups(rg), pow2_ceil(-(-8 * rp * hd // (MMA_WARPS * MMA_ROWS * rg))))


def attn_tc_bufs(ck: int, hd: int, split: int, hq: int, hkv: int, rg: int, mma: bool) -> int:
    """ATTN_TC: the number of K/V buffers (1 or 2) of the tensor-core attention (exec.stream_attn_tc) on a step, or 0
    where the CUDA-core body runs: a CUDA-core GEMV step, a head dim below 64 (kv_layout swizzles 64-element rows)
    or not a multiple of 16, more than 4 query heads
    per KV head (the warp merge keeps m and l in the MMA tile's padding rows 4..7), a per-warp quarter of the split
    that is not whole 16-position blocks, a staged-activation tile (32 * CK bytes) that holds fewer than one K and
    one V block of the 4 warps ([4, 16, HD] each: HD 64 with CK 1024 holds two of each, HD 128 one), or a
    partial-sum buffer [ACCG, 4, 16, RG] fp32 smaller than the warp merge's fp32 [4, 8, HD]. STREAM_ATTN_TC=0 keeps
    the CUDA-core body."""
    r = hq // max(hkv, 1)
    views = (32 * ck) // (128 * hd) if hd else 0
    acc = acc_groups(rg, pow2_ceil(r), hd) * MMA_WARPS * MMA_ROWS * rg * 4
    if (not mma or not ATTN_TC or hd % 16 or hd < 64 or r > 4 or (split // 4) % 16 or views < 2 or (32 * ck) % (128 * hd)
            or acc < 4 * 8 * hd * 4 or acc % (8 * hd * 4)):
        return 0
    return min(2, views // 2)


def mma_smem(ck: int, rg: int, batch: int, rp: int = 1, hd: int = 0) -> int:
    """Shared bytes of the MMA path beside the ring: the staged activation tile [16, CK] (2-byte dtype), the
    partial-sum buffer [ACCG, 4, 16, RG] fp32 (acc_groups), and at batches whose tile prefetch goes through
    cp.async into a buffer of its own (stream_base.mma_raw_tile: batch 5-8 at CK 1024) the raw tile [RB, CK] (RB:
    stream_base.mma_raw_rows)."""
    rows = MMA_ROWS + (sd.mma_raw_rows(batch) if sd.mma_raw_tile(batch, ck) else 0)
    return rows * ck * 2 + acc_groups(rg, rp, hd) * MMA_WARPS * MMA_ROWS * rg * 4


def xbuf_rows(B: int, kxb: int, ck: int) -> int:
    """XB: the batch rows whose activation a GEMV task keeps in shared memory (all B when they fit in XBUF_SLOTS
    chunks' bytes); the kernel re-reads the other rows from L2 per chunk. Never below 1. The cap keeps the ring
    (at least 7 slots beside it) the largest buffer, which Triton's allocator places at shared byte 0, where the
    loader's bulk copies address it (stream_device._loader)."""
    return max(1, min(B, XBUF_SLOTS * CHUNK_ELEMS * 2 // (kxb * ck * 2)))


def attn_bn(split: int, rp: int, hd: int) -> int:
    """Attention's per-warp BN-block (stream_attn.attn_task: warp w takes the quarter [w, w+1) * split/4 of each
    tile's positions): at most RP x BN x HD = 4096 products per warp and block, dividing split / 4."""
    return max(1, min(split // 4, 4096 // (rp * hd)))


def fma_xbuf_bytes(xb: int, kxb: int, ck: int, rp: int, hd: int) -> int:
    """Shared bytes of the CUDA-core path beside the ring: xbuf's XB activation rows and attention's warp-merge
    scratch (fp32 [8, RP, HD], stream_attn.attn_task; stream_device.stream_megakernel)."""
    return xb * kxb * ck * 2 + 32 * rp * hd


def _slots(xb: int, kxb: int, ck: int, rg: int, mma: bool = False, batch: int = 1, rp: int = 1, hd: int = 0) -> int:
    fixed = (mma_smem(ck, rg, batch, rp, hd) if mma else fma_xbuf_bytes(xb, kxb, ck, rp, hd)) + 2048
    return min(12, (SMEM_LIMIT - fixed) // (CHUNK_ELEMS * 2))


def bars_guess(c: dict) -> int:
    """The mbarriers' byte offset in shared memory as Triton 3.6's allocator placed them for Llama-3.2-1B at
    batch 1 and 16 (ring, then xbuf, then 1 KB of scratch); ``stream_runner.fit_kernel`` checks it against the
    compiled kernel and recompiles when it is wrong. At head_dim 128 the tensor-core kernels have 1 KB more scratch
    (Llama-3.1-8B, Llama-3.2-3B, Qwen3; until session 25 only Qwen3's guess had it, so a cold Llama-3.1-8B start
    compiled its megakernel twice)."""
    if c.get("MMA"):  # at head_dim 128 (Llama-3.1-8B, Llama-3.2-3B, Qwen3): 1 KB more scratch
        return (c["SLOTS"] * CHUNK_ELEMS * 2 + mma_smem(c["CK"], c["RG"], c["B"], c["RP"], c["HD"]) + 1024
                + (1024 if c["HD"] >= 128 else 0))
    return c["SLOTS"] * CHUNK_ELEMS * 2 + fma_xbuf_bytes(c["XB"], c["KXB"], c["CK"], c["RP"], c["HD"]) + 1024
