"""``onekernel graph | profile | bench``: inspect the decode-step graph, profile one step, time every mode."""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from onekernel.bench.modes import BASELINES, MODE_VARIANTS, variant_options
from onekernel.cli_tp import add_tp_argument
from onekernel.errors import DeviceError, InputError
from onekernel.exec import MODES as GPU_MODES
from onekernel.ops.tiling import MAX_BATCH
from onekernel.runtime.args import add_gemv_argument


def _add_model(p: argparse.ArgumentParser, batch_help: str, weights: bool = True) -> None:
    """The options every tool shares; ``batch_help`` is the tool's own wording of --batch; ``weights``: the tool
    loads weights (--random-weights, --seed)."""
    p.add_argument("--model", default=None, metavar="PATH|NAME", help="a .gguf, an HF folder or a config name")
    if weights:
        p.add_argument("--random-weights", action="store_true", help="random weights for the named config")
        p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--batch", default="1", help=batch_help)
    p.add_argument("--context", type=int, default=None,
                   help="KV cache positions, all of which every sequence attends over (bench --fill: fewer) "
                        "(default: 512, or the model's context if smaller)")


def _check_int(value, flag: str, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi], else InputError naming ``flag``."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise InputError(f"{flag} must be between {lo} and {hi}, got {v}")
    return v


def _context(args, cfg) -> int:
    """--context, defaulting to min(512, the model's context), checked against the model's context."""
    return _check_int(args.context if args.context is not None else min(512, cfg.max_seq_len), "--context", 1,
                      cfg.max_seq_len)


def _add_graph(p):
    _add_model(p, f"batch size the graph is built for (1..{MAX_BATCH})", weights=False)
    p.add_argument("--workers", type=int, default=132,
                   help="megakernel workers (one per SM): the graph is tiled as the megakernel's, and scheduled")
    p.add_argument("--events", choices=("tile", "op"), default="tile",
                   help="dependency events per tile, or one per op")


def _run_graph(args) -> int:
    import torch

    from onekernel.graph.deps import derive_dependencies, derive_events, derive_op_events
    from onekernel.graph.paths import summary
    from onekernel.graph.deps import transitive_reduction
    from onekernel.graph.schedule import critical_path_list, validate
    from onekernel.exec import DEFAULT_TILING
    from onekernel.models.decode_graph import decode_graph
    from onekernel.models.load import open_model
    from onekernel.ops.tiling import Tiling

    batch = _check_int(args.batch, "--batch", 1, MAX_BATCH)
    workers = _check_int(args.workers, "--workers", 1, 4096)
    cfg = open_model(args.model, random_weights=True).config  # the config only: no weights are read
    g, _, _ = decode_graph(cfg, batch, _context(args, cfg), torch.bfloat16,
                           tiling=Tiling(workers, DEFAULT_TILING["megakernel"]))
    deps = transitive_reduction(derive_dependencies(g))
    ev = (derive_events if args.events == "tile" else derive_op_events)(g, deps)
    print(summary(g, deps, ev))
    s = critical_path_list(g, deps, workers)
    validate(s, g, deps)
    lens = [len(q) for q in s.queues]
    print(f"schedule (critical_path, {workers} workers): valid; tasks per worker min {min(lens)} "
          f"max {max(lens)}")
    return 0


def _add_profile(p):
    _add_model(p, f"batch size of the profiled step (1..{MAX_BATCH})")
    p.add_argument("--mode", choices=("eager", "graph", "pdl", "megakernel"), default="megakernel")
    p.add_argument("--out", default="profile_out", help="folder for trace.json and timeline.png")


def _load(args):
    import torch

    from onekernel.models.load import load_model
    if not torch.cuda.is_available():
        raise DeviceError("profiling and benchmarking time GPU kernels and need a CUDA GPU; on this machine use "
                          "`onekernel graph` to inspect the task graph, or `onekernel generate --interpret`")
    return load_model(args.model, random_weights=args.random_weights, dtype=torch.bfloat16, device="cuda",
                      seed=args.seed)


