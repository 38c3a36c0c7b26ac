"""PyTorch reference decoder: the numerics every executor is tested against.

Plain functions in the gpt-fast style over the canonical weight dict of docs/DESIGN.md. The math follows
HF transformers' ``modeling_llama.py`` / ``modeling_qwen3.py`` op for op so greedy tokens agree with HF:

    x = embed[tokens]                                   (model dtype; residual stream stays in it)
    per layer:  h = rmsnorm(x) ; q,k,v = h Wq^T, h Wk^T, h Wv^T
                (Qwen3) q,k = rmsnorm_per_head(q), rmsnorm_per_head(k)
                q,k = rope(q), rope(k)        cos/sin from rope_inv_freq(cfg) in fp32, cast to model dtype
                x = x + sdpa(q, repeat_interleave(k), repeat_interleave(v)) Wo^T
                h = rmsnorm(x) ; x = x + (silu(h Wg^T) * (h Wu^T)) Wd^T
    logits = (rmsnorm(x) lm_head^T).float()
    rmsnorm(x) = w * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)   (HF LlamaRMSNorm)

``prefill`` and ``decode_one_token`` take an optional ``tp``: a tensor-parallel rank's collectives
(``onekernel.dist.tp_reference.TPGroup``: ``embed(tokens, table)`` and ``all_reduce(x)``). Over a rank's shard
(a config with its local heads, FFN rows and vocabulary range, ``onekernel.dist.sharding``) the same code is then
Megatron's tensor-parallel decoder: the embedding and the outputs of the O-projection and of down are summed
over the ranks, and the logits are the rank's vocabulary range. ``tp=None`` is the plain decoder.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onekernel.errors import InputError
from onekernel.models.config import rope_inv_freq

# The CPU flash-attention kernel reduces the keys in blocks of 512 (``kv_split_size``), and a block of masked keys
# adds exact zeros: attention over the first multiple of KEY_BLOCK keys that holds every live one is bitwise the
# attention over the whole cache (tested: tests/test_serve_engine.py). The CPU reference step uses it.
KEY_BLOCK = 512


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm over the last dim: normalise in fp32, cast back to x.dtype, then multiply by weight."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rope_cos_sin(cfg, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [B, T, head_dim] in ``dtype`` for integer ``positions`` [B, T] (HF LlamaRotaryEmbedding)."""
    inv_freq = rope_inv_freq(cfg).to(device=positions.device, dtype=torch.float32)
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved ("rotate_half") RoPE. x: [B, H, T, hd]; cos, sin: [B, T, hd]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _qkv(cfg, w: dict, i: int, h: torch.Tensor, cos, sin):
    """Project, (Qwen3) per-head norm, RoPE. h: [B, T, D] -> q [B, Hq, T, hd], k, v [B, Hkv, T, hd]."""
    B, T, _ = h.shape
    p = f"layers.{i}."
    q = F.linear(h, w[p + "wq"]).view(B, T, cfg.n_heads, cfg.head_dim)
    k = F.linear(h, w[p + "wk"]).view(B, T, cfg.n_kv_heads, cfg.head_dim)
    v = F.linear(h, w[p + "wv"]).view(B, T, cfg.n_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, w[p + "q_norm"], cfg.norm_eps)
        k = rms_norm(k, w[p + "k_norm"], cfg.norm_eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _keys(kv: torch.Tensor, S: int) -> torch.Tensor:
    """The first S positions of one layer's K or V cache [B, Hkv, cap, hd]; past the cache's capacity, zero rows
    (masked, so they add exact zeros): attention over a whole KEY_BLOCK whatever the cache's capacity."""
    cap = kv.shape[2]
    return kv[:, :, :S] if S <= cap else F.pad(kv, (0, 0, 0, S - cap))


def _attend(cfg, q, k, v, mask) -> torch.Tensor:
    """SDPA with GQA by repeat_interleave of the KV heads on a GPU; on the CPU by SDPA's own ``enable_gqa`` (the
    same bits, without copying the cache: 12x faster at 2048 keys). mask: bool, True = may attend.
    -> [B, T, Hq*hd]."""
    rep = cfg.n_heads // cfg.n_kv_heads
    if rep > 1 and q.is_cuda:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=cfg.head_dim ** -0.5,
                                       enable_gqa=rep > 1 and not q.is_cuda)
    B, _, T, _ = q.shape
    return o.transpose(1, 2).reshape(B, T, cfg.n_heads * cfg.head_dim)


