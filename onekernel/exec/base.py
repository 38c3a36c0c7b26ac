"""What every Triton executor shares: the decode-step graph bound to tensors, and the step interface.

``StepRunner.step(tokens)`` runs one decode step over the KV cache it was built for:

* tokens: int32 [B] on the cache's device (the token at position ``cache.seq_lens[b]`` of each sequence);
* returns ``(logits, next_tokens)``: float32 [B, V] and int32 [B] (greedy argmax), both tensors owned by the
  runner and overwritten by the next step. The caller advances ``cache.seq_lens`` afterwards.

The runner owns every activation and scratch tensor; the KV cache and the weights belong to the caller.
When the cache is reallocated at new addresses (``cache.k.data_ptr()`` changes), the next step re-points the
cache views before it runs (and graph-based modes re-capture): a stale address is never used.
"""
from __future__ import annotations

import torch

from onekernel.graph.ir import Graph
from onekernel.models.decode_graph import bind, build_decode_graph


def cache_key(cache) -> tuple[int, int, int]:
    return cache.k.data_ptr(), cache.v.data_ptr(), cache.seq_lens.data_ptr()


def cache_views(graph: Graph, cache) -> dict[str, torch.Tensor]:
    """Buffer name -> view of ``cache`` for the per-layer KV-cache buffers and ``seq_lens``."""
    views = {"seq_lens": cache.seq_lens}
    for i in range(graph.meta["cfg"].n_layers):
        views[f"layers.{i}.k_cache"] = cache.k[i]
        views[f"layers.{i}.v_cache"] = cache.v[i]
    return views


class GraphRunnerBase:
    """Builds the decode-step graph for ``model`` at batch ``batch`` and binds it to ``cache``.

    ``fuse_merge``: passed to ``build_decode_graph`` (True: merge the attention partials inside the
    O-projection; default: a separate op). Raises UnsupportedModelError (from ``build_decode_graph``) for
    shapes or dtypes the kernels can't run.
    """

    mode = "base"

    def __init__(self, model, cache, batch: int, *, n_sm: int | None = None, profile: bool = False,
                 fuse_merge: bool = False):
        dtype = cache.k.dtype
        if n_sm is None:
            n_sm = torch.cuda.get_device_properties(cache.k.device).multi_processor_count \
                if cache.k.is_cuda else 132
        self.model, self.cache, self.batch = model, cache, batch
        self.graph = build_decode_graph(model.config, batch, cache.k.shape[3], dtype, n_sm=n_sm,
                                        fuse_merge=fuse_merge)
        self.tensors = bind(self.graph, model.weights, cache, cache.k.device)
        self.tensors.update(cache_views(self.graph, cache))
        self._cache_key = cache_key(cache)
        self.profile = profile
        self.prof = (torch.zeros(len(self.graph.tasks), 4, dtype=torch.int64, device=cache.k.device)
                     if profile else None)

    def _refresh_cache(self) -> bool:
        """Re-point the cache views if the cache moved; returns True when it did."""
        key = cache_key(self.cache)
        if key == self._cache_key:
            return False
        self.tensors.update(cache_views(self.graph, self.cache))
        self._cache_key = key
        return True

    def step(self, tokens: torch.Tensor):
        self.tensors["tokens"].copy_(tokens)
        self._run(self._refresh_cache())
        return self.tensors["logits"], self.tensors["next_tokens"]

    def _run(self, moved: bool) -> None:
        raise NotImplementedError
