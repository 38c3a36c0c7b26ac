"""Which steps the streaming megakernel (``exec.stream_device``; its plan: ``exec.stream_plan``) runs, which ones
``backend="auto"`` gives it, and the chunk shape both are decided on.

- ``unsupported(step)``, ``unsupported_device(dev)``, ``unsupported_graph(graph, batch)``: why a step, a device or
  a graph cannot stream (None when it can): a Hopper GPU (sm_90); 2-byte weights; only op kinds with a streaming
  body (``GEMV_KINDS`` / ``OTHER_KINDS``: op kind name -> stream_base task kind); GEMV widths K % 8 == 0; head_dim
  a multiple of the chunk rows RG; batch <= MAX_BATCH; one activation row of K beside MIN_SLOTS weight slots in
  shared memory.
- ``prefer_stream(graph, n_workers)``: ``backend="auto"``'s choice: every tensor-core step, a CUDA-core one from
  STREAM_MIN_LAYER_BYTES of weights per worker and layer.
- ``chunk_shape(graph)``: every GEMV op's K (``gemv_k``), the chunk's CK columns (``chunk_cols``, at least
  ``attn_cols``) x RG rows (CK * RG = CHUNK_ELEMS: 16 KB of bf16 / fp16) and KXB, the activation buffer's chunk rows
  (a power of two).
"""
from __future__ import annotations

import torch

from onekernel.exec import stream_base as sd
from onekernel.exec.stream_smem import CHUNK_ELEMS, _slots, attn_tc_bufs, pow2_ceil
from onekernel.graph.ir import Graph

MIN_SLOTS = 4
MAX_BATCH = 16                   # batch rows a GEMV task holds in registers (BP <= 16: no spills, sm_90)
# op kind name -> stream_base task kind, for every op with a streaming body (the GEMV ones stream weights)
GEMV_KINDS = {"gemv_residual": sd.K_RESID.value, "gate_up": sd.K_GATEUP.value, "qkv_rope": sd.K_QKV.value, "lm_head": sd.K_LMHEAD.value}
OTHER_KINDS = {"embed": sd.K_EMBED.value, "attn_partial": sd.K_ATTN.value, "attn_merge": sd.K_MERGE.value, "argmax": sd.K_ARGMAX.value,
               "allreduce": sd.K_ALLREDUCE.value}


ATTN_COLS_BELOW = 1024  # attn_cols raises CK only below this hidden size


def chunk_cols(ks: list[int], least: int = 256) -> int:
    """CK: the largest power of two <= 1024 dividing every K, or ``least`` (K zero-padded to its multiples) when that
    is below ``least`` (256, or ``attn_cols``)."""
    ck = 1024
    while ck > least and any(k % ck for k in ks):
        ck //= 2
    return ck


