"""Benchmarks of scripts/gpu_suite.py: per-op GEMV bandwidth, per-mode step latency, megakernel variants,
and the profile of one SmolLM2-135M step."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from onekernel.bench.modes import bench_modes
from onekernel.bench.ops import gemv_bandwidth
from onekernel.exec import make_runner
from onekernel.models.load import load_model
from onekernel.profile.trace import breakdown, perfetto, timeline_png
from onekernel.runtime.kv_cache import KVCache

OUT = Path(os.environ.get("OUT", "/tmp/out"))
ALL = ["torch", "torch+graph", "eager", "graph", "pdl", "megakernel"]


STEPS = 100


def _modes(section, R, cases, bw):
    out = []
    for label, m, batches in cases:
        for b in batches:
            recs = bench_modes(m, label, b, 512, ALL, bw, steps=STEPS,
                               progress=lambda r: print("   ", json.dumps(r, default=str)[:300], flush=True))
            R["records"] += recs
            out += [{k: r.get(k) for k in ("model", "batch", "mode", "ms_per_step", "pct_of_floor",
                                           "ratio_to_torch_graph", "error")} for r in recs]
    return out


def run_random_bench(section, R, only_ops=False):
    bw = R["copy_gbs"]
    R.setdefault("records", [])
    @section("bench: GEMV bandwidth per op kind and shape (all layers of a kind in one CUDA graph, L2 flushed)")
    def gemv_bench():
        out = []
        for name in ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"]:
            m = load_model(name, random_weights=True, dtype=torch.bfloat16, device="cuda")
            out += gemv_bandwidth(m, name, bw)
            del m
            torch.cuda.empty_cache()
        R["gemv"] = out
        return [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()} for r in out]

    @section("bench: every mode, per-step latency, random weights (context 512)")
    def modes_bench():
        out = []
        for name, batches in [("llama-3.2-1b", [1, 8]), ("llama-3.1-8b", [1])]:
            m = load_model(name, random_weights=True, dtype=torch.bfloat16, device="cuda")
            out += _modes(section, R, [(name + " (random)", m, batches)], bw)
            del m
            torch.cuda.empty_cache()
        return out

    if only_ops:
        gemv_bench()
        return
    modes_bench(); gemv_bench()


def run_real_bench(real_model, section, R):
    bw = R["copy_gbs"]
    R.setdefault("records", [])
    @section("profile: one SmolLM2-135M step, megakernel and graph mode")
    def profile():
        out = {}
        n_sm = torch.cuda.get_device_properties(0).multi_processor_count
        for mode in ["megakernel", "graph"]:
            cache = KVCache(real_model.config, 1, 512, torch.bfloat16, "cuda")
            cache.seq_lens.fill_(511)
            r = make_runner(mode, real_model, cache, 1, profile=True)
            tok = torch.tensor([5], dtype=torch.int32, device="cuda")
            for _ in range(5):
                r.step(tok)
            torch.cuda.synchronize()
            b = breakdown(r.graph, r.prof, n_sm)
            timeline_png(r.graph, r.prof, OUT / f"profile_{mode}_smollm2-135m.png",
                         f"SmolLM2-135M, one decode step, {mode} (H200, bf16, batch 1, context 512)")
            perfetto(r.graph, r.prof, OUT / f"trace_{mode}_smollm2-135m.json", mode)
            out[mode] = {k: v for k, v in b.items() if k != "computing_by_kind_us"} | {
                "by_kind": {k: round(v, 1) for k, v in b["computing_by_kind_us"].items()}}
        return out

    @section("bench: every mode, SmolLM2-135M real weights (context 512)")
    def modes_bench():
        return _modes(section, R, [("smollm2-135m (real Q4_1 -> bf16)", real_model, [1, 8])], bw)

    @section("bench: megakernel variants on SmolLM2-135M (prefetch, events, policy, workers)")
    def variants():
        out = []
        opts = {"mk default": {}, "no prefetch": {"prefetch": False}, "op events": {"events": "op"},
                "round robin": {"policy": "round_robin"}}
        for k, o in opts.items():
            rec = bench_modes(real_model, "smollm2-135m", 1, 512, ["megakernel"], bw, steps=STEPS,
                              options={"megakernel": o})[0]
            rec["variant"] = k
            R["records"].append(rec)
            out.append({"variant": k, "ms": rec.get("ms_per_step"), "error": rec.get("error")})
        return out

    profile(); modes_bench(); variants()
