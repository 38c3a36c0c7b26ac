"""Per-op microbenchmarks: achieved bandwidth of each GEMV-shaped op kind of a model's decode step.

For each op kind, the ops of every layer are launched back to back in one CUDA graph (each reads its own
layer's weights), L2 flushed before each timed replay; GB/s = the tasks' bytes (weights + activations, from
the graph's cost estimates) / median time. Reported against the copy bandwidth measured in the same run.
``oproj_merge``'s bytes count the attention partials once per tile (each tile re-reads them, mostly from L2).
"""
from __future__ import annotations

import torch

from onekernel.bench.timing import graph_median_ms
from onekernel.exec.codegen import launch_op
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner

GEMV_KINDS = ("qkv_rope", "oproj_merge", "gemv_residual", "gate_up", "lm_head")  # those with a weight "w"


def gemv_bandwidth(model, name: str, bw_gbs: float, batch: int = 1, context: int = 512) -> list[dict]:
    """One record per (op kind, shape): model, kind, N x K, tiles, us per op, GB/s, % of copy bandwidth."""
    cache = KVCache(model.config, batch, context, model.weights["tok_embeddings"].dtype, "cuda")
    cache.seq_lens.fill_(context - 1)
    r = make_step_runner("eager", model, cache)
    r.step(torch.zeros(batch, dtype=torch.int32, device="cuda"))
    out = []
    for kind in GEMV_KINDS:
        ops = [o for o in r.graph.ops if o.kind.name == kind]
        if not ops:
            continue
        shapes: dict[tuple, list] = {}  # O- and down-projection share a kind but not a shape
        for o in ops:
            shapes.setdefault((*r.graph.buffers[o.args["w"]].shape, o.n_tiles), []).append(o)
        for (n, k, tiles), sel in shapes.items():
            ms = graph_median_ms(lambda: [launch_op(r.graph, o, r.tensors) for o in sel], inner=3, flush_l2=True)
            nbytes = sum(r.graph.tasks[t].bytes for o in sel for t in o.task_ids)
            gbs = nbytes / (ms * 1e-3) / 1e9
            out.append({"model": name, "batch": batch, "kind": kind, "N": n, "K": k, "tiles": tiles,
                        "ops": len(sel), "bytes_per_op": nbytes // len(sel), "us_per_op": 1e3 * ms / len(sel),
                        "GBps": gbs, "pct_of_copy": 100 * gbs / bw_gbs})
    return out
