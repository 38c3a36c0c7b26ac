"""The streaming megakernel's shared-memory budget (exec.stream_plan's constants; exec.stream_device allocates
what these count): the weight ring's chunk, the MMA path's staged tile, partial sums and raw tile, the CUDA-core
path's activation rows, attention's warp-merge scratch, the ring's slot count and the mbarriers' offset guess.
"""
from __future__ import annotations

import os

from onekernel.exec import stream_base as sd

CHUNK_ELEMS = 8192               # one chunk: 16 KB of a 2-byte dtype
SMEM_LIMIT = 232448              # H100/H200 dynamic shared memory per CTA (227 KB)
XBUF_SLOTS = 6                   # weight slots a large batch's activation buffer leaves to the ring
MMA_WARPS, MMA_ROWS = sd.MMA_WARPS, sd.MMA_ROWS
# attention's K/V ring in the MMA path's activation buffers (attn_kv_stages); STREAM_ATTN_KV=0 turns it off (a
# measurement switch, read once at import: the kernel takes the stage count as a constexpr)
KV_RING = os.environ.get("STREAM_ATTN_KV", "1") == "1"
# the smallest batch whose kernel allocates the raw tile for the ring alone (below the cp.async activation prefetch's
# batches it costs the weight ring 2 slots); STREAM_ATTN_KV_MIN_B sets it for a measurement
KV_MIN_B = int(os.environ.get("STREAM_ATTN_KV_MIN_B", "9"))
MMA_BLOCK_ROWS = 128  # weight rows per k-major block: GB = MMA_BLOCK_ROWS // RG chunk groups share a staged tile
MMA_EPI_BLOCK_ROWS = 64  # the same for residual and QKV tasks (GBE, mma_block_groups)


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def mma_groups(rg: int) -> int:
    """GB: chunk groups per k-major block of the MMA path (even, so a gate_up block holds whole units)."""
    return max(2, MMA_BLOCK_ROWS // rg)


def mma_block_groups(rg: int, small: bool) -> int:
    """Chunk groups per k-major block of a task: GB for gate_up and the LM head; at most MMA_EPI_BLOCK_ROWS // RG
    (GBE) for residual and QKV tasks (``small``), whose epilogue operands (residual rows, RoPE frequencies) are
    loaded per unit before the block in registers (stream_mma.gemv_mma), and which hold few units per task."""
    return min(mma_groups(rg), max(2, MMA_EPI_BLOCK_ROWS // rg)) if small else mma_groups(rg)


def acc_groups(rg: int, rp: int = 1, hd: int = 0) -> int:
    """ACCG: groups of the MMA path's partial-sum buffer [ACCG, 4, 16, RG] fp32: GB, or more (a power of two)
    where attention's warp-merge scratch, fp32 [8*RP, HD], needs them (Llama-3.1-70B); the kernel allocates it
    (stream_device.stream_megakernel) and views all of it as the scratch between GEMV tasks."""
    return max(mma_groups(rg), pow2_ceil(-(-8 * rp * hd // (MMA_WARPS * MMA_ROWS * rg))))


def mma_smem(ck: int, rg: int, batch: int, rp: int = 1, hd: int = 0) -> int:
    """Shared bytes of the MMA path beside the ring: the staged activation tile [16, CK] (2-byte dtype), the
    partial-sum buffer [ACCG, 4, 16, RG] fp32 (acc_groups), and at batches whose tile prefetch goes through
    cp.async (stream_base.mma_async_a) the raw tile [16, CK]."""
    tiles = 2 if raw_tile(batch, ck) else 1
    return tiles * MMA_ROWS * ck * 2 + acc_groups(rg, rp, hd) * MMA_WARPS * MMA_ROWS * rg * 4


def xbuf_rows(B: int, kxb: int, ck: int) -> int:
    """XB: the batch rows whose activation a GEMV task keeps in shared memory (all B when they fit beside
    XBUF_SLOTS weight slots); the kernel re-reads the other rows from L2 per chunk. Never below 1."""
    room = SMEM_LIMIT - 2048 - XBUF_SLOTS * CHUNK_ELEMS * 2
    return max(1, min(B, room // (kxb * ck * 2)))


def attn_bn(split: int, rp: int, hd: int) -> int:
    """Attention's per-warp BN-block (stream_tasks.attn_task: warp w takes the quarter [w, w+1) * split/4 of each
    tile's positions): at most RP x BN x HD = 4096 products per warp and block, dividing split / 4."""
    return max(1, min(split // 4, 4096 // (rp * hd)))


def raw_tile(batch: int, ck: int) -> bool:
    """Whether the MMA path's kernel allocates the raw tile [16, CK] beside the staged one: for the cp.async
    activation prefetch (stream_base.mma_async_a) or, from batch KV_MIN_B, for attention's K/V ring alone."""
    return sd.mma_async_a(batch, ck) or (KV_RING and batch >= KV_MIN_B)


def attn_kv_stages(mma: bool, batch: int, ck: int, bn: int, hd: int) -> int:
    """KVS: K/V blocks ([4 warps, BN, HD] of K and of V, 2-byte dtype) that attention keeps in flight through shared
    memory (stream_tasks.attn_task), or 0 (one block ahead in registers). The ring lives in the MMA path's staged
    tile and raw tile (xbuf, rbuf: [16, CK] each, free during attention), so only where the raw tile exists
    (raw_tile: batch > 8 at CK = 1024); KVS // 2 blocks per buffer, at least 2 (else no deeper than the registers),
    at most 4."""
    if not (KV_RING and mma and raw_tile(batch, ck)):
        return 0
    per = min(4, (MMA_ROWS * ck * 2) // (2 * MMA_WARPS * bn * hd * 2))
    return 2 * per if per >= 2 else 0


def fma_xbuf_bytes(xb: int, kxb: int, ck: int, rp: int, hd: int) -> int:
    """Shared bytes of the CUDA-core path beside the ring: xbuf's XB activation rows and attention's warp-merge
    scratch (fp32 [8, RP, HD], stream_tasks.attn_task; stream_device.stream_megakernel)."""
    return xb * kxb * ck * 2 + 32 * rp * hd


def _slots(xb: int, kxb: int, ck: int, rg: int, mma: bool = False, batch: int = 1, rp: int = 1, hd: int = 0) -> int:
    fixed = (mma_smem(ck, rg, batch, rp, hd) if mma else fma_xbuf_bytes(xb, kxb, ck, rp, hd)) + 2048
    return min(12, (SMEM_LIMIT - fixed) // (CHUNK_ELEMS * 2))


def bars_guess(c: dict) -> int:
    """The mbarriers' byte offset in shared memory as Triton 3.6's allocator placed them for Llama-3.2-1B at
    batch 1 and 16 (ring, then xbuf, then 1 KB of scratch); ``stream_runner.fit_kernel`` checks it against the
    compiled kernel and recompiles when it is wrong (Llama-3.1-8B batch 8: 1 KB more scratch)."""
    if c.get("MMA"):
        return c["SLOTS"] * CHUNK_ELEMS * 2 + mma_smem(c["CK"], c["RG"], c["B"], c["RP"], c["HD"]) + 1024
    return c["SLOTS"] * CHUNK_ELEMS * 2 + fma_xbuf_bytes(c["XB"], c["KXB"], c["CK"], c["RP"], c["HD"]) + 1024
