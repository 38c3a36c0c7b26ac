"""A model config -> the task graph of one decode step, and that graph bound to weights and a KV cache.

Program order (layer i = 0..L-1); each builder names its outputs after its op (``down.3.out``, ...):
    embed                      tokens, tok_embeddings -> x_0
    qkv_rope.{i}               x_i, attn_norm, wqkv, rope_inv_freq, seq_lens -> q, k/v cache row seq_lens[b]
    attn_partial.{i}           q, k/v cache -> split-KV partials (ops/attention.py)
    then either (``fuse_merge=True``; measured slower, off by default: docs/DESIGN.md)
    o_proj.{i}  oproj_merge    h_i = x_i + merge(partials) @ wo^T      (ops/oproj_merge.py)
    or (separate)
    attn_merge.{i}             attn_i = merge(partials)
    o_proj.{i}  gemv_residual  h_i = x_i + attn_i @ wo^T
    gate_up.{i}                act_i = silu(norm(h_i) Wg^T) * (norm(h_i) Wu^T)
    down.{i}    gemv_residual  x_{i+1} = h_i + act_i @ w_down^T
    lm_head, lm_head.argmax    x_L, norm, lm_head -> logits fp32 [B, V], next_tokens int32 [B]
Fused weights (made once when the graph is bound): ``layers.{i}.wqkv`` = cat(wq, wk, wv) [(Hq+2Hkv)hd, D],
``layers.{i}.w_gate_up`` = cat(w_gate, w_up) [2F, D]. Weight buffers keep the canonical names of
docs/DESIGN.md; the KV cache of layer i is ``layers.{i}.k_cache`` / ``v_cache`` [B, Hkv, S, hd].
``residual=False`` (a tensor-parallel rank other than 0, dist/tp_kernels.py): o_proj and down add the zero
buffer ``residual.zero`` [B, D] instead of the residual stream, so the all-reduce after them adds it once.
``tp=(rank, n)`` with n > 1 (the megakernel at TP > 1, dist/tp_megakernel.py): all-reduce ops
(ops/allreduce.py) after ``embed`` (``embed.ar``), ``o_proj.{i}`` (``o_proj.{i}.ar``) and ``down.{i}``
(``down.{i}.ar``) read the rank's partial and the peers' copies of it (``peer{p}.embed.out``, ...: kind "peer");
every GEMV adds ``residual.zero`` and the all-reduce adds the residual stream, so every rank's graph is the same
and the sum is round(x + p_0 + ... + p_{n-1}) in fp32, in rank order, on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from onekernel.errors import InputError, UnsupportedModelError
from onekernel.graph.ir import Graph, gc_paused
from onekernel.graph.step import BoundStep
from onekernel.models.config import rope_inv_freq
from onekernel.ops.allreduce import ALLREDUCE, MAX_RANKS, add_allreduce, add_peer_buffer
from onekernel.ops.attention import ATTN_MERGE, ATTN_PARTIAL, add_attn_merge, add_attn_partial
from onekernel.ops.embed import EMBED, add_embed
from onekernel.ops.gemv import GATE_UP, GEMV_RESIDUAL, add_gate_up, add_gemv_residual
from onekernel.ops.lm_head import ARGMAX, LM_HEAD, add_lm_head
from onekernel.ops.oproj_merge import OPROJ_MERGE, add_oproj_merge
from onekernel.ops.qkv import QKV_ROPE, add_qkv_rope
from onekernel.ops.tiling import GEMV_PATHS, MAX_BATCH, Tiling

# Every op kind a decode step is made of (the explicit list; nothing registers itself at import).
OP_KINDS = (EMBED, QKV_ROPE, ATTN_PARTIAL, ATTN_MERGE, OPROJ_MERGE, GEMV_RESIDUAL, GATE_UP, LM_HEAD, ARGMAX,
            ALLREDUCE)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class WeightSource:
    """What a weight buffer is bound to: the canonical weights ``parts`` concatenated along dim 0, or (the RoPE
    table) a tensor computed from the config by ``compute()``."""

    parts: tuple[str, ...] = ()
    compute: Callable[[], torch.Tensor] | None = None

    def tensor(self, weights: dict) -> torch.Tensor:
        if self.compute is not None:
            return self.compute()
        missing = [p for p in self.parts if p not in weights]
        if missing:
            raise InputError(f"weight {missing[0]!r} is missing from the weight dict; load the model with load_model")
        ts = [weights[p] for p in self.parts]
        return ts[0] if len(ts) == 1 else torch.cat(ts)


def check_supported(cfg, batch: int, max_seq_len: int, dtype: torch.dtype) -> None:
    """Raise UnsupportedModelError / InputError for what the kernels cannot run (before any allocation)."""
    hd = cfg.head_dim
    if dtype not in DTYPES:
        raise UnsupportedModelError(f"{cfg.name}: dtype {dtype} is not supported; use torch.bfloat16, "
                                    "torch.float16 or torch.float32")
    if hd < 16 or hd > 256 or hd & (hd - 1):
        raise UnsupportedModelError(f"{cfg.name}: head_dim={hd} is not supported; the RoPE/attention tiles "
                                    "need a power of two in 16..256")
    for field in ("dim", "ffn_dim"):
        if getattr(cfg, field) % 16:
            raise UnsupportedModelError(f"{cfg.name}: {field}={getattr(cfg, field)} is not a multiple of 16, "
                                        "which the GEMV tiles need for aligned 16-byte weight loads")
    if cfg.n_heads % cfg.n_kv_heads:
        raise UnsupportedModelError(f"{cfg.name}: n_heads={cfg.n_heads} is not a multiple of "
                                    f"n_kv_heads={cfg.n_kv_heads}")
    if not 1 <= batch <= MAX_BATCH:
        raise InputError(f"batch={batch} is not supported; use 1..{MAX_BATCH} sequences per step")
    if max_seq_len < 1:
        raise InputError(f"max_seq_len={max_seq_len} must be >= 1")


def default_gemv(cfg, dtype: torch.dtype) -> str:
    """The GEMV path a model runs when none is asked for: a property of the model and its dtype, never of the
    batch (a sequence's tokens must not depend on the batch it shares). "mma" (tensor cores) for bf16/fp16 models
    with a hidden size of at least ``MMA_MIN_DIM``, else "fma" (CUDA cores). Measured on the H200 (run 8, commit
    093e3f3, benchmarks/README.md), ms per step fma -> mma: Llama-3.1-8B batch 1 graph 5.411 -> 4.961, pdl
    5.347 -> 4.894, megakernel 4.794 -> 4.714, batch 4 graph 10.15 -> 5.12; Llama-3.2-1B batch 1 graph 1.020 ->
    1.126 (10% slower), batch 8 3.179 -> 1.266, megakernel batch 8 4.237 -> 2.124, batch 16 (cold compile runs)
    24.4 -> 3.5. Run 29 call 303 (d7a115a, one process per model, graph / pdl with the model's fma path against
    the bench rows graph-mma / pdl-mma, batch 1 / 8 / 16): Qwen3-0.6B (hidden size 1024) graph 1.255 / 3.501 / 7.456
    -> 1.222 / 1.509 / 1.777, pdl 1.228 / 3.474 / 7.422 -> 1.202 / 1.477 / 2.039, so 1024 takes "mma" since then
    (it was 2048); SmolLM2-135M (576) graph 0.568 / 1.568 / 2.601 -> 0.830 / 0.934 / 1.069, pdl 0.544 / 1.533 /
    2.559 -> 0.674 / 0.865 / 1.058: slower at batch 1 (46% in graph), faster from batch 4, so it keeps "fma" (a
    choice by batch would break batch invariance). fp32 models keep "fma" in any case (``input_precision="ieee"``
    fp32 dots run on CUDA cores). A tensor-parallel rank takes the unsharded model's path
    (``dist.tp_kernels.rank_gemv``; the hidden size is not sharded, so a model runs one path at every TP size)."""
    if dtype in (torch.bfloat16, torch.float16) and cfg.dim >= MMA_MIN_DIM:
        return "mma"
    return "fma"


MMA_MIN_DIM = 1024  # default_gemv: the smallest hidden size that takes the tensor-core GEMVs by default


@gc_paused()
def decode_graph(cfg, batch: int, max_seq_len: int, dtype: torch.dtype = torch.bfloat16, *,
                 tiling: Tiling = Tiling(), fuse_merge: bool = False,
                 residual: bool = True, gemv: str | None = None,
                 tp: tuple[int, int] | None = None, ar_tiles: int | None = None) -> tuple[Graph, dict, dict]:
    """The decode-step Graph of ``cfg`` for ``batch`` sequences, a KV cache of ``max_seq_len`` positions and
    model dtype ``dtype``, tiled by ``tiling`` (``Tiling(n_sm, "cover"|"fit")``, ops/tiling.py).
    ``fuse_merge``: merge the attention partials inside the O-projection (``oproj_merge``) instead of
    ``attn_merge`` + ``gemv_residual``; measured slower on the H200, so off by default (docs/DESIGN.md).
    ``residual``: False makes o_proj and down add zeros (``residual.zero``) in place of the residual stream
    (their output is then a partial sum a tensor-parallel all-reduce completes; see the module doc).
    ``gemv``: "fma" (CUDA cores, ops/gemv_rows.py) or "mma" (tensor cores, ops/gemv_mma.py) for every GEMV op;
    None takes ``default_gemv(cfg, dtype)``. Recorded in ``graph.meta["gemv"]``.
    ``tp``: (rank, n ranks): with n > 1, the all-reduce ops of the module doc (``residual`` is then ignored: the
    all-reduces add the residual); ``cfg`` is the rank's local config (every rank's the same shapes). Recorded in
    ``graph.meta["tp"]``. ``ar_tiles`` (TP > 1): tiles per all-reduce op (D / ar_tiles columns each: a power of two in
    4..1024); None: ``tiling``'s rule (as every op: at most one tile per worker).

    Returns ``(graph, weight_sources, cache_sources)``: buffer name -> ``WeightSource`` / ``f(cache)`` giving
    the tensor a weight buffer / a caller-owned cache buffer is bound to (``build_decode_step`` applies them). The
    graph's ``io`` meta names the tokens input and the logits / next_tokens outputs. Raises
    UnsupportedModelError for an unsupported head_dim / hidden size / dtype, InputError for a bad batch or an
    unknown gemv path."""
    check_supported(cfg, batch, max_seq_len, dtype)
    rank, n_ranks = tp if tp is not None else (0, 1)
    if not (isinstance(n_ranks, int) and 1 <= n_ranks <= MAX_RANKS and isinstance(rank, int) and 0 <= rank < n_ranks):
        raise InputError(f"tp must be (rank, n) with 1 <= n <= {MAX_RANKS} and 0 <= rank < n, got {tp!r}")
    if n_ranks > 1:
        residual = False
    ar_block = None
    if ar_tiles is not None:
        D0 = cfg.dim
        ok = isinstance(ar_tiles, int) and ar_tiles > 0 and D0 % ar_tiles == 0
        ar_block = D0 // ar_tiles if ok else 0
        if n_ranks == 1 or not ok or ar_block & (ar_block - 1) or not 4 <= ar_block <= 1024:
            raise InputError(f"ar_tiles={ar_tiles!r}: all-reduce tiles exist at tp > 1 only, and must split the "
                             f"hidden size {D0} into power-of-two tiles of 4..1024 columns")
    gemv = default_gemv(cfg, dtype) if gemv is None else gemv
    if gemv not in GEMV_PATHS:
        raise InputError(f"unknown gemv path {gemv!r}; choose one of {', '.join(GEMV_PATHS)} (CUDA cores or tensor "
                         "cores), or None for the model's default")
    B, S, D, F, V, L = batch, max_seq_len, cfg.dim, cfg.ffn_dim, cfg.vocab_size, cfg.n_layers
    HQ, HKV, HD = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    g = Graph()
    g.meta.update(model=cfg.name, batch=B, max_seq_len=S, dtype=dtype, tiling=tiling, fuse_merge=bool(fuse_merge),
                  gemv=gemv, tp=(rank, n_ranks))
    wsrc: dict = {}
    csrc: dict = {}

    def weight(name, shape, parts=None):
        wsrc[name] = WeightSource(parts or (name,))
        return g.add_buffer(name, shape, dtype, "weight")

    def cached(name, shape, kind, get):
        csrc[name] = get
        return g.add_buffer(name, shape, dtype if kind == "kv" else torch.int32, kind)

    tokens = g.add_buffer("tokens", (B,), torch.int32, "input")
    seq_lens = cached("seq_lens", (B,), "input", lambda c: c.seq_lens)
    inv_freq = g.add_buffer("rope_inv_freq", (HD // 2,), torch.float32, "weight")
    wsrc[inv_freq.name] = WeightSource(compute=lambda: rope_inv_freq(cfg))
    def reduce(name, partial, stream=None):  # TP > 1: the all-reduce of a partial (adding the residual stream)
        if n_ranks == 1:
            return partial
        parts = [partial if p == rank else add_peer_buffer(g, partial, p) for p in range(n_ranks)]
        return add_allreduce(g, f"{name}.ar", parts, residual=stream, tiling=tiling, block_d=ar_block)

    x = reduce("embed", add_embed(g, "embed", tokens, weight("tok_embeddings", (V, D))))
    zero = None
    if not residual:
        zero = g.add_buffer("residual.zero", (B, D), dtype, "weight")
        wsrc[zero.name] = WeightSource(compute=lambda: torch.zeros(B, D))

    def res(stream):  # what o_proj and down add: the residual stream, or the zero buffer
        return stream if zero is None else zero
    for i in range(L):
        p = f"layers.{i}."
        k_cache = cached(p + "k_cache", (B, HKV, S, HD), "kv", lambda c, i=i: c.k[i])
        v_cache = cached(p + "v_cache", (B, HKV, S, HD), "kv", lambda c, i=i: c.v[i])
        attn_norm = weight(p + "attn_norm", (D,))
        qn, kn = (weight(p + "q_norm", (HD,)), weight(p + "k_norm", (HD,))) if cfg.qk_norm else (None, None)
        q = add_qkv_rope(g, f"qkv_rope.{i}", x, attn_norm, weight(p + "wqkv", ((HQ + 2 * HKV) * HD, D),
                                                                    (p + "wq", p + "wk", p + "wv")),
                         inv_freq, seq_lens, k_cache, v_cache, eps=cfg.norm_eps, qn=qn, kn=kn, tiling=tiling,
                         gemv=gemv)
        o_part, lse_part = add_attn_partial(g, f"attn_partial.{i}", q, k_cache, v_cache, seq_lens,
                                            n_sm=tiling.n_sm)
        wo = weight(p + "wo", (D, HQ * HD))
        if fuse_merge:
            h = add_oproj_merge(g, f"o_proj.{i}", o_part, lse_part, wo, res(x), tiling=tiling, gemv=gemv)
        else:
            attn = add_attn_merge(g, f"attn_merge.{i}", o_part, lse_part, dtype)
            h = add_gemv_residual(g, f"o_proj.{i}", attn, wo, res(x), tiling=tiling, gemv=gemv)
        h = reduce(f"o_proj.{i}", h, x)
        act = add_gate_up(g, f"gate_up.{i}", h, weight(p + "ffn_norm", (D,)),
                          weight(p + "w_gate_up", (2 * F, D), (p + "w_gate", p + "w_up")), eps=cfg.norm_eps,
                          tiling=tiling, gemv=gemv)
        x = add_gemv_residual(g, f"down.{i}", act, weight(p + "w_down", (D, F)), res(h), tiling=tiling, gemv=gemv)
        x = reduce(f"down.{i}", x, h)
    logits, next_tokens = add_lm_head(g, "lm_head", x, weight("norm", (D,)), weight("lm_head", (V, D)),
                                      eps=cfg.norm_eps, tiling=tiling, gemv=gemv)
    g.meta["io"] = {"tokens": tokens.name, "logits": logits.name, "next_tokens": next_tokens.name}
    return g, wsrc, csrc


def _poisoned(shape, dtype, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -1, dtype=dtype, device=device)


def build_decode_step(cfg, weights: dict, cache, *, tiling: Tiling = Tiling(),
                      fuse_merge: bool = False, residual: bool = True, gemv: str | None = None,
                      tp: tuple[int, int] | None = None, ar_tiles: int | None = None) -> BoundStep:
    """The decode step of ``cfg`` bound to ``weights`` and ``cache``: what ``onekernel.exec.make_runner`` takes.

    weights: canonical name -> tensor (docs/DESIGN.md), cast to the cache's dtype and device if needed; the
    fused ``wqkv``/``w_gate_up`` are concatenated here, once. cache: a KV cache (``k``, ``v`` [L, B, Hkv, S, hd],
    ``seq_lens`` int32 [B]; runtime.kv_cache.KVCache) whose batch, length, dtype and device set the graph's.
    ``tokens`` is zeroed; activations, outputs and scratch are poisoned (NaN, or -1 for integers) so a missed
    write shows (peer buffers too: the tensor-parallel runner binds them to the peers' memory). tiling,
    fuse_merge, residual, gemv, tp, ar_tiles: as ``decode_graph``. Raises InputError (a missing weight, a
    cache or weight of the wrong shape, an unknown gemv path), UnsupportedModelError (see ``check_supported``)."""
    if not isinstance(tiling, Tiling):
        raise InputError(f"tiling must be an ops.tiling.Tiling (e.g. Tiling(132, 'fit')), got {tiling!r:.40}")
    L, B, HKV, S, HD = cache.k.shape
    if (L, HKV, HD) != (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim):
        raise InputError(f"KV cache {tuple(cache.k.shape)} does not match {cfg.name} ({cfg.n_layers} layers, "
                         f"{cfg.n_kv_heads} KV heads of {cfg.head_dim}); build the cache from the same config")
    g, wsrc, csrc = decode_graph(cfg, B, S, cache.k.dtype, tiling=tiling, fuse_merge=fuse_merge,
                                 residual=residual, gemv=gemv, tp=tp, ar_tiles=ar_tiles)
    dev = cache.k.device
    tensors = {name: src.tensor(weights).to(device=dev, dtype=g.buffers[name].dtype).contiguous()
               for name, src in wsrc.items()}
    tensors.update({name: f(cache) for name, f in csrc.items()})
    io = g.meta["io"]
    for name, buf in g.buffers.items():
        if name == io["tokens"]:
            tensors[name] = torch.zeros(buf.shape, dtype=buf.dtype, device=dev)
        elif name not in tensors:
            tensors[name] = _poisoned(buf.shape, buf.dtype, dev)
        t = tensors[name]
        if tuple(t.shape) != buf.shape or t.dtype != buf.dtype:
            raise InputError(f"buffer {name!r}: got {tuple(t.shape)} {t.dtype}, the graph expects {buf.shape} "
                             f"{buf.dtype}")
    return BoundStep(g, tensors, io["tokens"], io["logits"], io["next_tokens"],
                     external=lambda: {name: f(cache) for name, f in csrc.items()},
                     external_key=lambda: (cache.k.data_ptr(), cache.v.data_ptr(), cache.seq_lens.data_ptr()))