def _mlp(w: dict, i: int, h: torch.Tensor) -> torch.Tensor:
    p = f"layers.{i}."
    return F.linear(F.silu(F.linear(h, w[p + "w_gate"])) * F.linear(h, w[p + "w_up"]), w[p + "w_down"])


def _embed(tp, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.embedding(tokens, table) if tp is None else tp.embed(tokens, table)


def _reduce(tp, x: torch.Tensor) -> torch.Tensor:
    return x if tp is None else tp.all_reduce(x)


@torch.no_grad()
def prefill(model, cache, prompts: list[list[int]], tp=None) -> torch.Tensor:
    """One batched forward pass over right-padded prompts; fills the cache and returns next-token logits.

    Args:
        model: LoadedModel (config, weights).
        cache: KVCache with batch == len(prompts) and max_seq_len >= the longest prompt.
        prompts: B lists of token ids, lengths L_b >= 1, may differ.
        tp: None, or a tensor-parallel rank's collectives (module docstring); then ``model`` is the rank's shard.
    Returns:
        logits float32 [B, V] at position L_b - 1 of each prompt (with ``tp``: the rank's vocabulary range).
    Side effects: K/V of positions 0..T-1 written (padding positions hold junk that decode overwrites before
    it is ever read), ``cache.seq_lens[b] = L_b``.
    Raises:
        InputError: batch mismatch, an empty prompt, or a prompt longer than the cache.
    """
    cfg, w = model.config, model.weights
    B = len(prompts)
    lens = [len(p) for p in prompts]
    if B != cache.batch:
        raise InputError(f"prefill got {B} prompts for a KV cache of batch {cache.batch}")
    if min(lens) < 1:
        raise InputError("an empty prompt was given; every prompt needs at least one token")
    T = max(lens)
    if T > cache.max_seq_len:
        raise InputError(f"a prompt of {T} tokens does not fit the KV cache of {cache.max_seq_len} positions")
    dev = cache.k.device
    tokens = torch.zeros(B, T, dtype=torch.long, device=dev)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(p, dtype=torch.long)
    lens_t = torch.tensor(lens, dtype=torch.long, device=dev)
    pos = torch.arange(T, device=dev)
    # causal and key inside the prompt: [B, 1, T, T]; padded query rows still see key 0, so no NaN
    mask = (pos[None, :] <= pos[:, None])[None] & (pos[None, None, :] < lens_t[:, None, None])
    mask = mask[:, None]
    cos, sin = rope_cos_sin(cfg, pos[None].expand(B, T), cache.dtype)

    x = _embed(tp, tokens, w["tok_embeddings"])
    for i in range(cfg.n_layers):
        q, k, v = _qkv(cfg, w, i, rms_norm(x, w[f"layers.{i}.attn_norm"], cfg.norm_eps), cos, sin)
        cache.k[i, :, :, :T] = k
        cache.v[i, :, :, :T] = v
        x = x + _reduce(tp, F.linear(_attend(cfg, q, k, v, mask), w[f"layers.{i}.wo"]))
        x = x + _reduce(tp, _mlp(w, i, rms_norm(x, w[f"layers.{i}.ffn_norm"], cfg.norm_eps)))
    cache.seq_lens.copy_(lens_t.to(torch.int32))
    x = x[torch.arange(B, device=dev), lens_t - 1]
    return F.linear(rms_norm(x, w["norm"], cfg.norm_eps), w["lm_head"]).float()


def decode_one_token(cfg, w: dict, k_all: torch.Tensor, v_all: torch.Tensor, seq_lens: torch.Tensor,
                     tokens: torch.Tensor, inv_freq: torch.Tensor, tp=None, keys: int | None = None) -> torch.Tensor:
    """One decode step with static shapes (gpt-fast's ``decode_one_token``): no host sync, so it can be
    captured in a CUDA graph or compiled; the reference mode and the PyTorch baselines all run it.

    Args:
        cfg: ModelConfig; w: canonical weight dict (docs/DESIGN.md).
        k_all, v_all: the KV cache [L, B, Hkv, S, hd] (model dtype); seq_lens: int32 [B], the position of each
            sequence's token (< S; not checked here: no host sync); tokens: int32 or int64 [B].
        inv_freq: float32 [hd / 2], ``config.rope_inv_freq(cfg)`` on the cache's device.
        tp: None, or a tensor-parallel rank's collectives (module docstring); then ``cfg``, ``w`` and the cache
            are the rank's shard.
        keys: None (static: all S positions), or attend over the first ``keys`` positions only (a host int
            > every seq_lens[b]; the CPU runners pass ``cpu_keys``: a multiple of KEY_BLOCK, zero rows past the
            cache's capacity, so that a sequence's bits do not depend on the capacity: a 53-position cache's
            attention rounded otherwise than a 39-position one's, and SmolLM2-135M's greedy tokens in bf16 changed
            with max_new_tokens at a one-ulp tie).
    Returns:
        logits float32 [B, V] (with ``tp``: the rank's vocabulary range). Writes K/V at position seq_lens[b]
        and attends over the first S (or ``keys``) positions with a device-side mask (keys 0..seq_lens[b]). Does NOT increment
        seq_lens (the generation loop does).
        Call it under ``torch.no_grad()`` (the runners do; torch.compile traces it as is).
    """
    dev, B, S = k_all.device, k_all.shape[1], keys or k_all.shape[3]
    pos = seq_lens.long()
    bidx = torch.arange(B, device=dev)
    layer_idx = torch.arange(cfg.n_layers, device=dev)[:, None].expand(-1, B)  # one launch, not one per layer
    mask = (torch.arange(S, device=dev)[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, S]
    freqs = pos[:, None, None].float() * inv_freq  # rope_cos_sin with a precomputed table
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(k_all.dtype), emb.sin().to(k_all.dtype)
    x = _embed(tp, tokens.long()[:, None], w["tok_embeddings"])  # [B, 1, D]
    for i in range(cfg.n_layers):
        q, k, v = _qkv(cfg, w, i, rms_norm(x, w[f"layers.{i}.attn_norm"], cfg.norm_eps), cos, sin)
        # one index_put_ on the whole cache tensor (a tensor layer index, not a view of layer i): Inductor
        # then updates the cache in place; through a view it copied the whole cache every step
        k_all[layer_idx[i], bidx, :, pos] = k[:, :, 0]
        v_all[layer_idx[i], bidx, :, pos] = v[:, :, 0]
        o = _attend(cfg, q, _keys(k_all[i], S), _keys(v_all[i], S), mask)
        x = x + _reduce(tp, F.linear(o, w[f"layers.{i}.wo"]))
        x = x + _reduce(tp, _mlp(w, i, rms_norm(x, w[f"layers.{i}.ffn_norm"], cfg.norm_eps)))
    return F.linear(rms_norm(x[:, 0], w["norm"], cfg.norm_eps), w["lm_head"]).float()


def cpu_keys(cache, longest: int) -> int | None:
    """The ``keys`` a decode step over ``cache`` passes to decode_one_token: on the CPU the live positions
    (``longest`` = the largest seq_lens) rounded up to KEY_BLOCK, zero rows past the cache's capacity, so that a
    sequence's bits depend neither on the capacity nor on its batch-mates' lengths within a block; None on a GPU
    (the whole cache, as the captured baselines)."""
    return None if cache.k.is_cuda else -(-(longest + 1) // KEY_BLOCK) * KEY_BLOCK


class ReferenceRunner:
    """StepRunner over the reference decoder: ``step(tokens int32 [B]) -> (logits fp32 [B, V], next int32 [B])``
    where next is the greedy argmax; ``check()`` and ``poll()`` are no-ops (nothing runs on the device
    unchecked). Uses the same KVCache tensors every executor uses. Raises InputError when a sequence would decode
    past the cache. On the CPU a step attends over the live keys rounded up to KEY_BLOCK, not the whole cache
    (the same bits, at a cost that follows the longest live sequence, not ``max_seq_len``: docs/DESIGN.md); on a
    GPU over the whole cache, as the captured baselines do."""

    mode = "reference"

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.inv_freq = rope_inv_freq(model.config).to(device=cache.k.device, dtype=torch.float32)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        return prefill(self.model, self.cache, prompts)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cache
        longest = int(c.seq_lens.max())
        if longest >= c.max_seq_len:
            raise InputError(f"decode past the end of the KV cache ({c.max_seq_len} positions)")
        logits = decode_one_token(self.model.config, self.model.weights, c.k, c.v, c.seq_lens, tokens,
                                  self.inv_freq, keys=cpu_keys(c, longest))
        return logits, logits.argmax(dim=-1).to(torch.int32)

    def check(self) -> None:
        """Nothing to check: the reference raises its errors at once."""

    poll = check
