"""Where the streaming megakernel's step time goes (H200): per-op timing from its task stamps.

    python scripts/stream_profile.py --out DIR [--model llama-3.2-1b] [--batch 1] [--context 512] [--gemv fma|mma]
                                     [--shard TP,RANK]

Runs a few steps with ``profile=True`` (``exec.stream_runner``) in the benchmark's cache (``--context`` positions,
each step writing the last, as ``onekernel bench``), then per op of layer 1 and the LM head: when
its first task started, when its last task's dependencies were satisfied, when its last task ended (us from
the step's first stamp), the median task time (end - dependencies satisfied) and the median publish (the task's
last CTA barrier and release add, of which the barrier; stream_device); per op kind over all
layers: median and max task time; per tensor-core GEMV kind (and each GEMV op of layer 1), the medians of its tasks' time inside
(``prof_sub``: staging activation tiles, of which waiting for their loads, waiting on ring slots, epilogues, the
time before the first block (operand pointers, the rstd pass), the rest; for attention: to the loop, the blocks, the warp merges, arriving and merging). Writes
DIR/stream_profile_<model>_b<batch>.json and .png (the SM timeline of one step: ``profile.trace.timeline_png``).
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

from onekernel.models.load import load_model  # noqa: E402
from onekernel.profile.trace import publish_of, sm_of  # noqa: E402
from onekernel.runtime.kv_cache import KVCache  # noqa: E402
from onekernel.runtime.runners import make_step_runner  # noqa: E402


def gemv_sub_times(prof_row, sub_row) -> dict:
    """A tensor-core GEMV task's times in us from its ``prof`` row (start, ready, end, worker; ns) and its
    ``prof_sub`` row (exec.stream_mma.gemv_mma: ns staging, ns waiting on ring slots, ns in the epilogues + (ns
    before the first block) << 32, tiles staged + (ns of the staging spent waiting for the tiles' loads) << 16):
    staging_us, staging_wait_us, ring_wait_us, epilogue_us, pre_us, rest_us (ready to end minus the others but
    staging_wait, which is inside staging) and tiles."""
    epi, pre = sub_row[2] & 0xFFFFFFFF, sub_row[2] >> 32
    return {"staging_us": sub_row[0] / 1e3, "staging_wait_us": (sub_row[3] >> 16) / 1e3,
            "ring_wait_us": sub_row[1] / 1e3, "epilogue_us": epi / 1e3, "pre_us": pre / 1e3,
            "rest_us": (prof_row[2] - prof_row[1] - sub_row[0] - sub_row[1] - epi - pre) / 1e3,
            "tiles": sub_row[3] & 0xFFFF}


def shard_arg(text: str) -> tuple[int, int]:
    """``--shard TP,RANK`` as (tp, rank); argparse.ArgumentTypeError (exit 2, one line) for anything else."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdecimal() for p in parts):
        raise argparse.ArgumentTypeError(f"expected TP,RANK (two integers, e.g. 8,0), got {text!r:.40}")
    return int(parts[0]), int(parts[1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--gemv", choices=("fma", "mma"), default=None, help="GEMV path (default: the model's)")
    ap.add_argument("--shard", default=None, metavar="TP,RANK", type=shard_arg,
                    help="profile rank RANK's shard at tensor-parallel size TP as a model of its own (its step "
                         "without the all-reduces, as scripts/shard_bench.py times it)")
    a = ap.parse_args(argv)
    from onekernel.dist.sharding import shard_config
    from onekernel.errors import OneKernelError
    from onekernel.models.config import get_config

    try:  # the command line first (any machine), then the GPU and the model: one line and exit code 2
        if a.batch < 1 or a.context < 1 or (a.workers is not None and a.workers < 1):
            raise ValueError(f"--batch, --context and --workers must be positive, got {a.batch}, {a.context} and "
                             f"{a.workers}")
        if a.shard:  # a config name (a file's model loads on the GPU below)
            shard_config(get_config(a.model), *a.shard)
        if not torch.cuda.is_available():
            raise OneKernelError("stream_profile profiles the streaming megakernel on a CUDA GPU; "
                                 "this machine has none")
        if a.shard:
            from tp_common import shard_as_model

            tp, rank = a.shard
            model = shard_as_model(a.model, tp, rank)
            a.model = f"{a.model}-tp{tp}.{rank}"
        else:
            model = load_model(a.model, random_weights=True, dtype=torch.bfloat16, device="cuda", seed=0)
    except (OneKernelError, ValueError) as e:
        print(f"stream_profile: {e}", file=sys.stderr)
        sys.exit(2)
    # the benchmark's cache (bench.modes.bench_modes): CONTEXT positions, each step writing the last, so the same
    # split-KV tiles (before session 41: CONTEXT + 64 positions, writing position CONTEXT)
    cache = KVCache(model.config, a.batch, a.context, torch.bfloat16, "cuda")
    cache.seq_lens.fill_(a.context - 1)
    r = make_step_runner("megakernel", model, cache, backend="gluon", profile=True, use_cuda_graph=False,
                         n_workers=a.workers, gemv=a.gemv)
    tok = torch.zeros(a.batch, dtype=torch.int32, device="cuda")
    for _ in range(5):
        r.step(tok)
    torch.cuda.synchronize()
    r.check()
    prof = r.prof.cpu().tolist()
    g = r.task_graph
    t0 = min(p[0] for p in prof)
    total = (max(p[2] for p in prof) - t0) / 1e3
    ops, kinds = [], defaultdict(list)
    for op in g.ops:
        st = [prof[t] for t in op.task_ids]
        dur = [(p[2] - p[1]) / 1e3 for p in st]
        kinds[op.kind.name].extend(dur)
        pbar, pub = zip(*((b / 1e3, w / 1e3) for b, w in (publish_of(p[3]) for p in st)))  # barrier, whole publish
        ops.append({"op": op.name, "tasks": len(st), "publish_us": statistics.median(pub),
                    "publish_barrier_us": statistics.median(pbar),
                    "first_start_us": (min(p[0] for p in st) - t0) / 1e3,
                    "last_ready_us": (max(p[1] for p in st) - t0) / 1e3, "last_end_us": (max(p[2] for p in st) - t0) / 1e3,
                    "median_task_us": statistics.median(dur), "max_task_us": max(dur)})
    per_kind = {k: {"median_us": statistics.median(v), "max_us": max(v), "tasks": len(v)} for k, v in kinds.items()}
    # inside the tensor-core GEMV tasks (runner.prof_sub, exec.stream_mma.gemv_mma): medians per op kind
    inside = defaultdict(lambda: defaultdict(list))
    sub = r.prof_sub.cpu().tolist() if hasattr(r, "prof_sub") else []
    attn_inside = defaultdict(list)  # the attention tasks' own row (exec.stream_attn.attn_task)
    for op in (o for o in g.ops if o.kind.name == "attn_partial"):
        for t in op.task_ids:
            if t < len(sub):
                v = sub[t]
                for name, x in zip(("to_loop_us", "blocks_us", "warp_merges_us", "arrive_merge_us", "copy_wait_us",
                                    "to_p_us"), (v[0], v[1] & 0xFFFFFFFF, v[2] & 0xFFFFFFFF, v[3] & 0xFFFFFFFF,
                                                 v[1] >> 32, v[2] >> 32)):
                    attn_inside[name].append(x / 1e3)  # bits above 32 of v[1], v[2]: stream_attn_tc only
                attn_inside["blocks"].append(v[3] >> 32)
    for op in g.ops:
        if op.kind.name == "attn_partial":
            continue
        for t in op.task_ids:
            if t < len(sub) and sub[t][3] > 0:  # tiles staged: a tensor-core GEMV task
                for name, v in gemv_sub_times(prof[t], sub[t]).items():
                    inside[op.kind.name][name].append(v)
                    if op.name.endswith(".1"):  # layer 1's ops one by one (o_proj and down apart)
                        inside[op.name][name].append(v)
    gemv_inside = {k: {n: statistics.median(v) for n, v in d.items()} for k, d in inside.items()}
    attn_in = {n: statistics.median(v) for n, v in attn_inside.items() if v}
    busy = defaultdict(float)
    for p in prof:
        busy[sm_of(p[3])] += (p[2] - p[1]) / 1e3
    res = {"model": a.model, "batch": a.batch, "step_us": total, "per_kind": per_kind,
           "worker_busy_us": {"median": statistics.median(busy.values()), "max": max(busy.values())},
           "ops": ops, "gemv_inside": gemv_inside, "attn_inside": attn_in}
    sel = [o for o in ops if o["op"].endswith(".1") or "lm_head" in o["op"] or o["op"] == "embed"]
    print(f"{a.model} b{a.batch}: step {total:.1f} us; busy per worker median {res['worker_busy_us']['median']:.1f} us")
    for k, v in per_kind.items():
        print(f"  {k:14s} tasks {v['tasks']:6d} median {v['median_us']:7.2f} us  max {v['max_us']:7.2f} us")
    for k, v in gemv_inside.items():
        print(f"  inside {k:14s} staging {v['staging_us']:6.2f} (waiting {v['staging_wait_us']:5.2f}) ring wait"
              f" {v['ring_wait_us']:6.2f} epilogue {v['epilogue_us']:6.2f} before block 1 {v['pre_us']:5.2f} rest"
              f" {v['rest_us']:6.2f} us, tiles"
              f" {v['tiles']:.0f} (medians)")
    if attn_in:
        print(f"  inside attn_partial  to loop {attn_in['to_loop_us']:5.2f} blocks {attn_in['blocks_us']:6.2f}"
              f" warp merges {attn_in['warp_merges_us']:5.2f} arrive+merge {attn_in['arrive_merge_us']:5.2f} us, blocks"
              f" {attn_in['blocks']:.0f} (medians)")
        if attn_in.get("copy_wait_us") or attn_in.get("to_p_us"):
            print(f"  inside attn blocks   copy waits {attn_in['copy_wait_us']:5.2f} wait end to P {attn_in['to_p_us']:5.2f}"
                  " us (tensor-core attention)")
    for o in sel:
        print(f"  {o['op']:20s} start {o['first_start_us']:8.1f} ready {o['last_ready_us']:8.1f} end {o['last_end_us']:8.1f}"
              f"  task median {o['median_task_us']:6.2f} max {o['max_task_us']:6.2f} publish {o['publish_us']:5.2f}"
              f" (barrier {o['publish_barrier_us']:5.2f})")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"stream_profile_{a.model}_b{a.batch}.json").write_text(json.dumps(res, indent=1))
    torch.save(r.prof.cpu(), Path(a.out) / f"stream_prof_{a.model}_b{a.batch}.pt")  # raw stamps, task_graph order
    from onekernel.profile.trace import timeline_png

    timeline_png(g, r.prof, Path(a.out) / f"stream_profile_{a.model}_b{a.batch}.png",
                 title=f"{a.model} batch {a.batch}: one streaming-megakernel step ({total:.0f} us), tasks per SM")


if __name__ == "__main__":
    main()