def _run_profile(args) -> int:
    import torch

    from onekernel.profile.trace import breakdown, perfetto, timeline_png
    from onekernel.runtime.kv_cache import KVCache
    from onekernel.runtime.runners import make_step_runner

    b = _check_int(args.batch, "--batch", 1, MAX_BATCH)
    model = _load(args)
    ctx = _context(args, model.config)
    cache = KVCache(model.config, b, ctx, torch.bfloat16, "cuda")
    cache.seq_lens.fill_(ctx - 1)
    r = make_step_runner(args.mode, model, cache, profile=True)
    tok = torch.zeros(b, dtype=torch.int32, device="cuda")
    for _ in range(5):
        r.step(tok)
    torch.cuda.synchronize()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    perfetto(r.graph, r.prof, out / "trace.json", args.mode)
    timeline_png(r.graph, r.prof, out / "timeline.png", f"{model.config.name} {args.mode} batch {b}")
    bd = breakdown(r.graph, r.prof, torch.cuda.get_device_properties(0).multi_processor_count)
    print(f"step span {bd['span_us']:.1f} us over {bd['n_sm']} SMs: computing {bd['computing_pct']:.1f}%, "
          f"waiting on dependencies {bd['waiting_pct']:.1f}%, idle {bd['idle_pct']:.1f}%; "
          f"gaps between ops {bd['launch_gaps_us']:.1f} us")
    for k, v in sorted(bd["computing_by_kind_us"].items(), key=lambda kv: -kv[1]):
        print(f"  {k:14s} {v / bd['n_sm']:8.1f} us per SM")
    print(f"wrote {out / 'trace.json'} (open in ui.perfetto.dev) and {out / 'timeline.png'}")
    return 0


BASELINE_MODES = tuple(BASELINES)
BENCH_MODES = (*BASELINE_MODES, *GPU_MODES, "megakernel-triton")   # the default --modes
# on request: the other MODE_VARIANTS rows (Hopper): the streaming megakernel where "auto" keeps the Triton one, and
# graph / pdl on the streaming kernel's bodies, one kernel per op (pdl-gluon-layer: per layer)
EXTRA_MODES = tuple(m for m in MODE_VARIANTS if m not in BENCH_MODES)


def _add_bench(p):
    _add_model(p, f"comma-separated batch sizes, each timed (1..{MAX_BATCH}; e.g. 1,8)")
    p.add_argument("--modes", default=",".join(BENCH_MODES),
                   help=f"comma-separated, of {', '.join(BENCH_MODES + EXTRA_MODES)}")
    p.add_argument("--steps", type=int, default=200, help="timed steps per mode (median reported; at least 200 "
                                                           "for published numbers)")
    p.add_argument("--study", action="store_true",
                   help="instead of the modes: the causes study (startup overlap, prefetch, event granularity, "
                        "workers, launch gaps) on graph/pdl/megakernel variants, with a markdown report")
    p.add_argument("--variants", default=None, metavar="A,B",
                   help="with --study: only these variants (default all; a wrong name lists the valid ones)")
    p.add_argument("--fill", type=int, default=None, metavar="N",
                   help="positions every sequence has written, in a KV cache of --context positions (default: all "
                        "of them): a serving cache holds more positions than its sequences have filled")
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON, markdown and PNG results")
    add_gemv_argument(p)
    add_tp_argument(p)


def _bench_args(args) -> tuple[list[int], list[str]]:
    """Parse and check --batch, --modes, --steps, --context before anything runs."""

    try:
        batches = [int(x) for x in args.batch.split(",")]
    except ValueError:
        raise InputError(f"--batch must be comma-separated integers, got {args.batch!r}") from None
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes:
        raise InputError(f"--modes is empty; pass a comma-separated list of {', '.join(BENCH_MODES + EXTRA_MODES)}")
    known = BENCH_MODES + EXTRA_MODES
    bad = [m for m in modes if m not in known] if getattr(args, "tp", 1) == 1 else []  # --tp N: cli_tp checks
    if bad:
        raise InputError(f"unknown mode(s) {bad} in --modes; choose from {', '.join(known)}")
    if args.steps < 1:
        raise InputError(f"--steps must be >= 1 (200 or more for published numbers), got {args.steps}")
    bad = [b for b in batches if not 1 <= b <= MAX_BATCH]
    if bad:
        raise InputError(f"every --batch must be between 1 and {MAX_BATCH}, got {', '.join(map(str, bad))}")
    if args.context is not None and args.context < 2:
        raise InputError(f"--context must be >= 2, got {args.context}")
    if args.fill is not None:
        if args.fill < 1 or (args.context is not None and args.fill > args.context):
            limit = args.context if args.context is not None else "512, or the model's context if smaller"
            raise InputError(f"--fill must be between 1 and --context ({limit}), got {args.fill}")
        if args.study or args.tp != 1:
            raise InputError("--fill applies to the single-GPU bench's modes, not to --study or --tp")
    return batches, modes


