"""``--tp N`` of ``onekernel generate`` and ``onekernel bench``: the checks before anything loads, starting the
ranks (``dist.process.launch``) or, inside a rank (torchrun's or ours), joining the group and loading the
rank's shard. Rank 0 prints; the other ranks' stdout is dropped and their progress display is off."""
from __future__ import annotations

import os
import sys

from onekernel.dist.allreduce import ALLREDUCES, check_allreduce
from onekernel.dist.process import RankInfo, close_rank, in_rank, init_rank, launch
from onekernel.dist.sharding import check_tp, load_shard, shard_config
from onekernel.dist.tp_reference import TPGroup, check_tp_mode
from onekernel.errors import DeviceError, InputError


def add_tp_argument(p) -> None:
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel size: N processes (one per GPU on cuda), started by onekernel or by "
                        "`torchrun --nproc-per-node N -m onekernel ...`; modes reference, eager, graph, pdl, "
                        "megakernel (its all-reduces are tile tasks over symmetric memory)")
    p.add_argument("--allreduce", default=None, metavar="|".join(ALLREDUCES),
                   help="with --tp > 1, the kernel modes' all-reduce: nccl (torch.distributed, captured in the CUDA "
                        "graph), symm (PyTorch symmetric memory's one-shot kernel; GPUs only) or oneshot (onekernel's "
                        "own one-shot all-reduce kernels, in the PDL chain and the CUDA graph; GPUs only); default "
                        "nccl (bench: all three)")


def check_tp_options(args, mode: str | None, device: str) -> None:
    """The --tp options' checks before anything loads: the mode (None: bench checks its own), --allreduce.
    Raises InputError."""
    if mode is not None:
        check_tp_mode(mode)
    if mode == "megakernel" and args.tp > 1 and device != "cuda":
        raise InputError("--mode megakernel at --tp > 1 runs on GPUs (its ranks read each other's symmetric "
                         "memory); on the CPU use --mode eager --interpret or --mode reference (the interpreter "
                         "test of the TP megakernel shares CPU memory between its processes: "
                         "tests/test_tp_megakernel.py)")
    if args.allreduce is None:
        return
    if args.tp == 1:
        raise InputError("--allreduce applies at --tp > 1 only; drop it or add --tp 2")
    if mode == "reference":
        raise InputError("--allreduce applies to the kernel modes (eager, graph, pdl) at --tp > 1; the reference "
                         "mode all-reduces through torch.distributed")
    if mode == "megakernel":
        raise InputError("--allreduce applies to the kernel modes (eager, graph, pdl) at --tp > 1; the megakernel's "
                         "all-reduces are its own tile tasks")
    check_allreduce(args.allreduce, device)


def launch_tp(args, mode: str, device: str, check=None) -> int:
    """Outside a rank: check --tp against the mode, the device's GPUs and the model's config, and run
    ``check(files)`` (the command's own checks) on the model's files (config and tokenizer, not its weights),
    then run ``args._argv`` as args.tp ranks; returns rank 0's exit code. Raises InputError (mode, a --tp < 1),
    UnsupportedModelError (the head counts or FFN size), DeviceError (more ranks than GPUs), what ``check``
    raises, RankError (a rank failed)."""
    from onekernel.models.load import open_model

    check_tp_options(args, mode, device)
    files = open_model(args.model, random_weights=args.random_weights)
    check_tp(files.config, args.tp, device)
    if check is not None:
        check(files)
    return launch(args.tp, args._argv)


def join_tp(args, mode: str, device: str) -> RankInfo:
    """Inside a rank: check the mode, join the process group (``process.init_rank``) and, on a rank other than
    0, drop stdout and the progress display. Returns the RankInfo."""
    check_tp_options(args, mode, device)
    info = init_rank(args.tp, device)
    if info.rank != 0:
        args.quiet = True
        sys.stdout = open(os.devnull, "w")
    return info


def load_rank(files, info: RankInfo, tp: int, allreduce: str = "nccl", **load_args):
    """The rank's ShardedModel (``sharding.load_shard``; ``load_args`` as ``ModelFiles.load``) and its TPGroup
    (its kernel modes' default ``allreduce``). Raises what ``check_tp`` and ``ModelFiles.load`` raise."""
    check_tp(files.config, tp, info.device.type)
    shard = shard_config(files.config, tp, info.rank)
    return load_shard(files, shard, device=info.device, **load_args), TPGroup(shard, allreduce)


