"""Sweep the separate-kernel GEMV tiles (the kernels graph and pdl launch) over their tiling knobs, on the GPU:

    python scripts/gemv_sweep.py [--models llama-3.2-1b,llama-3.1-8b] [--batch 1] [--kinds qkv_rope,o_proj,down,gate_up]
                                 [--warm I/N] [--out F] [--variants JSON]

For each model and op kind: every layer's op of that kind (its own random bf16 weights) back to back in one CUDA
graph, L2 flushed before each timed replay, median us per op (``bench.timing.graph_median_ms``), for each variant
of the op's ``blocks`` overrides (qkv_rope: P, U, BLOCK_K, STAGES, PRENORM; gemv_residual and gate_up: BLOCK_N,
BLOCK_K, STAGES, gate_up also PRENORM) and of the launch's ``num_warps``, on the tensor-core path (gemv="mma"); or the
``--variants`` list, [[blocks, num_warps], ...]. The first variant of each kind is the default tiling. Each variant's first op is checked against its PyTorch reference (relative error < 2e-2) before
it is timed; a variant that does not compile or launch (shared memory, registers) is recorded with its error.
``--warm I/N``: only compile and run once the I-th of N slices of the variants (run N such processes at once to
warm the compile cache, then one timing process). Writes every record to ``--out`` (JSON) and prints the best
variant of each kind against the default.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("qkv_rope", "o_proj", "down", "gate_up")
DEV = "cuda"  # --cpu: the interpreter (a dry run of the checks, no timing)


def variants(kind: str, p0: dict, hd: int, n_heads: int) -> list[tuple[dict, int]]:
    """(blocks overrides, num_warps) of ``kind`` around its default params p0; the default first. qkv_rope: its units
    of P rotation pairs, U per tile (``ops.qkv.qkv_tiles``: one wave on 132 SMs), P from 4 up, and the tiles of one
    unit each (U = 1) that ``qkv_pairs`` gives."""
    out = [({}, 4)]
    if kind == "qkv_rope":
        pus = [(p, -(-n_heads * hd // (2 * p) // 132)) for p in (4, 8, 16) if p <= hd // 2]
        pus += [(p, 1) for p in (8, 16, 32, 64) if p <= hd // 2]
        grid = [({"P": p, "U": u, "BLOCK_K": bk, "STAGES": st}, 2 * (1 << (u - 1).bit_length()) * p)
                for (p, u), bk, st in itertools.product(pus, (128, 256, 512), (0, 3, 4))]
    else:
        ps = (16, 32, 64)
        bks = (64, 128, 256) if kind == "gate_up" else (128, 256, 512)
        stages = (0, 3, 5, 8) if kind != "gate_up" else (0, 3, 5)
        grid = [({"BLOCK_N": p, "BLOCK_K": bk, "STAGES": st}, p * (2 if kind == "gate_up" else 1))
                for p, bk, st in itertools.product(ps, bks, stages)]
    for (b, rows), nw in itertools.product(grid, (4, 8)):
        bk, st = b["BLOCK_K"], b["STAGES"]
        if st == 0 and rows * bk > 16384:  # two chunks in registers: spills
            continue
        if st > 0 and st * (rows + 16) * bk * 2 > 200_000:  # shared memory of the pipeline
            continue
        if all(p0.get(k) == v for k, v in b.items()) and not p0.get("ROWS") and nw == 4:  # (ROWS: another tiling)
            continue
        out.append((b, nw))
    return out


def build_graph(kind: str, cfg, batch: int, blocks: dict, layers: int):
    """The graph of ``layers`` ops of ``kind`` (separate kernels' tiling, tensor cores) for model config cfg, each
    with its own weight buffer."""
    import torch

    from onekernel.graph.ir import Graph
    from onekernel.ops.gemv import add_gate_up, add_gemv_residual
    from onekernel.ops.qkv import add_qkv_rope
    from onekernel.ops.tiling import Tiling

    dt = torch.bfloat16 if DEV == "cuda" else torch.float32  # the interpreter's tl.dot is wrong in bf16
    g = Graph()
    D, HD, HQ, HKV, F = cfg.dim, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim
    kw = {"tiling": Tiling(132, "cover"), "gemv": "mma", "blocks": blocks}
    if kind == "qkv_rope":
        x = g.add_buffer("x", (batch, D), dt, "activation")
        nw = g.add_buffer("nw", (D,), dt, "weight")
        inv = g.add_buffer("inv_freq", (HD // 2,), torch.float32, "weight")
        sl = g.add_buffer("seq_lens", (batch,), torch.int32, "input")
        for i in range(layers):
            w = g.add_buffer(f"w{i}", ((HQ + 2 * HKV) * HD, D), dt, "weight")
            kc = g.add_buffer(f"kc{i}", (batch, HKV, 1024, HD), dt, "kv")
            vc = g.add_buffer(f"vc{i}", (batch, HKV, 1024, HD), dt, "kv")
            add_qkv_rope(g, f"qkv{i}", x, nw, w, inv, sl, kc, vc, eps=cfg.norm_eps, **kw)
    elif kind in ("o_proj", "down"):
        K = HQ * HD if kind == "o_proj" else F
        x = g.add_buffer("x", (batch, K), dt, "activation")
        res = g.add_buffer("res", (batch, D), dt, "activation")
        for i in range(layers):
            add_gemv_residual(g, f"{kind}{i}", x, g.add_buffer(f"w{i}", (D, K), dt, "weight"), res, **kw)
    else:
        x = g.add_buffer("x", (batch, D), dt, "activation")
        nw = g.add_buffer("nw", (D,), dt, "weight")
        for i in range(layers):
            add_gate_up(g, f"gu{i}", x, nw, g.add_buffer(f"w{i}", (2 * F, D), dt, "weight"), eps=cfg.norm_eps, **kw)
    return g


def build(kind: str, cfg, batch: int, blocks: dict, layers: int):
    """(graph, tensors) of ``build_graph``, the tensors seeded random on DEV (weights scaled by 1 / sqrt(K))."""
    import torch

    from onekernel.models.config import rope_inv_freq
    g = build_graph(kind, cfg, batch, blocks, layers)
    gen = torch.Generator(device=DEV).manual_seed(0)
    t = {}
    for n, b in g.buffers.items():
        if b.dtype == torch.int32:
            t[n] = torch.full(b.shape, 511, dtype=torch.int32, device=DEV)
        elif n == "inv_freq":
            t[n] = rope_inv_freq(cfg).to(DEV)
        else:
            scale = 1.0 if n in ("x", "res", "nw") else b.shape[-1] ** -0.5
            t[n] = (torch.randn(b.shape, generator=gen, device=DEV) * scale).to(b.dtype)
    return g, t


def check(g, t, op, out_name: str) -> float:
    """Relative error of op's output against its PyTorch reference (outputs poisoned before the kernel runs)."""
    import torch

    from onekernel.exec.codegen import launch_op
    ref = {n: v.clone() for n, v in t.items()}
    op.kind.reference(op, ref)
    t[out_name].fill_(float("nan"))
    launch_op(g, op, t)
    if DEV == "cuda":
        torch.cuda.synchronize()
    a, b = t[out_name].float(), ref[out_name].float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--warm", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--variants", default=None, help="a JSON list of [blocks, num_warps] pairs to time instead of "
                    "the built-in grid (the default tiling is always timed first)")
    a = ap.parse_args()
    global DEV
    if a.cpu:
        DEV, a.warm = "cpu", "0/1"
    import torch

    from onekernel.bench.timing import copy_bandwidth_gbs, graph_median_ms
    from onekernel.exec.codegen import launch_op
    from onekernel.models.config import get_config

    wi, wn = (int(v) for v in a.warm.split("/")) if a.warm else (0, 1)
    bw = None if a.warm else copy_bandwidth_gbs()
    recs, n = [], 0
    for name in a.models.split(","):
        cfg = get_config(name)
        for kind in a.kinds.split(","):
            layers = 1 if a.warm else cfg.n_layers
            base = None
            vs = variants(kind, dict(build_graph(kind, cfg, a.batch, {}, 1).ops[0].params), cfg.head_dim,
                          cfg.n_heads + 2 * cfg.n_kv_heads)
            if a.variants:
                vs = [({}, 4)] + [(dict(b), int(w)) for b, w in json.loads(a.variants)]
            for i, (blocks, nwarps) in enumerate(vs[:4] if a.cpu else vs):  # --cpu: a few, as a dry run
                n += 1
                if a.warm and n % wn != wi:
                    continue
                rec = {"model": name, "kind": kind, "batch": a.batch, "blocks": blocks, "num_warps": nwarps}
                t0 = time.perf_counter()
                try:
                    g, t = build(kind, cfg, a.batch, blocks, layers)
                    ops = [dataclasses.replace(op, kind=dataclasses.replace(op.kind, num_warps=nwarps)) for op in g.ops]
                    out = next(iter(ops[0].args[r] for r in ("q", "out") if r in ops[0].args))
                    rec["params"] = {k: v for k, v in ops[0].params.items()
                                     if k in ("P", "U", "BLOCK_N", "ROWS", "BLOCK_K", "STAGES", "PRENORM")}
                    rec["tiles"] = ops[0].n_tiles
                    rec["rel_err"] = check(g, t, ops[0], out)
                    if not rec["rel_err"] < 2e-2:
                        raise RuntimeError(f"relative error {rec['rel_err']:.3g} against the reference")
                    if not a.warm:
                        ms = graph_median_ms(lambda: [launch_op(g, op, t) for op in ops], inner=3, steps=20,
                                             flush_l2=True)
                        nbytes = sum(g.tasks[tk].bytes for op in ops for tk in op.task_ids)
                        rec.update(us_per_op=1e3 * ms / len(ops), pct_of_copy=100 * nbytes / (ms * 1e-3) / 1e9 / bw,
                                   mb_per_op=nbytes / len(ops) / 1e6)
                        if i == 0:
                            base = rec["us_per_op"]
                        rec["vs_default"] = rec["us_per_op"] / base if base else None
                    del g, t
                except Exception as e:  # noqa: BLE001 (recorded; the next variant runs)
                    rec["error"] = f"{type(e).__name__}: {e}"[:300]
                rec["s"] = round(time.perf_counter() - t0, 1)
                print(json.dumps(rec), flush=True)
                recs.append(rec)
                if a.out:
                    Path(a.out).write_text(json.dumps({"copy_gbs": bw, "records": recs}, indent=1))
                if DEV == "cuda":
                    torch.cuda.empty_cache()
    if a.warm:
        return
    for name in a.models.split(","):
        for kind in a.kinds.split(","):
            rs = [r for r in recs if r["model"] == name and r["kind"] == kind and "us_per_op" in r]
            if rs:
                best = min(rs, key=lambda r: r["us_per_op"])
                print(f"{name:14s} {kind:9s} default {rs[0]['us_per_op']:7.2f} us ({rs[0]['pct_of_copy']:.0f}%) "
                      f"{rs[0]['params']}  best {best['us_per_op']:7.2f} us ({best['pct_of_copy']:.0f}%) "
                      f"{best['params']} warps {best['num_warps']}")


if __name__ == "__main__":
    main()
