"""One tensor-parallel rank's decode step without its all-reduces, timed on one GPU in the single-GPU modes.

    python scripts/shard_bench.py --model llama-3.1-70b --tp 8 [--rank 0] [--batch 1,8] [--context 512]
                                  [--modes torch+graph,graph,pdl,megakernel] [--steps 50] --out F.json

The step of rank ``--rank``'s shard (``dist.sharding.shard_config``: 1/TP of the heads, KV heads, FFN rows and
vocabulary; random bf16 weights, seed 0) run as a model of its own: every weight byte a TP=N rank streams and every
task it computes, none of its communication. Its time is what a TP=N megakernel step would take if every all-reduce
cost nothing, so it bounds issue 13's and 16's targets from below (e.g. Llama-3.1-70B at TP=8: the 70% target is
5.9 ms, the shard's floor ~4.1 ms). Each record is ``onekernel bench``'s (``bench.modes.bench_modes``: median of
CUDA-event-timed steps, the floor from the copy bandwidth measured here, the relative error against the PyTorch
reference step of the same shard) plus tp, rank, commit, device and date; the file is rewritten after each batch.
Needs a CUDA GPU (an InputError names the problem otherwise).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--model", default="llama-3.1-70b", help="a config name (random weights)")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--modes", default="torch+graph,graph,pdl,megakernel")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import torch

    from onekernel.bench.modes import bench_modes
    from onekernel.bench.report import commit_id
    from onekernel.bench.timing import copy_bandwidth_gbs
    from onekernel.dist.sharding import shard_config
    from onekernel.models.config import get_config
    from onekernel.errors import OneKernelError
    from tp_common import shard_as_model

    try:  # the command line first (any machine), then the GPU
        batches = [int(b) for b in a.batch.split(",") if b.strip().isdecimal()]
        if len(batches) != len(a.batch.split(",")) or min(batches) < 1:
            raise ValueError(f"--batch needs comma-separated positive integers, got {a.batch!r:.40}")
        if a.context < 1 or a.steps < 1:
            raise ValueError(f"--context and --steps must be positive, got {a.context} and {a.steps}")
        if not Path(a.out).parent.is_dir() or Path(a.out).is_dir():
            raise ValueError(f"--out {a.out!r:.80}: needs a file name in a folder that exists")
        shard_config(get_config(a.model), a.tp, a.rank)
        if not torch.cuda.is_available():
            raise OneKernelError("shard_bench times a step on a CUDA GPU; this machine has none")
        model = shard_as_model(a.model, a.tp, a.rank)
    except (OneKernelError, ValueError) as e:
        print(f"shard_bench: {e}", file=sys.stderr)
        return 2
    cfg = model.config
    bw = copy_bandwidth_gbs()
    meta = {"tp": a.tp, "rank": a.rank, "commit": commit_id(), "device": torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d"), "copy_gbs": bw, "note": "one rank's step without its all-reduces"}
    records = []
    for b in batches:
        for rec in bench_modes(model, cfg.name, b, a.context, a.modes.split(","), bw, steps=a.steps):
            rec.update(meta)
            records.append(rec)
            print(json.dumps(rec), flush=True)
        Path(a.out).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
