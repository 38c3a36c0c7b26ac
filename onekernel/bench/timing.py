"""Timing helpers: CUDA-event medians, copy bandwidth, the bandwidth floor of a decode step.

Method (docs and ../shared/DESIGN.md "Measuring"): warm up, then time each repetition with CUDA events and
report the median; the copy bandwidth is a large device-to-device copy counting bytes read plus written; the
floor of a decode step is (weight bytes + KV bytes read) / copy bandwidth.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], *, steps: int = 200, warmup: int = 20,
              between: Callable[[], object] | None = None) -> dict:
    """Run ``fn`` ``warmup`` times, then ``steps`` times with a CUDA-event pair around each call.

    between: run before each timed call, outside the events (e.g. an L2 flush).
    Returns {"median_ms", "p10_ms", "p90_ms", "steps"} (milliseconds of GPU time per call).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    for s, e in zip(starts, ends):
        if between is not None:
            between()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return {"median_ms": statistics.median(t), "p10_ms": t[len(t) // 10], "p90_ms": t[(9 * len(t)) // 10],
            "steps": steps}


def graph_median_ms(fn: Callable[[], object], *, inner: int = 20, steps: int = 50, flush_l2: bool = False) -> float:
    """Median ms of one ``fn`` call, measured by replaying a CUDA graph of ``inner`` back-to-back calls
    (removes host launch overhead; use for single-kernel microbenchmarks). flush_l2: overwrite a 256 MB
    buffer (over 4x the H200's 60 MB L2) before each timed replay, so weights come from HBM."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    scratch = torch.empty(64 << 20, dtype=torch.int32, device="cuda") if flush_l2 else None
    between = (lambda: scratch.fill_(1)) if flush_l2 else None
    return median_ms(g.replay, steps=steps, warmup=3, between=between)["median_ms"] / inner


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s (1e9 bytes/s), counting bytes read plus bytes written."""
    n = nbytes // 2
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), steps=30, warmup=5)["median_ms"]
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def floor_ms(weight_bytes: int, kv_bytes: int, bw_gbs: float) -> float:
    """The bandwidth floor of one decode step in ms: every weight byte and every KV byte read once."""
    return (weight_bytes + kv_bytes) / (bw_gbs * 1e9) * 1e3


def step_bytes(cfg, batch: int, context: int, dtype_bytes: int = 2) -> tuple[int, int]:
    """(weight bytes, KV-cache bytes) one decode step must read: every parameter (the LM head once even
    when tied) and K and V of ``context`` positions per sequence, in a ``dtype_bytes`` dtype."""
    d, f, hd = cfg.dim, cfg.ffn_dim, cfg.head_dim
    per_layer = d * hd * (cfg.n_heads * 2 + cfg.n_kv_heads * 2) + 3 * d * f + 2 * d
    w = cfg.n_layers * per_layer + cfg.vocab_size * d + d
    kv = 2 * cfg.n_layers * batch * cfg.n_kv_heads * context * hd
    return w * dtype_bytes, kv * dtype_bytes
