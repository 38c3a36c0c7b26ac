"""PyTorch baselines the benchmarks compare against: eager PyTorch and PyTorch + CUDA graph.

``static_decode_step`` is the reference decode step (``runtime.reference``: same math, same kernels) with the
attention span fixed to the whole cache and masked on the device, so it never syncs with the host and can
be captured into a CUDA graph (gpt-fast's approach).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onekernel.models.config import rope_inv_freq
from onekernel.runtime.reference import _attend, _logits, _mlp, _qkv, rms_norm

_INV_FREQ: dict = {}


def _cos_sin(cfg, pos: torch.Tensor, dtype):
    """``runtime.reference.rope_cos_sin`` with the inverse frequencies cached on the device (a host-to-device
    copy inside the step could not be captured). pos: int64 [B, 1] -> cos, sin [B, 1, hd] in ``dtype``."""
    key = (cfg.name, cfg.head_dim, cfg.rope_theta, pos.device)
    if key not in _INV_FREQ:
        _INV_FREQ[key] = rope_inv_freq(cfg).to(device=pos.device, dtype=torch.float32)
    freqs = pos[..., None].float() * _INV_FREQ[key]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@torch.no_grad()
def static_decode_step(model, cache, tokens: torch.Tensor) -> torch.Tensor:
    """tokens int32 [B] -> logits float32 [B, V]; attends over all S cache slots with a device-side mask."""
    cfg, w = model.config, model.weights
    dev = cache.k.device
    pos = cache.seq_lens.long()
    bidx = torch.arange(cache.batch, device=dev)
    mask = (torch.arange(cache.max_seq_len, device=dev)[None, :] <= pos[:, None])[:, None, None, :]
    cos, sin = _cos_sin(cfg, pos[:, None], cache.dtype)
    x = F.embedding(tokens.long()[:, None], w["tok_embeddings"])
    for i in range(cfg.n_layers):
        q, k, v = _qkv(cfg, w, i, rms_norm(x, w[f"layers.{i}.attn_norm"], cfg.norm_eps), cos, sin)
        cache.k[i, bidx, :, pos] = k[:, :, 0]
        cache.v[i, bidx, :, pos] = v[:, :, 0]
        x = x + F.linear(_attend(cfg, q, cache.k[i], cache.v[i], mask), w[f"layers.{i}.wo"])
        x = x + _mlp(w, i, rms_norm(x, w[f"layers.{i}.ffn_norm"], cfg.norm_eps))
    return _logits(model, x[:, 0])


class TorchGraphRunner:
    """PyTorch + CUDA graph: ``static_decode_step`` captured once, replayed every step."""

    mode = "torch+graph"

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.tokens = torch.zeros(cache.batch, dtype=torch.int32, device=cache.k.device)
        self.graph = None

    def step(self, tokens):
        self.tokens.copy_(tokens)
        if self.graph is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    static_decode_step(self.model, self.cache, self.tokens)
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = static_decode_step(self.model, self.cache, self.tokens)
                self.next = self.logits.argmax(-1).to(torch.int32)
        self.graph.replay()
        return self.logits, self.next
