"""Replays and a forced timeout on the GPU (issue 11's must-show): every graph-based mode's step replayed 1,000
times gives bitwise identical logits, and a streaming-megakernel wait that can never be satisfied ends the step
with KernelTimeoutError naming the task.

    python scripts/replay_check.py [--model llama-3.2-1b] [--batches 1,8] [--replays 1000] [--out F]

Random weights (bf16) and a random KV cache (``bench.modes.random_decode_state``: every sequence at position
context - 1; a step rewrites that position with the same values, so a replay must give the same bits). The
forced timeout raises one record's expected count (``stream_base.F_EX0``, the task's first wait) on the device
for a ``down`` task of layer 1, with ``wait_ms=200``, and checks that the error names that task's op. Prints one
JSON line per check and writes them all to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from onekernel.bench.modes import random_decode_state  # noqa: E402
from onekernel.errors import KernelTimeoutError  # noqa: E402
from onekernel.exec import stream_base as sb  # noqa: E402
from onekernel.models.load import load_model  # noqa: E402
from onekernel.runtime.runners import make_step_runner  # noqa: E402


def replays(model, name, batch, mode, n, context=512) -> dict:
    cache, tokens = random_decode_state(model, batch, context)
    r = make_step_runner(mode, model, cache)
    first = r.step(tokens)[0].clone()
    same = sum(int(torch.equal(r.step(tokens)[0], first)) for _ in range(n))
    r.check()
    return {"model": name, "batch": batch, "mode": mode, "runner": type(r).__name__,
            "replays_bitwise_equal": f"{same}/{n}"}


def forced_timeout(model, name, batch, context=512) -> dict:
    cache, tokens = random_decode_state(model, batch, context)
    r = make_step_runner("megakernel", model, cache, wait_ms=200)
    g = r.task_graph
    queue = [t for q in r.plan.schedule.queues for t in q]
    pos = next(i for i, t in enumerate(queue) if g.ops[g.tasks[t].op].name == "down.1"
               and r.plan.events.waits[t])
    r.qrec[pos, sb.F_EX0.value] += 1 << 20   # a count no producer reaches
    t0 = time.time()
    rec = {"model": name, "batch": batch, "mode": "megakernel-timeout", "runner": type(r).__name__}
    try:
        r.step(tokens)
        torch.cuda.synchronize()
        r.check()
        rec.update(timeout_ok=False, error="no KernelTimeoutError")
    except KernelTimeoutError as e:
        msg = str(e)
        rec.update(timeout_ok="down.1" in msg and "waited on event" in msg, message=msg[:300])
    rec["s"] = round(time.time() - t0, 2)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--replays", type=int, default=1000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    model = load_model(a.model, random_weights=True, dtype=torch.bfloat16, device="cuda", seed=0)
    out = []
    for b in (int(x) for x in a.batches.split(",")):
        for mode in ("graph", "pdl", "megakernel"):
            out.append(replays(model, a.model, b, mode, a.replays))
            print(json.dumps(out[-1]), flush=True)
    out.append(forced_timeout(model, a.model, 1))
    print(json.dumps(out[-1]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
