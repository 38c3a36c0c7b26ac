"""PyTorch baselines the benchmarks compare against: eager PyTorch, PyTorch + CUDA graph, and torch.compile
with CUDA graphs (``mode="reduce-overhead"``).

All of them run the reference mode's static-shape decode step ``runtime.reference.decode_one_token`` (the
attention span fixed to the whole cache and masked on the device, so it never syncs with the host: gpt-fast's
approach). ``StaticDecoder`` wraps it as an ``nn.Module`` whose weights, KV cache, tokens and seq_lens are
registered buffers marked as static addresses (gpt-fast's layout), so torch.compile's CUDA graphs are not
skipped for mutating inputs.
"""
from __future__ import annotations

import torch

from onekernel.models.config import rope_inv_freq
from onekernel.runtime.reference import decode_one_token


def capture(fn):
    """``fn()`` run twice on a side stream (warm-up: allocations, lazy initialisations such as NCCL's), then
    captured in a ``torch.cuda.CUDAGraph``: returns (the graph, fn's outputs: static tensors its replays
    overwrite)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class TorchGraphRunner:
    """PyTorch + CUDA graph: ``decode_one_token`` captured once, replayed every step. ``step(tokens)`` as every
    runner; ``check()`` is a no-op."""

    mode = "torch+graph"

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.tokens = torch.zeros(cache.batch, dtype=torch.int32, device=cache.k.device)
        self.inv_freq = rope_inv_freq(model.config).to(device=cache.k.device, dtype=torch.float32)
        self.graph = None

    @torch.no_grad()
    def _decode(self):
        c = self.cache
        return decode_one_token(self.model.config, self.model.weights, c.k, c.v, c.seq_lens, self.tokens,
                                self.inv_freq)

    def _step(self):
        logits = self._decode()
        return logits, logits.argmax(-1).to(torch.int32)

    def step(self, tokens):
        self.tokens.copy_(tokens)
        if self.graph is None:
            self.graph, (self.logits, self.next) = capture(self._step)
        self.graph.replay()
        return self.logits, self.next

    def check(self) -> None:
        """Nothing to check."""

    poll = check


class StaticDecoder(torch.nn.Module):
    """``decode_one_token`` as a module without inputs: weights, the KV cache (the caller's ``cache.k/v``,
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
        logits = decode_one_token(self.cfg, w, self.k_cache, self.v_cache, self.seq_lens, self.tokens, self.inv_freq)
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

    poll = check