def _run_bench(args) -> int:
    import torch
    import triton

    from onekernel.bench.chart import bench_chart
    from onekernel.bench.modes import bench_modes
    from onekernel.bench.progress import progress
    from onekernel.bench.report import bench_table, commit_id, reserve_stem, study_report
    from onekernel.bench.study import pick_variants, run_study, variant_names
    from onekernel.bench.timing import copy_bandwidth_gbs

    batches, modes = _bench_args(args)
    if args.tp != 1:
        from onekernel.cli_tp import run_bench_tp
        return run_bench_tp(args, batches, lambda cfg: _context(args, cfg), args.modes != ",".join(BENCH_MODES))
    if args.gemv is not None and args.study:
        raise InputError("--gemv applies to the bench's modes; the --study variants use the model's default path")
    if args.gemv is not None:  # a bench row that fixes its GEMV path refuses --gemv before anything loads
        for m in modes:
            variant_options(m, {"gemv": args.gemv})
    if args.variants is not None and not args.study:
        raise InputError("--variants selects study variants; add --study, or use --modes for the bench")
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    only = pick_variants(args.variants, n_sm) if args.study else None
    model = _load(args)
    args.context = _context(args, model.config)
    if args.fill is not None and args.fill > args.context:
        raise InputError(f"--fill must be at most --context ({args.context}), got {args.fill}")
    bw = copy_bandwidth_gbs()
    props = torch.cuda.get_device_properties(0)
    commit = commit_id()
    meta = {"gpu": props.name, "torch": torch.__version__, "triton": triton.__version__, "commit": commit,
            "date": time.strftime("%Y-%m-%d"), "copy_gbs": bw}
    name = model.config.name
    out = Path(args.out)  # made by reserve_stem below
    stem = f"{'study' if args.study else 'bench'}-{meta['date']}-{name}-{commit or 'nocommit'}"
    if only is not None:  # a subset never overwrites the full study's files
        stem += "-" + hashlib.sha1(",".join(sorted(only)).encode()).hexdigest()[:6]
    partial: list[dict] = []
    opts = {m: {"gemv": args.gemv} for m in modes if m not in BASELINE_MODES} if args.gemv else None
    if args.gemv:  # the two paths' records must not overwrite each other
        stem += f"-{args.gemv}"
    if getattr(args, "random_weights", False):  # nor a config's random weights and its real checkpoint (run 19)
        stem += "-random"
    if args.fill is not None:  # one fill at several cache lengths: one file each
        stem += f"-ctx{args.context}-fill{args.fill}"
    stem = reserve_stem(out, stem)  # another run of the same day, model and commit keeps its files

    def keep(done):  # every record is written as soon as it exists: a run stopped early keeps what it measured
        def f(rec):
            partial.append({**meta, **rec})
            (out / f"{stem}.json").write_text(json.dumps(partial, indent=1))
            done(rec)
        return f

    from onekernel.cli_compile import note_when_slow

    with note_when_slow(name):  # a kernel compiling (a first run) gets a line: what, and where it is kept
        if args.study:
            total = len(batches) * len(only if only is not None else variant_names(n_sm))
            with progress(total, f"study {name}") as (started, done):
                records = run_study(model, name, batches, args.context, bw, steps=args.steps, n_sm=n_sm,
                                    started=started, progress=keep(done), only=only)
        else:
            records = []
            with progress(len(batches) * len(modes), f"bench {name}") as (started, done):
                for b in batches:
                    records += bench_modes(model, name, b, args.context, modes, bw, steps=args.steps, options=opts,
                                           progress=keep(done), started=lambda m, b=b: started(f"batch {b}: {m}"),
                                           fill=args.fill)
    records = [{**meta, **r} for r in records]
    (out / f"{stem}.json").write_text(json.dumps(records, indent=1))
    timed = [r for r in records if not r.get("profiled")]
    bench_chart(timed, out / f"{stem}.png", key="variant" if args.study else "mode")
    table = bench_table([{**r, "mode": r.get("variant", r["mode"])} for r in timed])
    if args.fill is not None and not args.study:
        table = f"KV cache of {args.context} positions, {args.fill} filled per sequence\n\n{table}"
    (out / f"{stem}.md").write_text((study_report(records) if args.study else table) + "\n")
    print(table)
    print(f"wrote {out / stem}.json, .md and .png")
    return 0


TOOLS = {
    "graph": ("print the decode-step task graph: ops, tasks, dependencies, bytes per step", _add_graph, _run_graph),
    "profile": ("per-task timestamps of one decode step: Perfetto trace, timeline PNG, breakdown",
                _add_profile, _run_profile),
    "bench": ("per-step latency of every mode and the PyTorch baselines in one run (--study: the causes)",
              _add_bench, _run_bench),
}