def start(args, mode: str, device: str, check=None):
    """The --tp step of a command: None for --tp 1; outside a rank, the exit code of the launched ranks (an int);
    inside a rank, its RankInfo. ``check(files)``: see launch_tp. Raises InputError for --tp < 1 (and what
    launch_tp / join_tp raise)."""
    if args.tp < 1:
        raise InputError(f"--tp must be >= 1, got {args.tp}")
    if args.tp == 1:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if in_rank() and world > 1:  # torchrun started several processes: each would run the whole job
            raise InputError(f"{world} processes were started (WORLD_SIZE={world}) but --tp is 1, so each would run "
                             f"the whole job; pass --tp {world} (tensor parallel over them) or run one process")
        check_tp_options(args, None, device)
        return None
    return join_tp(args, mode, device) if in_rank() else launch_tp(args, mode, device, check)


def run_bench_tp(args, batches: list[int], context_of, modes_given: bool) -> int:
    """``onekernel bench --tp N``: the tensor-parallel step timed at each batch on N GPUs in torch, torch+graph,
    eager, graph, pdl and megakernel (``bench.tp``; the kernel modes with --allreduce, default each of nccl, symm and oneshot); rank 0
    prints the table and writes ``bench-tp{N}-DATE-MODEL-COMMIT[-GEMV].json`` and ``.md`` under --out (the JSON
    after every record; -GEMV when --gemv is given, as at --tp 1). ``context_of(cfg)`` is the checked --context;
    ``modes_given``: --modes was passed (then a subset of ``bench.tp.TP_BENCH_MODES``); --gemv: the onekernel
    modes' GEMV path (default the model's). Raises InputError (--study, another mode, --allreduce),
    DeviceError (no GPU, more ranks than GPUs), UnsupportedModelError (head counts), before anything loads."""
    import json
    import time
    from pathlib import Path

    import torch

    from onekernel.bench.report import commit_id, reserve_stem
    from onekernel.bench.tp import TP_BENCH_MODES, bench_tp, tp_table
    from onekernel.models.load import open_model

    if args.study:
        raise InputError("--study runs at --tp 1 only; drop --tp or --study")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if modes_given else list(TP_BENCH_MODES)
    bad = [m for m in modes if m not in TP_BENCH_MODES]
    if bad:
        raise InputError(f"--tp {args.tp} times {', '.join(TP_BENCH_MODES)} (not {', '.join(bad)}); pass --modes "
                         f"with those")
    if not torch.cuda.is_available():
        raise DeviceError("bench --tp times GPU ranks and needs CUDA GPUs (one per rank); on this machine use "
                          "`onekernel generate --tp N` (the reference mode over gloo)")
    rank = start(args, None, "cuda")
    if isinstance(rank, int):
        return rank
    files = open_model(args.model, random_weights=args.random_weights)
    model, group = load_rank(files, rank, args.tp, random_weights=args.random_weights, dtype=torch.bfloat16,
                             seed=args.seed)
    commit = commit_id()
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": commit,
            "date": time.strftime("%Y-%m-%d")}
    out = Path(args.out)
    stem = f"bench-tp{args.tp}-{meta['date']}-{files.config.name}-{commit or 'nocommit'}"
    stem += f"-{args.gemv}" if args.gemv else ""  # the two paths' records apart
    path = out / f"{reserve_stem(out, stem) if rank.rank == 0 else stem}.json"  # only rank 0 writes
    done: list[dict] = []

    def keep(rec):  # rank 0 writes every record as soon as it exists: a run stopped early keeps what it measured
        done.append({**meta, **rec})
        if rank.rank == 0:  # its reserve_stem made out
            path.write_text(json.dumps(done, indent=1))
            print(f"tp{args.tp} batch {rec['batch']} {rec['mode']} {rec['allreduce'] or ''}: "
                  f"{rec['ms_per_step'] or rec.get('error')}", file=sys.stderr, flush=True)

    allreduces = [args.allreduce] if args.allreduce else ["nccl", "symm", "oneshot"]
    records = bench_tp(model, group, batches, context_of(files.config), modes, allreduces, steps=args.steps,
                       progress=keep, gemv=args.gemv)
    close_rank()
    if rank.rank == 0:
        done = [{**meta, **r} for r in records]  # with ratio_to_torch_graph, set once a batch is done
        path.write_text(json.dumps(done, indent=1))
        path.with_suffix(".md").write_text(tp_table(done) + "\n")
        print(tp_table(done))
        print(f"wrote {path} and .md")
    return 0


__all__ = ["add_tp_argument", "close_rank", "load_rank", "run_bench_tp", "start"]
