"""Benchmarks of scripts/gpu_suite.py: per-op GEMV bandwidth and the profile of one SmolLM2-135M step.
(Per-mode latency and the study: ``onekernel bench [--study]``, see scripts/gpu_call.sh.)"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from onekernel.bench.ops import attention_bandwidth, gemv_bandwidth
from onekernel.runtime.runners import make_step_runner
from onekernel.models.load import load_model
from onekernel.profile.trace import breakdown, perfetto, timeline_png
from onekernel.runtime.kv_cache import KVCache

OUT = Path(os.environ.get("OUT", "/tmp/out"))


def run_random_bench(section, R):
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

    @section("bench: decode attention (partial + merge) vs SDPA, one layer, bf16")
    def attention_bench():
        R["attention"] = out = attention_bandwidth(bw)
        return [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for r in out]

    gemv_bench()
    attention_bench()


def run_real_bench(real_model, section, R):
    @section("profile: one SmolLM2-135M step, megakernel, graph and pdl mode")
    def profile():
        out = {}
        n_sm = torch.cuda.get_device_properties(0).multi_processor_count
        for mode in ["megakernel", "graph", "pdl"]:
            cache = KVCache(real_model.config, 1, 512, torch.bfloat16, "cuda")
            cache.seq_lens.fill_(511)
            r = make_step_runner(mode, real_model, cache, profile=True)
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

    profile()
