"""Per-op microbenchmarks, one per op family (the Triton tutorials' "benchmark beside the kernel"; they live
here, not in ops/, because launching an op is the executors' job and ops/ sits below exec/).

* ``gemv_bandwidth``: achieved bandwidth of each GEMV-shaped op kind of a model's decode step. The ops of
  every layer are launched back to back in one CUDA graph (each reads its own layer's weights), L2 flushed
  before each timed replay; GB/s = the tasks' bytes (weights + activations, from the graph's cost
  estimates) / median time. ``oproj_merge``'s bytes count the attention partials once per tile (each tile
  re-reads them, mostly from L2).
* ``attention_bandwidth``: one layer's decode attention (attn_partial + attn_merge) against PyTorch SDPA on
  the same q and KV cache, at several context lengths; GB/s = K and V bytes read / time.

Both report against the copy bandwidth measured in the same run (``bw_gbs``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onekernel.bench.timing import graph_median_ms
from onekernel.exec.codegen import launch_op
from onekernel.graph.ir import Graph
from onekernel.ops.attention import add_attn_merge, add_attn_partial
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner

GEMV_KINDS = ("qkv_rope", "oproj_merge", "gemv_residual", "gate_up", "lm_head")  # those with a weight "w"


def gemv_bandwidth(model, name: str, bw_gbs: float, batch: int = 1, context: int = 512,
                   gemv: str | None = None) -> list[dict]:
    """One record per (op kind, shape): model, batch, gemv (the path: "fma" CUDA cores, "mma" tensor cores;
    None asks for the model's default), kind, N x K, tiles, us per op, GB/s, % of copy bandwidth."""
    cache = KVCache(model.config, batch, context, model.weights["tok_embeddings"].dtype, "cuda")
    cache.seq_lens.fill_(context - 1)
    r = make_step_runner("eager", model, cache, gemv=gemv)
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
            out.append({"model": name, "batch": batch, "gemv": r.graph.meta["gemv"], "kind": kind, "N": n, "K": k, "tiles": tiles,
                        "ops": len(sel), "bytes_per_op": nbytes // len(sel), "us_per_op": 1e3 * ms / len(sel),
                        "GBps": gbs, "pct_of_copy": 100 * gbs / bw_gbs})
    return out


def attention_bandwidth(bw_gbs: float, shapes=(("llama-3.1-8b", 32, 8, 128), ("smollm2-135m", 9, 3, 64)),
                        batches=(1, 8), contexts=(512, 2048, 8192), max_seq_len: int = 8192) -> list[dict]:
    """One record per (shape, batch, context): us of attn_partial + attn_merge (and of the partials alone)
    and of SDPA (GQA) on the same bf16 inputs, K/V GB/s of each, split choice, and max |ours - SDPA|."""
    out = []
    for name, hq, hkv, hd in shapes:
        for b in batches:
            g = Graph()
            q = g.add_buffer("q", (b, hq, hd), torch.bfloat16, "activation")
            kc = g.add_buffer("kc", (b, hkv, max_seq_len, hd), torch.bfloat16, "kv")
            vc = g.add_buffer("vc", (b, hkv, max_seq_len, hd), torch.bfloat16, "kv")
            sl = g.add_buffer("seq_lens", (b,), torch.int32, "input")
            add_attn_merge(g, "merge", *add_attn_partial(g, "attn", q, kc, vc, sl), torch.bfloat16)
            t = {n: torch.randn(buf.shape, device="cuda").to(buf.dtype) for n, buf in g.buffers.items()}
            partial = g.ops[0]
            for ctx in contexts:
                t["seq_lens"] = torch.full((b,), ctx - 1, dtype=torch.int32, device="cuda")
                ours = graph_median_ms(lambda: [launch_op(g, op, t) for op in g.ops]) * 1e3
                part = graph_median_ms(lambda: launch_op(g, partial, t)) * 1e3
                k, v, qq = t["kc"][:, :, :ctx], t["vc"][:, :, :ctx], t["q"][:, :, None]
                sdpa = graph_median_ms(lambda: F.scaled_dot_product_attention(qq, k, v, enable_gqa=True)) * 1e3
                ref = F.scaled_dot_product_attention(qq, k, v, enable_gqa=True).reshape(b, hq * hd)
                gb = 2 * b * hkv * ctx * hd * 2 / 1e3  # K and V bytes / 1e3: GB/s when divided by us
                out.append({"shape": name, "batch": b, "context": ctx, "SPLIT": partial.params["SPLIT"],
                            "NSPLIT": partial.params["NSPLIT"], "tiles": partial.n_tiles, "us": ours,
                            "us_partial": part, "us_sdpa": sdpa, "GBps": gb / ours, "GBps_sdpa": gb / sdpa,
                            "pct_of_copy": 100 * gb / ours / bw_gbs,
                            "max_abs_diff_vs_sdpa": (t["merge.out"].float() - ref.float()).abs().max().item()})
    return out
