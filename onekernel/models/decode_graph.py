"""A model config -> the task graph of one decode step; binding its buffers to tensors; the graph reference.

Program order (layer i = 0..L-1), buffers in docs/DESIGN.md / the op files:
    embed                      tokens, tok_embeddings -> x.0
    qkv_rope.{i}               x.{i}, attn_norm, wqkv, rope_inv_freq, seq_lens -> q.{i}, k/v cache row seq_lens[b]
    attn_partial.{i}           (ops/attention.py)  q.{i}, k/v cache -> attn_o.{i}, attn_lse.{i} (split-KV partials)
    then either (``fuse_merge=True``; measured slower, off by default: docs/DESIGN.md)
    o_proj.{i}  oproj_merge    h.{i}   = x.{i} + merge(attn_o.{i}, attn_lse.{i}) @ wo^T   (ops/oproj_merge.py)
    or (separate)
    attn_merge.{i}             attn.{i} = merge(attn_o.{i}, attn_lse.{i})
    o_proj.{i}  gemv_residual  h.{i}   = x.{i} + attn.{i} @ wo^T
    gate_up.{i}                act.{i} = silu(norm(h.{i}) Wg^T) * (norm(h.{i}) Wu^T)
    down.{i}    gemv_residual  x.{i+1} = h.{i} + act.{i} @ w_down^T
    lm_head, argmax            x.{L}, norm, lm_head -> logits fp32 [B, V], next_tokens int32 [B]
Fused weights (made once by :func:`bind`): ``layers.{i}.wqkv`` = cat(wq, wk, wv) [(Hq+2Hkv)hd, D],
``layers.{i}.w_gate_up`` = cat(w_gate, w_up) [2F, D].
"""
from __future__ import annotations

import torch

from onekernel.errors import InputError, UnsupportedModelError
from onekernel.graph.ir import Graph
from onekernel.ops.base import OP_KINDS
from onekernel.ops.embed import add_embed
from onekernel.ops.gemv import add_gate_up, add_gemv_residual
from onekernel.ops.lm_head import add_lm_head
from onekernel.ops.qkv import add_qkv_rope
from onekernel.ops.tiling import MAX_BATCH

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FUSED = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}


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


