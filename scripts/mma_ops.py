"""Per-op GEMV time of both GEMV paths (fma: CUDA cores, mma: tensor cores) at several batch sizes, on the GPU:

    python scripts/mma_ops.py [--models llama-3.2-1b,llama-3.1-8b] [--batches 1,8,16] [--paths fma,mma] [--out F]

Random bf16 weights; ``bench.ops.gemv_bandwidth`` for each (model, path, batch): every layer's ops of one kind
and shape back to back in a CUDA graph, L2 flushed, median time. Prints one line per op kind and a summary of
each kind's time at batch B over its time at batch 1 of the same path (the issue-12 targets: <= 1.15 at 8,
<= 1.3 at 16); writes every record to ``--out`` (JSON).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--paths", default="fma,mma")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    from onekernel.bench.ops import gemv_bandwidth
    from onekernel.bench.timing import copy_bandwidth_gbs
    from onekernel.models.load import load_model

    bw = copy_bandwidth_gbs()
    recs: list[dict] = []
    for name in a.models.split(","):
        model = load_model(name, random_weights=True, dtype=torch.bfloat16, device="cuda")
        for path in a.paths.split(","):
            for b in (int(x) for x in a.batches.split(",")):
                t0 = time.perf_counter()
                try:
                    rs = gemv_bandwidth(model, name, bw, batch=b, gemv=path)
                except Exception as e:  # noqa: BLE001 (recorded, the next case runs)
                    rs = [{"model": name, "batch": b, "gemv": path, "error": f"{type(e).__name__}: {e}"[:300]}]
                for r in rs:
                    r["s"] = round(time.perf_counter() - t0, 1)
                    print(json.dumps(r), flush=True)
                recs += rs
                if a.out:
                    Path(a.out).write_text(json.dumps(recs, indent=1))
        del model
        torch.cuda.empty_cache()
    base = {(r["model"], r["gemv"], r["kind"], r["N"], r["K"]): r["us_per_op"] for r in recs
            if r.get("batch") == 1 and "us_per_op" in r}
    for r in recs:
        if "us_per_op" in r and r["batch"] != 1:
            b1 = base.get((r["model"], r["gemv"], r["kind"], r["N"], r["K"]))
            if b1:
                print(f"{r['model']:14s} {r['gemv']} {r['kind']:14s} {r['N']}x{r['K']}: batch {r['batch']:2d} "
                      f"{r['us_per_op']:8.1f} us = {r['us_per_op'] / b1:.2f} x batch 1 ({b1:.1f} us)")


if __name__ == "__main__":
    main()
