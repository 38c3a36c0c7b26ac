"""Why is pdl slow with tensor-core GEMVs (issue 12)? Per-op spans of graph and pdl, fma and mma, from task stamps.

    python scripts/pdl_probe.py --out FILE.json [--model llama-3.2-1b] [--batch 1] [--paths fma,mma] [--modes graph,pdl]

For each (gemv, mode, variant): the median step time (``bench_modes``, 100 steps) and one profiled step's
per-op-kind medians over the layers: span (the op's first tile start to its last tile end), wait (first tile
start to first tile ready: PDL's ``gdc_wait``), gap (this op's first start - the previous op's last end) and
the tile count. Writes one JSON; prints one line per case.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from onekernel.bench.modes import bench_modes, random_decode_state  # noqa: E402
from onekernel.bench.timing import copy_bandwidth_gbs  # noqa: E402
from onekernel.models.load import load_model  # noqa: E402
from onekernel.runtime.runners import make_step_runner  # noqa: E402

CASES = [("graph", {}), ("pdl", {"trigger": "wait"}), ("pdl", {"trigger": "entry"}), ("pdl", {"trigger": "end"})]


def per_op(graph, prof) -> dict:
    p = prof.cpu().tolist()
    ops = defaultdict(lambda: [None, None, None, 0])
    for task, (s, r, e, _) in zip(graph.tasks, p):
        o = ops[task.op]
        o[0] = s if o[0] is None else min(o[0], s)
        o[1] = r if o[1] is None else min(o[1], r)
        o[2] = e if o[2] is None else max(o[2], e)
        o[3] += 1
    kinds = defaultdict(lambda: defaultdict(list))
    prev_end = None
    for i in sorted(ops):
        s, r, e, n = ops[i]
        k = graph.ops[i].name.split(".")[0]
        kinds[k]["span_us"].append((e - s) / 1e3)
        kinds[k]["wait_us"].append((r - s) / 1e3)
        if prev_end is not None:
            kinds[k]["gap_us"].append((s - prev_end) / 1e3)
        kinds[k]["tiles"].append(n)
        prev_end = e
    return {k: {m: round(statistics.median(v), 2) for m, v in d.items()} for k, d in kinds.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--paths", default="fma,mma")
    ap.add_argument("--modes", default="graph,pdl", help="which of CASES' modes to run")
    a = ap.parse_args()
    model = load_model(a.model, random_weights=True, dtype=torch.bfloat16, device="cuda", seed=0)
    bw = copy_bandwidth_gbs()
    out = []
    for gemv in a.paths.split(","):
        for mode, opts in (c for c in CASES if c[0] in a.modes.split(",")):
            o = dict(opts, gemv=gemv)
            rec, = bench_modes(model, a.model, a.batch, 512, [mode], bw, steps=100, options={mode: o})
            cache, tokens = random_decode_state(model, a.batch, 512)
            r = make_step_runner(mode, model, cache, profile=True, **o)
            for _ in range(5):
                r.step(tokens)
            torch.cuda.synchronize()
            row = {"mode": mode, "options": o, "ms_per_step": rec.get("ms_per_step"), "error": rec.get("error"),
                   "ops": per_op(r.graph, r.prof)}
            print(json.dumps({k: row[k] for k in ("mode", "options", "ms_per_step")}), flush=True)
            for k, v in row["ops"].items():
                print("   ", k, v, flush=True)
            out.append(row)
            del r
            Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
