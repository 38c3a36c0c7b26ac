"""Host-side tiling helpers shared by the GEMV-shaped ops (embed, qkv_rope, gemv_residual, gate_up, lm_head).

A row-tiled GEMV ``y[B, N] = x[B, K] @ W[N, K]^T`` is split into tiles of ``BLOCK_N`` output rows; each tile
streams its ``BLOCK_N x K`` weight slab in chunks of ``BLOCK_K`` columns and keeps a ``[BLOCK_B, BLOCK_N]``
fp32 accumulator. Choices (H200: 132 SMs, ~4.8 TB/s):

* ``BLOCK_K``: 256..512 columns, so a warp reads whole 512..1024-byte row segments with 16-byte loads
  (8 bf16 per thread per load); smaller only when K itself is smaller; capped so the weight chunk of one
  tile stays <= 8192 elements (16 KB in bf16; gate_up: 4096 per matrix) per pipeline stage; the bodies
  double-buffer, so two chunks are in registers.
* ``BLOCK_N``: power of two in [lo, 64], the largest that still gives >= ``Tiling.min_tiles`` tiles, the
  smallest (lo) when N is too small for that. ``Tiling`` says how many tiles an op should have: "cover" (at
  least one per SM: the separate kernels, where up to two CTAs share an SM) or "fit" (more than half the SMs
  and at most one per SM: the megakernel, one worker per SM, where a worker running two tiles of one op in a
  row doubles that stage's latency; measured -289 us per step on SmolLM2-135M against "cover").
* Batch: ``BLOCK_B = next_pow2(B)`` rows of accumulator; BLOCK_N and BLOCK_K do NOT depend on B (they are
  the B=1 choices), so that each batch row's arithmetic is the same for every B (batch invariance, see
  ops/gemv_rows.py). The multiply is CUDA-core broadcast-and-reduce, one [BLOCK_N, BLOCK_K] product per row
  (``gemv="fma"``), or (``gemv="mma"``, ops/gemv_mma.py) one tensor-core product per chunk with the batch
  padded to BLOCK_B = MMA_COLS = 16 for every B, BLOCK_N >= 16 and chunks sized as for >= 32 rows.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from onekernel.errors import InputError
from onekernel.graph.ir import Buffer, Region, Task

# The largest batch a decode step runs: BLOCK_B = next_pow2(B) accumulator rows live in registers beside the
# weight chunks (compile_check.py: the megakernel uses 255 registers from batch 8), so 16 is the limit every
# layer above checks against.
MAX_BATCH = 16
# The GEMV paths (ops/gemv_rows.py: CUDA-core FMAs; ops/gemv_mma.py: tensor cores, the batch padded to MMA_COLS
# columns). tl.dot needs every dimension >= MMA_MIN, so the MMA path's tiles have at least 16 rows.
GEMV_PATHS = ("fma", "mma")
MMA_COLS = 16
MMA_MIN = 16
MAX_TILE_ELEMS = 8192
TILINGS = ("cover", "fit")
# Shared memory one CTA may use on an H100 / H200 (sm_90: 227 KB, ``cudaDevAttrMaxSharedMemoryPerBlockOptin``); an
# sm_86 / sm_89 GPU has 99 KB, an A100 163 KB (``exec.smem_per_block`` reads the device's).
SM90_SMEM = 232448


@dataclass(frozen=True)
class Tiling:
    """How finely the decode step's ops are split into tiles on a GPU of ``n_sm`` SMs (module doc).

    policy: "cover" (>= n_sm tiles per op) or "fit" (n_sm // 2 + 1 .. n_sm tiles where the tile-size limits
    allow). smem: bytes of shared memory one CTA may use (default an H100 / H200's, ``SM90_SMEM``), which bounds the
    depth of the chunk pipelines that go through shared memory (``prenorm_pipeline``). Raises InputError for
    another policy, n_sm < 1 or smem < 1."""

    n_sm: int = 132
    policy: str = "cover"
    smem: int = SM90_SMEM

    def __post_init__(self):
        if self.policy not in TILINGS:
            raise InputError(f"unknown tiling {self.policy!r}; choose 'cover' (at least one tile per SM, the "
                             "separate kernels' choice) or 'fit' (at most one tile per SM, the megakernel's)")
        if self.n_sm < 1:
            raise InputError(f"Tiling needs n_sm >= 1, got {self.n_sm}")
        if self.smem < 1:
            raise InputError(f"Tiling needs smem >= 1 (bytes of shared memory per CTA), got {self.smem}")

    @property
    def min_tiles(self) -> int:
        """The tile count an op should reach: n_sm ("cover") or n_sm // 2 + 1 ("fit": with power-of-two tile
        sizes the count then lands in (n_sm / 2, n_sm])."""
        return self.n_sm if self.policy == "cover" else self.n_sm // 2 + 1

    @property
    def separate(self) -> bool:
        """Whether these are the separate kernels' tiles ("cover"), not the megakernel's ("fit")."""
        return self.policy == "cover"

    def gemv_min_tiles(self, mma: bool) -> int:
        """The tile count a GEMV op (qkv_rope, gemv_residual, gate_up, lm_head) should reach: ``min_tiles``, except on
        the tensor-core path of the separate kernels, which takes "fit"'s single wave (at most one tile per SM).
        Measured (H200, run 26 call 260, scripts/gemv_sweep.py: every layer's op back to back, L2 flushed, us per op;
        "cover" / single wave): Llama-3.1-8B qkv_rope 25.4 / 24.5, o_proj 13.7 / 12.4, down 36.6 / 31.5, gate_up
        65.0 / 61.1 (with the chunk sizes of ``block_k_for``'s callers there); Llama-3.2-1B qkv_rope 11.6 / 12.0,
        gate_up 24.7 / 22.3 (o_proj and down already had one wave of 16-row tiles)."""
        return Tiling(self.n_sm, "fit", self.smem).min_tiles if mma and self.separate else self.min_tiles


def pow2_ceil(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def pow2_floor(n: int) -> int:
    """Largest power of two <= n (n >= 1)."""
    return 1 << (max(1, int(n)).bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def batch_block(batch: int) -> int:
    """BLOCK_B: accumulator rows for a batch of ``batch`` (next power of two)."""
    return pow2_ceil(batch)


def block_n_for(n: int, min_tiles: int, lo: int = 4, hi: int = 64) -> int:
    """Largest power of two BLOCK_N in [lo, hi] with ceil(n / BLOCK_N) >= min_tiles; ``lo`` if none."""
    bn = pow2_floor(max(1, n // max(1, min_tiles)))
    return max(lo, min(hi, bn))


def block_k_for(k: int, block_n: int, max_elems: int = MAX_TILE_ELEMS, mma: bool = False) -> int:
    """Columns per chunk: 512 for thin tiles, 256 otherwise, <= next_pow2(K), chunk <= max_elems elems.
    ``block_n``: the weight rows per chunk (never the batch: tiles must not depend on B). ``mma``: the tensor-core
    path also holds a [16, BLOCK_K] activation tile (double-buffered) as large as a 16-row weight chunk, so its
    chunks are sized as for >= 32 rows (BLOCK_K 512 spilled registers in qkv_rope at K = 576, sm_90a)."""
    if mma:
        block_n = max(block_n, 2 * MMA_COLS)
    bk = min(pow2_ceil(k), 512 if block_n <= 16 else 256)
    while bk > 16 and block_n * bk > max_elems:
        bk //= 2
    return max(16, bk)


def check_gemv(gemv: str, batch: int) -> bool:
    """Whether ``gemv`` (one of GEMV_PATHS) is the tensor-core path; ValueError for another name, or for a
    batch the MMA path cannot hold (> MMA_COLS)."""
    if gemv not in GEMV_PATHS:
        raise ValueError(f"unknown gemv path {gemv!r}; choose one of {', '.join(GEMV_PATHS)}")
    if gemv == "mma" and batch > MMA_COLS:
        raise ValueError(f"gemv='mma' pads the batch to {MMA_COLS} columns; batch {batch} does not fit (the "
                         f"decode step runs at most {MAX_BATCH} sequences)")
    return gemv == "mma"


def gemv_blocks(n: int, k: int, batch: int, tiling: Tiling, lo: int = 4, hi: int = 64,
                max_elems: int = MAX_TILE_ELEMS, gemv: str = "fma") -> dict:
    """The constexpr tile params of a row-tiled GEMV: BLOCK_B, BLOCK_N, BLOCK_K, MMA (see module doc).
    Only BLOCK_B depends on ``batch``, and only on the "fma" path (the "mma" path pads every batch to
    MMA_COLS and needs BLOCK_N >= 16). ``max_elems``: weight elements per chunk of one matrix (gate_up
    streams two matrices, double-buffered, and uses half). Raises ValueError as ``check_gemv``."""
    mma = check_gemv(gemv, batch)
    bn = block_n_for(n, tiling.gemv_min_tiles(mma), max(lo, MMA_MIN) if mma else lo, hi)
    return {"BLOCK_B": MMA_COLS if mma else batch_block(batch), "BLOCK_N": bn,
            "BLOCK_K": block_k_for(k, bn, max_elems, mma), "MMA": mma}


def region(buffer: Buffer, *box) -> Region:
    """The box ``((lo, hi), ...)`` of ``buffer`` as a Region (ints); no box means the whole buffer."""
    if not box:
        return buffer.full()
    for p in box:  # fast path (a decode graph makes ~10^5 regions): already (int, int) tuples, kept as they are
        if type(p) is not tuple or len(p) != 2 or type(p[0]) is not int or type(p[1]) is not int:
            return Region(buffer.name, tuple((int(lo), int(hi)) for lo, hi in box))
    return Region(buffer.name, box)


def gemv_cost(rows: int, k: int, batch: int, elem: int, extra_bytes: int = 0) -> tuple[int, int]:
    """(bytes, flops) of one GEMV tile: ``rows x k`` weights + the ``[batch, k]`` input + extra_bytes;
    2 * batch * rows * k FLOPs."""
    return rows * k * elem + batch * k * elem + extra_bytes, 2 * batch * rows * k


def row_tiled_tasks(n: int, block_n: int, make) -> list[Task]:
    """One Task per BLOCK_N rows of an N-row output: ``make(tile, n0, n1) -> (reads, writes, bytes, flops)``
    with n1 clipped to N."""
    tasks = []
    for t in range(cdiv(n, block_n)):
        n0, n1 = t * block_n, min(n, (t + 1) * block_n)
        reads, writes, nbytes, flops = make(t, n0, n1)
        tasks.append(Task(op=-1, tile=t, reads=tuple(reads), writes=tuple(writes), bytes=int(nbytes),
                          flops=int(flops)))
    return tasks


def prenorm_scratch(graph, n_tiles: int, B: int, D: int, dtype) -> Buffer:
    """The scratch ``prenorm.xn.{n_tiles}x{D}`` [B, n_tiles, D] (model dtype) where each tile of a PRENORM GEMV op
    (qkv_rope, gate_up: the separate kernels' tensor-core path) writes its own copy of RMSNorm(x) and its chunk loop
    reads it back (ops/qkv.py's module doc). One buffer per shape for every such op of the graph: each tile writes and
    reads only its own row and its op's regions say so, so a later op's tile t is ordered after an earlier op's tile t
    wherever the graph runs as a dependency graph (the separate kernels run the ops in order anyway)."""
    name = f"prenorm.xn.{n_tiles}x{D}"
    b = graph.buffers.get(name)
    if b is not None and (b.shape != (B, n_tiles, D) or b.dtype != dtype):  # another batch or dtype: its own buffer
        name = f"{name}.b{B}.{str(dtype).removeprefix('torch.')}"
        b = graph.buffers.get(name)
    return b if b is not None else graph.add_buffer(name, (B, n_tiles, D), dtype, "scratch")


# A PRENORM tile's chunk pipelines, deepest first: (STAGES, BLOCK_K). Measured on qkv_rope (H200, run 28 call 281,
# scripts/gemv_sweep.py, us per op at batch 1 / 8 / 16): Llama-3.1-8B (64-row tiles) 4 deep of 256 columns 18.5 / 23.5 /
# 29.0, 5 deep of 128 18.9 / 23.8 / 29.5, 3 deep of 128 22.2 / 27.2 / 33.4, in registers 26.0 / 24.0 / 29.9 (the
# in-loop RMSNorm in registers: 25.4 / 28.0 / 30.4); Llama-3.2-1B (32-row tiles) 4 deep of 256 8.9 / 10.9 / 12.8, in
# registers 8.5 / 11.2 / 13.2 (in-loop 10.9 / 13.6 / 15.7). gate_up (call 283): Llama-3.2-1B (128 tiles of 2 x 64 rows)
# 4 deep of 128 21.2 / 23.6 / 26.8 against the in-loop form's 22.2 / 26.2 / 27.6; Llama-3.1-8B (224 tiles, two CTAs a
# SM, so 4 deep of 64) 59.6 / 69.0 / 79.5 against 60.0 / 63.5 / 66.5, so gate_up takes PRENORM only in one wave.
PRENORM_PIPELINES = ((4, 256), (3, 256), (4, 128), (3, 128), (4, 64), (3, 64))


GATE_UP_ROWS_MAX_BATCH = 2  # gate_up_rows' tiles up to this batch (measured: sessions 34 and 35, calls 340 and 345)


def gate_up_rows(n: int, block_n: int, tiling: Tiling, mma: bool, batch: int) -> int:
    """ROWS of gate_up's tiles over ``n`` rows per matrix (0: ``block_n`` rows a tile, the default). On the separate
    kernels' tensor-core path at batch <= GATE_UP_ROWS_MAX_BATCH, where ``block_n``-row tiles take more than one wave
    (one tile per SM) but two CTAs share an SM, the tiles' rows are evened out over two CTAs per SM: ROWS =
    ceil(n / (2 n_sm)) rounded up to 8, held in the same ``block_n`` register rows (n > n_sm block_n there, so ROWS >
    block_n / 2: no smaller power of two holds them). Llama-3.1-8B: 224 tiles of 64 rows (92 SMs streaming two, 40
    one) become 256 tiles of 56 (124 SMs two, 8 one), the most rows an SM streams 128 -> 112; Qwen3-8B 192 of 64 ->
    256 of 48.

    Measured on the H200 (docs/DESIGN.md, sessions 34-35; gate_up alone, us per op at batch 1 / 16): Llama-3.1-8B
    60.8 -> 59.4 / 67.2 -> 68.1, Qwen3-8B 54.2 -> 52.7 / 63.2 -> 64.7; Llama-3.1-8B graph, ms at batch 1 / 2 / 4 /
    8 / 16: 4.385 -> 4.335 / 4.400 -> 4.354 / 4.541 -> 4.570 / 4.888 -> 4.883 / 5.406 -> 5.426, so batches above 2 keep
    ``block_n`` (likely because every tile normalises its [16, BLOCK_K] activation chunks in the loop, 32 more tiles'
    worth at a larger batch; not measured apart). Where it applies, the rule only moves rows between tiles: the tiles
    have the same BLOCK_N, BLOCK_K and chunk loop (no PRENORM on either side, both more than one wave), so every
    output element is the same sum in the same order on the tensor cores, and a sequence's bits do not depend on
    which side of the batch limit its batch falls (tests/test_mma_gpu.py; scripts/invariance_check.py on the H200).
    ONEKERNEL_GATE_UP_ROWS=0 keeps ``block_n`` at every batch (the A/B switch)."""
    if os.environ.get("ONEKERNEL_GATE_UP_ROWS", "1") == "0" or not (mma and tiling.separate) \
            or batch > GATE_UP_ROWS_MAX_BATCH or cdiv(n, block_n) <= tiling.n_sm:
        return 0
    rows = -(-cdiv(n, 2 * tiling.n_sm) // 8) * 8  # at most 2 n_sm tiles of it
    return rows if rows < block_n else 0


def prenorm_default(mma: bool, tiling: Tiling, n_tiles: int) -> bool:
    """Whether a GEMV op with an RMSNorm (qkv_rope, gate_up) of ``n_tiles`` tiles normalises once per tile (PRENORM)
    unless told: on the separate kernels' tensor-core path, where its tiles fit one wave (at most ``tiling.n_sm``);
    with two CTAs a SM (Llama-3.1-8B's gate_up) it was slower (``PRENORM_PIPELINES``' comment)."""
    return mma and tiling.separate and n_tiles <= tiling.n_sm


def prenorm_pipeline(rows: int, elem: int, k: int, tiling: Tiling, n_tiles: int) -> tuple[int, int]:
    """(STAGES, BLOCK_K) of a PRENORM tile streaming ``rows`` weight rows per chunk (qkv_rope: its register rows;
    gate_up: both matrices' rows) over K = k columns of ``elem``-byte weights: the first of ``PRENORM_PIPELINES``
    whose shared memory, (STAGES + 1) (rows + 16) BLOCK_K elem bytes (what Triton allocates for 64-row wgmma tiles;
    smaller tiles take less), fits the CTA's share of ``tiling.smem`` (its SM runs ceil(n_tiles / n_sm) CTAs at
    once); chunks no wider than K rounded up to a power of two (>= 16); the register double buffer (STAGES 0) where
    none fits. An H200 gives 4 deep of 256 columns to 64-row qkv tiles; a 99 KB GPU 3 deep of 128."""
    budget = tiling.smem // max(1, -(-n_tiles // tiling.n_sm))
    kmax = max(MMA_MIN, pow2_ceil(k))
    for st, bk in PRENORM_PIPELINES:
        bk = min(bk, kmax)
        if (st + 1) * (rows + MMA_COLS) * bk * elem <= budget:
            return st, bk
    return 0, min(256, kmax)
