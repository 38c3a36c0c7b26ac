"""Problem definition and measurement shared by the stream prototypes (see gluon_stream.py).

The problem: a chain of bf16 GEMV stages shaped like a Llama decoder at batch 1. Per layer 4 stages with
weights [N, K] (row-major, as nn.Linear): QKV ((Hq+2*Hkv)*hd, D), O (D, Hq*hd), gate_up (2F, D), down (D, F);
then one LM head (V, D). Weights are random normal scaled by 1/sqrt(K). Stage s reads x_s[k] = out_{s-1}[k % N_{s-1}]
(out_{-1}: a random bf16 vector of length D) and writes out_s = bf16(W_s @ x_s) with fp32 accumulation.
Every stage's N rows are split into exactly W tiles (one per worker), balanced by bytes at a granularity of
ROW_GROUP rows; worker w runs tile w of every stage, in stage order.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

PRESETS = {
    "tiny": dict(D=256, F=512, Hq=4, Hkv=2, hd=64, L=2, V=1024),
    "llama-1b": dict(D=2048, F=8192, Hq=32, Hkv=8, hd=64, L=16, V=128256),
    "llama-8b": dict(D=4096, F=14336, Hq=32, Hkv=8, hd=128, L=32, V=128256),
}
ROW_GROUP = 8  # tile boundaries are multiples of this many rows
TOL = 2e-2     # max relative error (norm-wise) per stage


@dataclass
class Stage:
    name: str
    N: int
    K: int


def stages_for(preset: str, layers: int | None = None) -> list[Stage]:
    """The chain's stages, in order (per layer: qkv, o, gate_up, down; then lm_head)."""
    p = PRESETS[preset]
    D, F, Hq, Hkv, hd, V = p["D"], p["F"], p["Hq"], p["Hkv"], p["hd"], p["V"]
    out = []
    for i in range(p["L"] if layers is None else layers):
        out += [Stage(f"l{i}.qkv", (Hq + 2 * Hkv) * hd, D), Stage(f"l{i}.o", D, Hq * hd),
                Stage(f"l{i}.gate_up", 2 * F, D), Stage(f"l{i}.down", D, F)]
    return out + [Stage("lm_head", V, D)]


def tile_groups(N: int, W: int) -> torch.Tensor:
    """int64 [W+1] tile boundaries in units of ROW_GROUP rows: tile w = groups [b[w], b[w+1]) (some may be
    empty when N / ROW_GROUP < W). Byte-balanced: every row of a stage has the same K."""
    assert N % ROW_GROUP == 0, f"N={N} is not a multiple of {ROW_GROUP}"
    G = N // ROW_GROUP
    return torch.tensor([(w * G + W // 2) // W for w in range(W + 1)], dtype=torch.int64)


def make_weights(stages: list[Stage], device, seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per-stage bf16 weights [N, K] (normal / sqrt(K)) and the bf16 input vector out_{-1} of length D."""
    g = torch.Generator(device=device).manual_seed(seed)
    ws = [(torch.randn(s.N, s.K, generator=g, device=device) / math.sqrt(s.K)).to(torch.bfloat16) for s in stages]
    x0 = torch.randn(stages[0].K, generator=g, device=device).to(torch.bfloat16)
    return ws, x0


def check_stages(stages: list[Stage], ws: list[torch.Tensor], x0: torch.Tensor, outs: list[torch.Tensor]):
    """Norm-wise relative error of every stage's output against fp32 torch: ref_s = W_s.float() @ x_s.float()
    with x_s built from the KERNEL's out_{s-1} (so stage errors do not compound down the chain).
    Returns (per-stage errors, passed); a NaN output (never written after the NaN poisoning) counts as inf."""
    errs, prev = [], x0
    for s, w, o in zip(stages, ws, outs):
        x = prev[torch.arange(s.K, device=prev.device) % prev.numel()].float()
        ref = w.float() @ x
        e = ((o.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        errs.append(e if e == e else float("inf"))  # NaN (unwritten output) -> inf
        prev = o
    return errs, all(e < TOL for e in errs)


def time_launches(launch, n: int = 200, warmup: int = 20, graph: bool = False) -> float:
    """Median ms of one ``launch()`` over n launches after ``warmup``, one CUDA-event pair per launch
    (enqueued back to back, one sync at the end). graph: capture one launch in a CUDA graph and replay it."""
    fn = launch
    if graph:
        launch()  # compile / warm before capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch()
        fn = g.replay
    for _ in range(warmup):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def copy_bandwidth_gbs(nbytes: int = 2 * 1024 ** 3, reps: int = 20) -> float:
    """Device-to-device copy of an nbytes buffer: (bytes read + written) / median time, in GB/s (1e9)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_launches(lambda: dst.copy_(src), n=reps, warmup=3)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def base_parser(description: str) -> argparse.ArgumentParser:
    """The options every stream prototype has (tl_stream.py adds its own to this parser)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama-1b")
    ap.add_argument("--workers", type=int, default=132, help="W: CTAs = workers = tiles per stage")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    ap.add_argument("--graph", action="store_true", help="time replays of a CUDA graph of one launch")
    ap.add_argument("--out", default=None, help="write the JSON record(s) here")
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90a (no GPU needed) and report")
    return ap


def parse_args(description: str, flags: dict[str, str] | None = None) -> argparse.Namespace:
    """gluon_stream.py's CLI; ``flags`` adds a script's own store_true options ({"--name": "help"})."""
    ap = base_parser(description)
    ap.add_argument("--variant", choices=["deps", "nodeps"], default="deps")
    ap.add_argument("--slots", type=int, default=None, help="ring slots of 16 KB (default: what fits)")
    for name, help_ in (flags or {}).items():
        ap.add_argument(name, action="store_true", help=help_)
    return ap.parse_args()


def write_record(path: str | None, rec: dict) -> None:
    print(json.dumps({k: v for k, v in rec.items() if k != "stage_errors"}, indent=1))
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(rec, indent=1))
