"""SM-reservation study of the TP megakernel (issue 13 item 6): does giving the all-reduce tiles their own workers
help, and how many tiles should an all-reduce have?

    python scripts/tp_sm_study.py [--tp 2] [--model llama-3.2-1b] [--batches 1,8] [--ks 0,2,4,8,16]
                                  [--ar-tiles fit,8,16,32] [--steps 200] [--gemv fma|mma] [--out DIR]

Starts itself under torchrun (``--tp`` ranks, default 2, one GPU each) unless already in a rank. For each batch (the bench's state:
random K/V, every sequence at position context - 1, seeded tokens from the whole vocabulary) and each
(k, ar_tiles): the rank's TP megakernel with ``comm_workers=k`` (k = 0: today's mixed critical-path schedule;
k > 0: the all-reduce tiles only on the last k workers, every other task on the others:
``graph.schedule.reserved_critical_path``; both ranks build the same schedule, compared by fingerprint) and
``ar_tiles`` tiles per all-reduce op ("fit": the default, at most one tile per worker: 128 at D = 2048);
one step checked (``check()``; logits compared bitwise with k = 0 at the default tiles: the schedule and the
tile split change no sum, so they must be equal), then ``--steps`` CUDA-event-timed steps (10 warm-up);
ms_per_step = the slower rank's median.

Records (rank 0 writes ``DIR/tp-sm-study-DATE-MODEL-COMMIT.json`` after each, and a ``.md`` table at the end):
model, batch, context, k, ar_tiles (tiles per all-reduce op), gemv (the GEMV path: ``--gemv``, default the
model's), ms_per_step, p10_ms, p90_ms (rank 0's), steps,
ratio_to_k0 (ms_per_step / that of k = 0 with the default tiles), logits_equal_k0, commit, and "error" when the
variant failed (e.g. a residency or schedule refusal). NVLink multicast stays off.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onekernel.runtime.args import add_gemv_argument  # noqa: E402
from tp_common import add_tp_argument  # noqa: E402


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ks", default="0,2,4,8,16", help="workers reserved for the all-reduce (0: mixed schedule)")
    ap.add_argument("--ar-tiles", default="fit,8,16,32",
                    help="tiles per all-reduce op: 'fit' (the default rule) or counts (powers of two)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--context", type=int, default=512)
    add_tp_argument(ap)
    add_gemv_argument(ap)
    ap.add_argument("--out", default="benchmarks/results/tp-sm-study")
    return ap.parse_args()


def table(records: list[dict]) -> str:
    from onekernel.bench.report import md_table

    def cells(r):
        return (f"{r['ms_per_step']:.3f}", f"{r['p10_ms']:.3f}", f"{r['p90_ms']:.3f}",
                f"{r['ratio_to_k0']:.3f}" if r.get("ratio_to_k0") else "-", r.get("logits_equal_k0"))

    return md_table(["model", "batch", "k (reserved workers)", "all-reduce tiles", "ms/step", "p10", "p90", "vs k=0",
                     "logits = k=0"], records, lambda r: (r["model"], r["batch"], r["k"], r["ar_tiles"]), cells)


def main() -> int:
    a = _args()
    import torch

    from onekernel.bench.modes import random_decode_state
    from onekernel.bench.report import commit_id
    from onekernel.bench.timing import median_ms
    from onekernel.dist.process import close_rank, init_rank
    from tp_common import load_shard

    info = init_rank(a.tp, "cuda")
    dev, rank = info.device, info.rank
    model, group = load_shard(a.model, a.tp, rank, dev, torch.bfloat16)
    commit = commit_id()
    out_dir = Path(a.out)
    tp = "" if a.tp == 2 else f"tp{a.tp}-"
    stem = f"tp-sm-study-{tp}{datetime.date.today().isoformat()}-{a.model}-{commit or 'nocommit'}" + (
        f"-{a.gemv}" if a.gemv else "")
    records: list[dict] = []

    def emit(rec):
        if rank == 0:
            records.append(rec)
            print(json.dumps(rec), flush=True)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"{stem}.json").write_text(json.dumps(records, indent=1))

    ks = [int(k) for k in a.ks.split(",")]
    tiles = [None if t == "fit" else int(t) for t in a.ar_tiles.split(",")]
    for b in (int(x) for x in a.batches.split(",")):
        cache, _ = random_decode_state(model, b, a.context)
        g = torch.Generator(device=dev).manual_seed(0)
        tokens = torch.randint(0, group.config.vocab_size, (b,), device=dev, dtype=torch.int32, generator=g)
        base_ms, base_logits = None, None
        for ar in tiles:
            for k in ks:
                rec = {"model": a.model, "tp": a.tp, "batch": b, "context": a.context, "k": k, "ar_tiles": ar or "fit",
                       "ms_per_step": None, "commit": commit}
                try:
                    r = group.step_runner("megakernel", model, cache, comm_workers=k, ar_tiles=ar, gemv=a.gemv)
                    rec["gemv"] = r.bound.graph.meta["gemv"]
                    ops = [op for op in r.bound.graph.ops if op.kind.name == "allreduce"]
                    rec["ar_tiles_per_op"] = ops[0].n_tiles
                    lg, _ = r.step(tokens)
                    r.check()
                    if base_logits is None and k == 0 and ar is None:
                        base_logits = lg.clone()
                    if base_logits is not None:
                        rec["logits_equal_k0"] = bool(torch.equal(lg, base_logits))
                    t = median_ms(lambda: r.step(tokens), steps=a.steps, warmup=10)
                    r.check()
                    ms = torch.tensor([t["median_ms"]], device=dev)
                    group.dist.all_reduce(ms, op=group.dist.ReduceOp.MAX)
                    rec.update(ms_per_step=float(ms), p10_ms=t["p10_ms"], p90_ms=t["p90_ms"], steps=t["steps"])
                    if k == 0 and ar is None:
                        base_ms = rec["ms_per_step"]
                    if base_ms:
                        rec["ratio_to_k0"] = rec["ms_per_step"] / base_ms
                    del r, lg
                    gc.collect()
                except Exception as e:  # noqa: BLE001 - the other variants still run
                    rec["error"] = f"{type(e).__name__}: {e}"[:1000]
                emit(rec)
                torch.cuda.empty_cache()
        del cache
    if rank == 0:
        (out_dir / f"{stem}.md").write_text(f"# TP={a.tp} megakernel SM reservation, {a.model}, commit {commit}\n\n"
                                            + table(records) + "\n")
        print(table(records))
    close_rank()
    return 0


if __name__ == "__main__":
    from tp_common import relaunch_under_torchrun

    relaunch_under_torchrun(__file__)
    sys.exit(main())
