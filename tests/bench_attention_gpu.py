"""GPU benchmark of attn_partial + attn_merge (one layer, bf16) against PyTorch SDPA; not a test.

Run on a GPU: TRITON_INTERPRET=0 python tests/bench_attention_gpu.py. Times a CUDA graph of 50 (partial,
merge) pairs; reports us per layer and K/V bandwidth (bytes of K and V read / time).
"""
import os
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from onekernel.exec.codegen import eager_kernel, launch_op  # noqa: E402
from onekernel.graph.ir import Graph  # noqa: E402
from onekernel.ops.attention import add_attention  # noqa: E402


def graph_time(fn, reps=50):
    fn()
    torch.cuda.synchronize()
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); cg.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(ts)[len(ts) // 2]


def main():
    dt = torch.bfloat16
    for name, Hq, Hkv, hd in [("llama-3.1-8b", 32, 8, 128), ("smollm2-135m", 9, 3, 64)]:
        for B in (1, 8):
            S = 8192
            g = Graph()
            ops = add_attention(g, SimpleNamespace(n_heads=Hq, n_kv_heads=Hkv, head_dim=hd), 0, B, S, dt)
            t = {n: torch.randn(b.shape, device="cuda").to(b.dtype) for n, b in g.buffers.items() if n != "seq_lens"}
            p = ops[0].params
            for L in (512, 2048, 8192):
                t["seq_lens"] = torch.full((B,), L - 1, dtype=torch.int32, device="cuda")
                us = graph_time(lambda: [launch_op(g, op, t) for op in ops])
                usp = graph_time(lambda: launch_op(g, ops[0], t))
                k, v = t["layers.0.k_cache"][:, :, :L], t["layers.0.v_cache"][:, :, :L]
                q = t["q.0"][:, :, None]
                ub = graph_time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                gb = 2 * B * Hkv * L * hd * 2 / 1e3
                print(f"{name} B={B} L={L} SPLIT={p['SPLIT']} NSPLIT={p['NSPLIT']} tiles={ops[0].n_tiles}: "
                      f"ours {us:.1f} us (partial {usp:.1f}) {gb / us:.0f} GB/s | sdpa {ub:.1f} us {gb / ub:.0f} GB/s",
                      flush=True)
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).reshape(B, Hq * hd)
            print("  max |ours - sdpa| at L=8192:", (t["attn.0"].float() - ref.float()).abs().max().item())
    sweep()
    for kn in ("attn_partial", "attn_merge"):
        for key, ck in list(eager_kernel(kn).device_caches[0][0].items())[:2]:
            print(kn, "regs", ck.n_regs, "spills", ck.n_spills, "smem", ck.metadata.shared,
                  "mma" if "mma" in ck.asm["ttgir"] else "no-mma")


def sweep():
    """us of the pair for SPLIT x BLOCK_N choices, llama-3.1-8b layer shape."""
    dt, Hq, Hkv, hd, S = torch.bfloat16, 32, 8, 128, 8192
    for B in (1, 8):
        for split in (64, 128, 256):
            for bn in (32, 64):
                g = Graph()
                ops = add_attention(g, SimpleNamespace(n_heads=Hq, n_kv_heads=Hkv, head_dim=hd), 0, B, S, dt,
                                    split=split)
                ops[0].params["BLOCK_N"] = min(bn, split)
                t = {n: torch.randn(b.shape, device="cuda").to(b.dtype) for n, b in g.buffers.items()
                     if n != "seq_lens"}
                row = []
                for L in (512, 2048, 8192):
                    t["seq_lens"] = torch.full((B,), L - 1, dtype=torch.int32, device="cuda")
                    row.append(graph_time(lambda: [launch_op(g, op, t) for op in ops]))
                    row.append(graph_time(lambda: launch_op(g, ops[1], t)))
                print(f"sweep B={B} SPLIT={split} BLOCK_N={bn}: L=512/2048/8192 pair(merge) us "
                      + " ".join(f"{a:.1f}({m:.1f})" for a, m in zip(row[::2], row[1::2])), flush=True)


if __name__ == "__main__":
    main()