def attn_cols(g: Graph) -> int:
    """The fewest chunk columns CK of a step's graph: 8 head_dim (at most 1024) where the staged activation tile (32 CK
    bytes) then holds one K and one V block of the 4 warps ([4, 16, head_dim] each) and attention takes the tensor cores
    (``stream_smem.attn_tc_bufs`` >= 1 at that CK), on the tensor-core path of a single-GPU step of hidden size below
    ATTN_COLS_BELOW (1024); else 256. So SmolLM2-135M and -360M (head dim 64, K = 576 / 960: no power of two >= 256
    divides them) take CK 512, their K zero-padded to 1024, where CK 256 padded 576 to 768 and kept the CUDA-core
    attention: their steps wait on latency, not on the weight stream, which the padding lengthens (SmolLM2-135M: 33%
    more bytes in its K = 576 GEMVs). Unmeasured, so left at the old rule: larger models whose K no power of two >= 8
    head_dim divides (none in the registry; e.g. hidden 2560 at head dim 128: the padding would stream at the copy
    bandwidth), tensor-parallel shards, and steps whose attention would stay on the CUDA cores anyway (more than 4 query
    heads per KV head, head dim 256). Measured on the H200 (benchmarks/README.md, run 33; megakernel, batch 1 / 8 / 16):
    SmolLM2-135M 0.605 / 0.762 / 0.943 -> 0.561 / 0.672 / 0.842 ms; at batch 1 the gain is the chunks of 16 rows (more
    workers a GEMV stage), at batch 8 / 16 the tensor-core attention adds 5% / 8%."""
    d = next((op.params["D"] for op in g.ops if op.kind.name == "qkv_rope"), 0)
    at = next((op.params for op in g.ops if op.kind.name == "attn_partial"), None)
    if g.meta.get("gemv") != "mma" or d >= ATTN_COLS_BELOW or at is None or \
            any(op.kind.name == "allreduce" for op in g.ops):
        return 256
    ck = min(1024, max(256, 8 * at["HD"]))
    tc = attn_tc_bufs(ck, at["HD"], at["SPLIT"], at["HQ"], at["HKV"], CHUNK_ELEMS // ck, True)
    return ck if tc else 256


def gemv_k(op) -> int:
    """The reduction length K of a GEMV op (qkv_rope calls it D)."""
    return op.params["K"] if "K" in op.params else op.params["D"]


def chunk_shape(graph) -> tuple[list[int], int, int, int]:
    """(every GEMV op's K, CK, RG, KXB): chunk columns and rows, and the activation buffer's chunk rows (a power of
    two) of a step's graph."""
    ks = [gemv_k(op) for op in graph.ops if op.kind.name in GEMV_KINDS]
    ck = chunk_cols(ks, attn_cols(graph))
    return ks, ck, CHUNK_ELEMS // ck, pow2_ceil(max(-(-k // ck) for k in ks))


def unsupported(step) -> str | None:
    """Why the streaming megakernel cannot run ``step`` (None when it can): its device, then ``unsupported_graph``."""
    return unsupported_device(step.device) or unsupported_graph(step.graph, step.batch)


def unsupported_device(dev) -> str | None:
    """Why the streaming megakernel cannot run on ``dev`` (a torch.device; None on a Hopper GPU)."""
    if dev.type != "cuda":
        return "it needs a CUDA device"
    if torch.cuda.get_device_capability(dev)[0] != 9:
        return "it needs a Hopper GPU (sm_90: bulk async copies, mbarriers, warp specialisation)"
    return None


def unsupported_graph(g: Graph, batch: int) -> str | None:
    """Why the streaming megakernel cannot run a step of graph ``g`` at ``batch`` on any GPU (dtype, op kinds, GEMV
    widths and chunk shapes; None when it can). Both GEMV bodies have the same limits (a tensor-parallel shard's
    widths, tests/test_tp_sharding.py), except Qwen3's q/k RMSNorm: the tensor-core body only."""
    dtype = g.meta.get("dtype")
    if dtype not in (torch.bfloat16, torch.float16):
        return f"it streams 2-byte weights (bf16 / fp16), the model runs in {dtype}"
    kinds = {op.kind.name for op in g.ops}
    extra = kinds - set(GEMV_KINDS) - set(OTHER_KINDS)
    if extra:
        return f"op kinds {sorted(extra)} have no streaming body (fuse_merge=True uses oproj_merge)"
    qkn = [op.params["HD"] for op in g.ops if op.params.get("QK_NORM")]
    if qkn and g.meta.get("gemv") != "mma":
        return "Qwen3's per-head q/k RMSNorm streams only on the tensor-core path (this step has gemv='fma'; ask gemv='mma')"
    if qkn and qkn[0] % 32:
        return (f"Qwen3's per-head q/k RMSNorm pass spreads a head over a warp's 32 lanes: head_dim {qkn[0]} is not "
                "a multiple of 32")
    ks, ck, rg, kxb = chunk_shape(g)
    if any(k % 8 for k in ks):
        return (f"a GEMV's in_features {sorted({k for k in ks if k % 8})} is not a multiple of 8 (the activation is "
                "read in 16-byte vectors)")
    hd = next(op.params["HD"] for op in g.ops if op.kind.name == "qkv_rope")
    if hd % rg:
        return f"head_dim {hd} is not a multiple of the {rg}-row chunk groups"
    at = next(op.params for op in g.ops if op.kind.name == "attn_partial")
    if 4 * pow2_ceil(at["HQ"] // at["HKV"]) > at["HD"]:
        return (f"{at['HQ'] // at['HKV']} query heads per KV head at head_dim {at['HD']}: attention's warp-merge scratch "
                "(stream_attn._merge_views) keeps m and l of 4 warps x the heads in one row of head_dim floats")
    if batch > MAX_BATCH:
        return f"batch {batch} > {MAX_BATCH} (a GEMV task keeps every batch row's sums in registers)"
    if _slots(1, kxb, ck, rg) < MIN_SLOTS:
        return f"one row of K {kxb * ck} activations does not fit in shared memory beside {MIN_SLOTS} weight slots"
    return None


STREAM_MIN_LAYER_BYTES = 128 << 10  # per worker, CUDA-core steps; below it the Triton megakernel's tasks win


def prefer_stream(g: Graph, n_workers: int) -> bool:
    """Whether ``backend="auto"`` takes the streaming kernel for a step of graph ``g``: always for a tensor-core
    step (``g.meta["gemv"] == "mma"``), and for a CUDA-core one when each worker streams at least
    STREAM_MIN_LAYER_BYTES of weights per layer. Measured on the H200 (bf16, context 512, ms per step):
    - tensor cores, SmolLM2-135M (54 KB per worker per layer; run 19 call 190, 538e6ae): streaming 0.613 / 0.745 /
      0.975 at batch 1 / 8 / 16 against the Triton megakernel's 0.896 / 1.144 / 1.737 (and its CUDA-core body's
      0.671 at batch 1); Llama-3.2-1B and Llama-3.1-8B stream at every batch (benchmarks/README.md);
    - CUDA cores, batch 1: SmolLM2-135M streaming 0.699 against 0.671 Triton (call 190; session 6: 0.874 against
      0.685); Llama-3.2-1B (460 KB) 1.08 against 1.54; Llama-3.1-8B (1.7 MB) 5.43 against 8.79 (session 6).
    Depends on the model and its GEMV path only, never on the batch (a sequence's tokens do not depend on the batch
    it shares)."""
    if g.meta.get("gemv") == "mma":
        return True
    n_layers = sum(1 for op in g.ops if op.kind.name == "qkv_rope")
    layer = sum(g.buffers[op.args["w"]].nbytes for op in g.ops
                if op.kind.name in GEMV_KINDS and op.kind.name != "lm_head")
    return layer / max(n_layers, 1) / n_workers >= STREAM_MIN_LAYER_BYTES
