"""PyTorch baselines the benchmarks compare against: eager PyTorch, PyTorch + CUDA graph, and torch.compile
with CUDA graphs (``mode="reduce-overhead"``).

``static_decode_step`` is the reference decode step (``runtime.reference``: same math, same kernels) with the
attention span fixed to the whole cache and masked on the device, so it never syncs with the host and can
be captured into a CUDA graph (gpt-fast's approach). ``StaticDecoder`` is the same math as an ``nn.Module``
whose weights, KV cache, tokens and seq_lens are registered buffers marked as static addresses (gpt-fast's
layout), so torch.compile's CUDA graphs are not skipped for mutating inputs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onekernel.models.config import rope_inv_freq
from onekernel.runtime.reference import _attend, _mlp, _qkv, rms_norm

_INV_FREQ: dict = {}


def _step_math(cfg, w: dict, k_all, v_all, seq_lens, tokens, inv_freq) -> torch.Tensor:
    """The static decode step over explicit tensors (shared by ``static_decode_step`` and the torch.compile
    module): k_all, v_all [L, B, Hkv, S, hd]; seq_lens, tokens int32 [B]; inv_freq fp32 [hd / 2]."""
    dev, B, S = k_all.device, k_all.shape[1], k_all.shape[3]
    pos = seq_lens.long()
    bidx = torch.arange(B, device=dev)
    layer_idx = torch.arange(cfg.n_layers, device=dev)[:, None].expand(-1, B)  # one launch, not one per layer
    mask = (torch.arange(S, device=dev)[None, :] <= pos[:, None])[:, None, None, :]
    freqs = pos[:, None, None].float() * inv_freq  # runtime.reference.rope_cos_sin with a cached table
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(k_all.dtype), emb.sin().to(k_all.dtype)
    x = F.embedding(tokens.long()[:, None], w["tok_embeddings"])
    for i in range(cfg.n_layers):
        q, k, v = _qkv(cfg, w, i, rms_norm(x, w[f"layers.{i}.attn_norm"], cfg.norm_eps), cos, sin)
        # one index_put_ on the whole cache tensor (a tensor layer index, not a view of layer i): Inductor
        # then updates the cache in place; through a view it copied the whole cache every step
        k_all[layer_idx[i], bidx, :, pos] = k[:, :, 0]
        v_all[layer_idx[i], bidx, :, pos] = v[:, :, 0]
        x = x + F.linear(_attend(cfg, q, k_all[i], v_all[i], mask), w[f"layers.{i}.wo"])
        x = x + _mlp(w, i, rms_norm(x, w[f"layers.{i}.ffn_norm"], cfg.norm_eps))
    # runtime.reference._logits
    return F.linear(rms_norm(x[:, 0], w["norm"], cfg.norm_eps), w["lm_head"]).float()


@torch.no_grad()
def static_decode_step(model, cache, tokens: torch.Tensor) -> torch.Tensor:
    """tokens int32 [B] -> logits float32 [B, V]; attends over all S cache slots with a device-side mask."""
    cfg = model.config
    key = (cfg.name, cfg.head_dim, cfg.rope_theta, cache.k.device)
    if key not in _INV_FREQ:
        _INV_FREQ[key] = rope_inv_freq(cfg).to(device=cache.k.device, dtype=torch.float32)
    return _step_math(cfg, model.weights, cache.k, cache.v, cache.seq_lens, tokens, _INV_FREQ[key])


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


class StaticDecoder(torch.nn.Module):
    """``static_decode_step`` as a module without inputs: weights, the KV cache (the caller's ``cache.k/v``,
    aliased, not copied), ``seq_lens`` (aliased) and a static ``tokens`` buffer are registered buffers.
    ``forward() -> (logits float32 [B, V], next_tokens int32 [B])``."""

    def __init__(self, model, cache):
        super().__init__()
        self.cfg = model.config
        dev = cache.k.device
        self.names: dict[str, str] = {}  # weight name -> buffer name (a tied LM head shares one buffer)
        seen: dict[int, str] = {}
        for name, t in model.weights.items():
            if id(t) not in seen:
                seen[id(t)] = "w_" + name.replace(".", "_")
                self.register_buffer(seen[id(t)], t, persistent=False)
            self.names[name] = seen[id(t)]
        self.register_buffer("k_cache", cache.k, persistent=False)
        self.register_buffer("v_cache", cache.v, persistent=False)
        self.register_buffer("seq_lens", cache.seq_lens, persistent=False)
        self.register_buffer("tokens", torch.zeros(cache.batch, dtype=torch.int32, device=dev), persistent=False)
        self.register_buffer("inv_freq", rope_inv_freq(self.cfg).to(device=dev, dtype=torch.float32),
                             persistent=False)
        for b in self.buffers():
            torch._dynamo.mark_static_address(b)

    def forward(self):
        w = {name: getattr(self, buf) for name, buf in self.names.items()}
        logits = _step_math(self.cfg, w, self.k_cache, self.v_cache, self.seq_lens, self.tokens, self.inv_freq)
        return logits, logits.argmax(-1).to(torch.int32)


class TorchCompileRunner:
    """torch.compile of ``StaticDecoder`` (default ``mode="reduce-overhead", fullgraph=True``: Inductor kernels
    replayed from CUDA graphs). Compiles and warms up on the first step (``warmup`` calls, which also cover
    the recording replays of CUDA-graph trees); on CUDA it refuses to be timed if Inductor skipped CUDA graphs
    or recompiled after warm-up. The cache must not move after construction (the module aliases it)."""

    mode = "torch+compile"

    def __init__(self, model, cache, compile_kwargs: dict | None = None, warmup: int = 3):
        import torch._dynamo

        torch._dynamo.reset()  # a fresh compile per runner: earlier runners' entries can't hit the limit
        self.cache, self.warmup = cache, warmup
        self.module = StaticDecoder(model, cache)
        self.fn = torch.compile(self.module, **(compile_kwargs or {"mode": "reduce-overhead", "fullgraph": True}))
        self.cuda = cache.k.is_cuda
        self.warm = False

    def _call(self):
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return self.fn()

    def step(self, tokens):
        self.module.tokens.copy_(tokens)
        if not self.warm:
            from torch._dynamo.utils import counters
            skips = counters["inductor"]["cudagraph_skips"]
            for _ in range(self.warmup):
                self._call()
            if self.cuda and counters["inductor"]["cudagraph_skips"] > skips:
                raise RuntimeError("torch.compile skipped CUDA graphs for the decode step (see TORCH_LOGS="
                                   "perf_hints); its timing would not be torch.compile + CUDA graphs")
            self.frames = counters["stats"]["unique_graphs"]
            self.warm = True
        return self._call()

    def check(self) -> None:
        """Raise if dynamo compiled a new graph after warm-up (the timed steps then included a recompile)."""
        from torch._dynamo.utils import counters
        if self.warm and counters["stats"]["unique_graphs"] != self.frames:
            raise RuntimeError("torch.compile recompiled the decode step after warm-up; the timing is not "
                               "steady-state")
