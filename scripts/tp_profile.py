"""Multi-GPU profile of the TP megakernel (issues 13, 16 must-show): every GPU's SM timeline in one PNG and a
breakdown.

    python scripts/tp_profile.py [--tp 2] [--model llama-3.2-1b] [--batch 1] [--steps 5] [--comm-workers 0]
                                 [--ar-tiles N] [--gemv fma|mma] [--backend auto|gluon|triton] [--push] [--out DIR]

Starts itself under torchrun (``--tp`` ranks, default 2, one GPU each) unless already in a rank. Each rank builds
its TP megakernel on the GEMV path ``--gemv`` (default: the model's; the JSON's ``gemv``; ``-GEMV`` ends the file
names when given) and backend ``--backend`` (``TPMegakernelRunner``'s; default auto: the streaming Gluon kernel
where it runs; the JSON's ``backend``; ``-BACKEND`` ends the file names when given; ``--comm-workers`` > 0 is
Triton's) with ``profile=True`` (per-task %globaltimer stamps: start, local waits done, all waits done, end, SM id,
or the streaming kernel's worker id, one CTA per SM, its rows converted by ``profile.tp_trace.stream_rows``; task ids
of the runner's ``task_graph``: the streaming kernel's is re-tiled; ``--push``: the streaming kernel with the push
all-reduce, ``-push`` ends the file names and the JSON says ``push``), runs 3 warm-up steps and ``--steps`` profiled
steps (the bench's random state), reads its stamps after each step and keeps the step whose span is the median;
rank 0 gathers every rank's stamps (all_gather: the graphs, hence the shapes, are the same) and writes, under DIR:

* ``tp-profile-MODEL-bB.png`` (``-tpN`` before ``-bB`` when N != 2): one panel per rank, rows = SMs, tasks as bars by op kind, the all-reduce tiles in
  red, local waits grey, waits on the peer light red. globaltimer is per GPU and the clocks are not
  synchronised: each rank's stamps are aligned to its own step start (``profile.tp_trace``);
* ``tp-profile-MODEL-bB.json``: per rank ``profile.tp_trace.rank_breakdown`` (span, all-reduce task time, time
  waiting on the peer, local waiting, per stage (embed, layer i, lm_head) and per op: start, end, span, body)
  plus ``profile.trace.breakdown`` (computing / waiting / idle shares) and the profiled steps' spans. The stamps
  cost a little: time steps with the bench (``onekernel bench --tp 2``) or scripts/tp_sm_study.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from onekernel.runtime.args import add_gemv_argument  # noqa: E402
from tp_common import add_tp_argument  # noqa: E402


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--comm-workers", type=int, default=0, help="workers reserved for the all-reduce (0: mixed)")
    ap.add_argument("--ar-tiles", type=int, default=None, help="tiles per all-reduce op (default: the fit rule)")
    add_tp_argument(ap)
    add_gemv_argument(ap)
    ap.add_argument("--backend", choices=("auto", "gluon", "triton"), default="auto", help="the TP megakernel's")
    ap.add_argument("--push", action="store_true", help="the push all-reduce (streaming kernel only)")
    ap.add_argument("--out", default="benchmarks/results/tp-profile")
    a = ap.parse_args()
    if a.push and (a.backend == "triton" or a.comm_workers):
        ap.error("--push is the streaming (Gluon) kernel's all-reduce: drop --backend triton / --comm-workers")
    if a.backend == "gluon" and a.comm_workers:
        ap.error("--comm-workers reserves workers of the Triton TP megakernel; the streaming one (--backend gluon) "
                 "has no such option: drop one of them")
    if "WORLD_SIZE" not in os.environ:  # before starting the ranks: one message, not one per rank
        import torch
        if torch.cuda.device_count() < a.tp:
            ap.error(f"--tp {a.tp} needs {a.tp} GPUs, this machine has {torch.cuda.device_count()}")
    return a


def main() -> int:
    a = _args()
    import torch

    from onekernel.bench.modes import random_decode_state
    from onekernel.bench.report import commit_id
    from onekernel.dist.process import close_rank, init_rank
    from onekernel.profile.trace import breakdown
    from onekernel.profile.tp_trace import rank_breakdown, remote_task_ids, stream_rows, tp_timeline_png
    from tp_common import load_shard

    info = init_rank(a.tp, "cuda")
    dev, rank = info.device, info.rank
    model, group = load_shard(a.model, a.tp, rank, dev, torch.bfloat16)
    cache, _ = random_decode_state(model, a.batch, a.context)
    g = torch.Generator(device=dev).manual_seed(0)
    tokens = torch.randint(0, group.config.vocab_size, (a.batch,), device=dev, dtype=torch.int32, generator=g)
    opts = {"comm_workers": a.comm_workers} if a.comm_workers else {}  # a Triton-only option: "auto" takes Triton
    if a.push:
        opts["push"] = True
    r = group.step_runner("megakernel", model, cache, profile=True, ar_tiles=a.ar_tiles, gemv=a.gemv,
                          backend=a.backend, **opts)
    mk = r.runner
    rtasks = remote_task_ids(mk.events)
    for _ in range(3):
        r.step(tokens)
    torch.cuda.synchronize()
    r.check()
    stamps, spans = [], []
    for _ in range(a.steps):
        r.step(tokens)
        torch.cuda.synchronize()
        p = stream_rows(mk.prof, mk.prof_sub, rtasks).to(dev) if r.backend == "gluon" else mk.prof.clone()
        stamps.append(p)
        spans.append(float(p[:, 2].max() - p[:, 0].min()) / 1e3)
    r.check()
    keep = stamps[sorted(range(len(spans)), key=spans.__getitem__)[len(spans) // 2]]
    every = [torch.empty_like(keep) for _ in range(a.tp)]
    group.dist.all_gather(every, keep)
    every_spans = [torch.zeros(len(spans), dtype=torch.float64, device=dev) for _ in range(a.tp)]
    group.dist.all_gather(every_spans, torch.tensor(spans, dtype=torch.float64, device=dev))
    if rank == 0:
        graph = mk.task_graph
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"tp-profile-{a.model}" + (f"-tp{a.tp}" if a.tp != 2 else "") + f"-b{a.batch}" + (f"-k{a.comm_workers}" if a.comm_workers else "") + (
            f"-ar{a.ar_tiles}" if a.ar_tiles else "") + (f"-{a.gemv}" if a.gemv else "") + (
            f"-{a.backend}" if a.backend != "auto" else "") + ("-push" if a.push else "")
        commit = commit_id()
        profs = [p.cpu() for p in every]
        n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
        rep = {"model": a.model, "batch": a.batch, "context": a.context, "tp": a.tp, "commit": commit,
               "gemv": graph.meta["gemv"], "backend": r.backend, "push": a.push,
               "comm_workers": a.comm_workers, "ar_tiles_per_op": next(op.n_tiles for op in graph.ops
                                                                      if op.kind.name == "allreduce"),
               "n_workers": mk.n_workers, "tasks": len(graph.tasks), "tasks_with_remote_waits": len(rtasks),
               "alignment": "each rank's stamps relative to its own earliest task start (per-GPU globaltimer)",
               "ranks": []}
        for k, p in enumerate(profs):
            b = rank_breakdown(graph, p, rtasks)
            b["trace_breakdown"] = breakdown(graph, p[:, :4], n_sm)
            s = [float(x) for x in every_spans[k].cpu()]
            b["profiled_step_spans_us"] = s
            b["median_span_us"] = statistics.median(s)
            rep["ranks"].append(b)
        (out / f"{stem}.json").write_text(json.dumps(rep, indent=1))
        title = (f"{a.model} TP={a.tp} megakernel ({r.backend}{', push' if a.push else ''}), batch {a.batch}, commit {commit}: rank spans "
                 + ", ".join(f"{x['span_us']:.0f} us" for x in rep["ranks"]))
        tp_timeline_png(graph, profs, rtasks, out / f"{stem}.png", title=title)
        for k, b in enumerate(rep["ranks"]):
            print(json.dumps({"rank": k, **{n: round(b[n], 1) for n in ("span_us", "allreduce_body_us",
                  "allreduce_total_us", "remote_wait_us", "local_wait_us")}}), flush=True)
        print(f"wrote {out / stem}.png and .json")
    del r
    close_rank()
    return 0


if __name__ == "__main__":
    from tp_common import relaunch_under_torchrun

    _args()  # bad arguments stop here, once
    relaunch_under_torchrun(__file__)
    sys.exit(main())