def build_decode_graph(cfg, batch: int, max_seq_len: int, dtype: torch.dtype = torch.bfloat16,
                       n_sm: int = 132, fuse_merge: bool = False) -> Graph:
    """The decode-step Graph of ``cfg`` for ``batch`` sequences, a KV cache of ``max_seq_len`` positions
    and model dtype ``dtype``; ``n_sm`` (SMs of the target GPU) sizes the tiles. ``fuse_merge``: merge the
    attention partials inside the O-projection (``oproj_merge``) instead of ``attn_merge`` + ``gemv_residual``;
    measured slower on the H200, so off by default (docs/DESIGN.md); recorded in ``meta``. Raises
    UnsupportedModelError for an unsupported head_dim / hidden size / dtype, InputError for a bad batch."""
    from onekernel.ops.attention import add_attention  # the attention family registers its kinds here
    from onekernel.ops.oproj_merge import add_oproj_merge

    check_supported(cfg, batch, max_seq_len, dtype)
    fuse = bool(fuse_merge)
    B, S, D, F, V, L = batch, max_seq_len, cfg.dim, cfg.ffn_dim, cfg.vocab_size, cfg.n_layers
    HQ, HKV, HD = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    g = Graph()
    g.meta.update(cfg=cfg, batch=B, max_seq_len=S, dtype=dtype, n_sm=n_sm, fuse_merge=fuse)
    g.add_buffer("tokens", (B,), torch.int32, "input")
    g.add_buffer("seq_lens", (B,), torch.int32, "input")
    g.add_buffer("rope_inv_freq", (HD // 2,), torch.float32, "weight")
    g.add_buffer("tok_embeddings", (V, D), dtype, "weight")
    g.add_buffer("norm", (D,), dtype, "weight")
    g.add_buffer("lm_head", (V, D), dtype, "weight")
    for i in range(L):
        p = f"layers.{i}."
        g.add_buffer(p + "attn_norm", (D,), dtype, "weight")
        g.add_buffer(p + "wqkv", ((HQ + 2 * HKV) * HD, D), dtype, "weight")
        if cfg.qk_norm:
            g.add_buffer(p + "q_norm", (HD,), dtype, "weight")
            g.add_buffer(p + "k_norm", (HD,), dtype, "weight")
        g.add_buffer(p + "wo", (D, HQ * HD), dtype, "weight")
        g.add_buffer(p + "ffn_norm", (D,), dtype, "weight")
        g.add_buffer(p + "w_gate_up", (2 * F, D), dtype, "weight")
        g.add_buffer(p + "w_down", (D, F), dtype, "weight")
        g.add_buffer(p + "k_cache", (B, HKV, S, HD), dtype, "kv")
        g.add_buffer(p + "v_cache", (B, HKV, S, HD), dtype, "kv")
    for i in range(L + 1):
        g.add_buffer(f"x.{i}", (B, D), dtype, "activation")
    for i in range(L):
        g.add_buffer(f"q.{i}", (B, HQ, HD), dtype, "activation")
        if not fuse:
            g.add_buffer(f"attn.{i}", (B, HQ * HD), dtype, "activation")
        g.add_buffer(f"h.{i}", (B, D), dtype, "activation")
        g.add_buffer(f"act.{i}", (B, F), dtype, "activation")
    g.add_buffer("logits", (B, V), torch.float32, "output")
    g.add_buffer("next_tokens", (B,), torch.int32, "output")

    add_embed(g, "embed", "tokens", "tok_embeddings", "x.0")
    for i in range(L):
        p = f"layers.{i}."
        qn, kn = (p + "q_norm", p + "k_norm") if cfg.qk_norm else (p + "attn_norm", p + "attn_norm")
        add_qkv_rope(g, f"qkv_rope.{i}", x=f"x.{i}", nw=p + "attn_norm", w=p + "wqkv", inv_freq="rope_inv_freq",
                     seq_lens="seq_lens", qn=qn, kn=kn, q=f"q.{i}", k_cache=p + "k_cache", v_cache=p + "v_cache",
                     eps=cfg.norm_eps, qk_norm=cfg.qk_norm, n_sm=n_sm)
        add_attention(g, cfg, i, B, S, dtype, merge=not fuse)
        if fuse:
            add_oproj_merge(g, f"o_proj.{i}", f"attn_o.{i}", f"attn_lse.{i}", p + "wo", f"x.{i}", f"h.{i}", n_sm)
        else:
            add_gemv_residual(g, f"o_proj.{i}", f"attn.{i}", p + "wo", f"x.{i}", f"h.{i}", n_sm)
        add_gate_up(g, f"gate_up.{i}", f"h.{i}", p + "ffn_norm", p + "w_gate_up", f"act.{i}", cfg.norm_eps, n_sm)
        add_gemv_residual(g, f"down.{i}", f"act.{i}", p + "w_down", f"h.{i}", f"x.{i + 1}", n_sm)
    add_lm_head(g, f"x.{L}", "norm", "lm_head", "logits", "next_tokens", cfg.norm_eps, n_sm)
    return g


def _poisoned(shape, dtype, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -1, dtype=dtype, device=device)


def bind(graph: Graph, weights: dict, cache, device=None) -> dict[str, torch.Tensor]:
    """Every buffer name of ``graph`` -> a tensor on ``device`` (default: the cache's device).

    weights: canonical name -> tensor (docs/DESIGN.md); cast to the model dtype if needed; the fused
    ``wqkv``/``w_gate_up`` are concatenated here, once. ``rope_inv_freq`` from the config. cache: a KVCache
    (its ``k[i]``/``v[i]`` views become ``layers.{i}.k_cache``/``v_cache``, its ``seq_lens`` the
    ``seq_lens`` input). ``tokens`` is zeroed; activations, outputs and scratch are poisoned (NaN, or -1
    for integers) so a missed write shows. Raises InputError when the cache does not match the graph.
    """
    from onekernel.models.config import rope_inv_freq

    m = graph.meta
    cfg, dtype = m["cfg"], m["dtype"]
    device = torch.device(device) if device is not None else cache.k.device
    if device.type == cache.k.device.type and device.index is None:
        device = cache.k.device
    want = (cfg.n_layers, m["batch"], cfg.n_kv_heads, m["max_seq_len"], cfg.head_dim)
    if tuple(cache.k.shape) != want or cache.k.dtype != dtype or cache.k.device != device:
        raise InputError(f"KV cache {tuple(cache.k.shape)} {cache.k.dtype} on {cache.k.device} does not match "
                         f"the graph ({want}, {dtype}, {device}); build the cache from the same config/batch")
    out: dict[str, torch.Tensor] = {}

    def w(name):
        if name not in weights:
            raise InputError(f"weight {name!r} is missing from the weight dict")
        return weights[name].to(device=device, dtype=dtype).contiguous()

    for name, buf in graph.buffers.items():
        leaf = name.rsplit(".", 1)[-1]
        if name == "rope_inv_freq":
            t = rope_inv_freq(cfg).to(device)
        elif buf.kind == "weight" and leaf in FUSED:
            pre = name[: -len(leaf)]
            t = torch.cat([w(pre + part) for part in FUSED[leaf]], dim=0)
        elif buf.kind == "weight":
            t = w(name)
        elif buf.kind == "kv":
            i = int(name.split(".")[1])
            t = (cache.k if leaf == "k_cache" else cache.v)[i]
        elif name == "seq_lens":
            t = cache.seq_lens
        elif name == "tokens":
            t = torch.zeros(buf.shape, dtype=buf.dtype, device=device)
        else:
            t = _poisoned(buf.shape, buf.dtype, device)
        if tuple(t.shape) != buf.shape or t.dtype != buf.dtype:
            raise InputError(f"buffer {name!r}: got {tuple(t.shape)} {t.dtype}, graph expects {buf.shape} "
                             f"{buf.dtype}")
        out[name] = t
    return out


@torch.no_grad()
def run_reference(graph: Graph, tensors: dict[str, torch.Tensor]) -> None:
    """Run every op's PyTorch reference in program order (the "graph reference"); writes into ``tensors``."""
    for op in graph.ops:
        OP_KINDS[op.kind].reference(op, tensors)
