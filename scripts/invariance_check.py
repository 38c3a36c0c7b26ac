"""Bitwise batch invariance on the GPU (issue 12): row r of a batch-B step equals a batch-1 step of row r alone.

    python scripts/invariance_check.py MODEL [--batches 2,8,16] [--modes eager,graph,pdl,megakernel,megakernel/gluon]
                                             [--gemv mma]
                                             [--out F]

Random weights (bf16), random KV cache and positions, two steps per run (``gpu_full.batch_invariance_check``);
a mode written ``megakernel/triton`` passes ``backend="triton"`` (the Triton megakernel, not the streaming one),
``megakernel/gluon`` ``backend="gluon"`` (the streaming Gluon kernel, with its tensor-core body under ``--gemv
mma``; plain ``megakernel`` is "auto", which takes it for a model that prefers streaming, either GEMV path); a
``onekernel bench`` row of ``bench.modes.MODE_VARIANTS`` (e.g. pdl-triton) runs its mode with its options;
``--gemv`` picks the GEMV path (fma: CUDA cores, mma: tensor cores; default: the model's, recorded as None);
prints one JSON line per (mode, batch) and writes them all to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batches", default="2,8,16")
    ap.add_argument("--modes", default="eager,graph,pdl,megakernel,megakernel/triton",
                    help="comma-separated; MODE/BACKEND picks the megakernel backend")
    ap.add_argument("--gemv", choices=("fma", "mma"), default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    from gpu_full import batch_invariance_check
    from onekernel.bench.modes import MODE_VARIANTS, variant_options
    from onekernel.models.load import load_model

    m = load_model(a.model, random_weights=True, dtype=torch.bfloat16, device="cuda")
    recs = []
    for mode in a.modes.split(","):
        for b in (int(x) for x in a.batches.split(",")):
            t0 = time.perf_counter()
            try:
                name, _, backend = mode.partition("/")
                opts = {"backend": backend} if backend else {}
                if a.gemv:
                    opts["gemv"] = a.gemv
                if mode in MODE_VARIANTS:  # a bench row: its mode and fixed options (InputError on a clash)
                    name, opts = variant_options(mode, opts)
                rec = {"model": a.model, "mode": mode, "batch": b, "gemv": opts.get("gemv"),
                       **batch_invariance_check(m, name, batch=b, **opts)}
            except Exception as e:  # noqa: BLE001 (recorded, the next case runs)
                rec = {"model": a.model, "mode": mode, "batch": b, "gemv": a.gemv, "error": f"{type(e).__name__}: {e}"[:300]}
            rec["s"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(rec), flush=True)
            recs.append(rec)
            if a.out:
                Path(a.out).write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
