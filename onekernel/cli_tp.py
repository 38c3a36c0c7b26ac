"""``--tp N`` of ``onekernel generate`` and ``onekernel bench``: the checks before anything loads, starting the
ranks (``dist.process.launch``) or, inside a rank (torchrun's or ours), joining the group and loading the
rank's shard. Rank 0 prints; the other ranks' stdout is dropped and their progress display is off."""
from __future__ import annotations

import os
import sys

from onekernel.dist.process import RankInfo, close_rank, in_rank, init_rank, launch
from onekernel.dist.sharding import check_tp, load_shard, shard_config
from onekernel.dist.tp_reference import TPGroup, check_tp_mode
from onekernel.errors import DeviceError, InputError


def add_tp_argument(p) -> None:
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel size: N processes (one per GPU on cuda), started by onekernel or by "
                        "`torchrun --nproc-per-node N -m onekernel ...`; for now the PyTorch reference step only "
                        "(generate --mode reference, bench --modes torch)")


def launch_tp(args, mode: str, device: str, check=None) -> int:
    """Outside a rank: check --tp against the mode, the device's GPUs and the model's config, and run
    ``check(files)`` (the command's own checks) on the model's files (config and tokenizer, not its weights),
    then run ``args._argv`` as args.tp ranks; returns rank 0's exit code. Raises InputError (mode, a --tp < 1),
    UnsupportedModelError (the head counts or FFN size), DeviceError (more ranks than GPUs), what ``check``
    raises, RankError (a rank failed)."""
    from onekernel.models.load import open_model

    check_tp_mode(mode)
    files = open_model(args.model, random_weights=args.random_weights)
    check_tp(files.config, args.tp, device)
    if check is not None:
        check(files)
    return launch(args.tp, args._argv)


def join_tp(args, mode: str, device: str) -> RankInfo:
    """Inside a rank: check the mode, join the process group (``process.init_rank``) and, on a rank other than
    0, drop stdout and the progress display. Returns the RankInfo."""
    check_tp_mode(mode)
    info = init_rank(args.tp, device)
    if info.rank != 0:
        args.quiet = True
        sys.stdout = open(os.devnull, "w")
    return info


def load_rank(files, info: RankInfo, tp: int, **load_args):
    """The rank's ShardedModel (``sharding.load_shard``; ``load_args`` as ``ModelFiles.load``) and its TPGroup.
    Raises what ``check_tp`` and ``ModelFiles.load`` raise."""
    check_tp(files.config, tp, info.device.type)
    shard = shard_config(files.config, tp, info.rank)
    return load_shard(files, shard, device=info.device, **load_args), TPGroup(shard)


def start(args, mode: str, device: str, check=None):
    """The --tp step of a command: None for --tp 1; outside a rank, the exit code of the launched ranks (an int);
    inside a rank, its RankInfo. ``check(files)``: see launch_tp. Raises InputError for --tp < 1 (and what
    launch_tp / join_tp raise)."""
    if args.tp < 1:
        raise InputError(f"--tp must be >= 1, got {args.tp}")
    if args.tp == 1:
        return None
    return join_tp(args, mode, device) if in_rank() else launch_tp(args, mode, device, check)


def run_bench_tp(args, batches: list[int], context_of, modes_given: bool) -> int:
    """``onekernel bench --tp N``: the tensor-parallel PyTorch step ("torch") timed at each batch on N GPUs
    (``bench.tp``); rank 0 prints the table and writes ``bench-tp{N}-DATE-MODEL.json`` under --out.
    ``context_of(cfg)`` is the checked --context; ``modes_given``: --modes was passed (it must then be "torch").
    Raises InputError (--study, another mode), DeviceError (no GPU,
    more ranks than GPUs), UnsupportedModelError (head counts), before anything loads."""
    import json
    import time
    from pathlib import Path

    import torch

    from onekernel.bench.tp import bench_tp, tp_table
    from onekernel.models.load import open_model

    if args.study:
        raise InputError("--study runs at --tp 1 only; drop --tp or --study")
    if modes_given and args.modes != "torch":
        raise InputError(f"--tp {args.tp} times the PyTorch tensor-parallel step only (--modes torch) for now; "
                         f"the kernel modes and torch+graph at --tp > 1 come with the GPU part of issue 13")
    if not torch.cuda.is_available():
        raise DeviceError("bench --tp times GPU ranks and needs CUDA GPUs (one per rank); on this machine use "
                          "`onekernel generate --tp N` (the reference mode over gloo)")
    rank = start(args, "reference", "cuda")
    if isinstance(rank, int):
        return rank
    files = open_model(args.model, random_weights=args.random_weights)
    model, group = load_rank(files, rank, args.tp, random_weights=args.random_weights, dtype=torch.bfloat16,
                             seed=args.seed)
    records = bench_tp(model, group, batches, context_of(files.config), steps=args.steps)
    close_rank()
    if rank.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"bench-tp{args.tp}-{time.strftime('%Y-%m-%d')}-{files.config.name}.json"
        path.write_text(json.dumps(records, indent=1))
        print(tp_table(records))
        print(f"wrote {path}")
    return 0


__all__ = ["add_tp_argument", "close_rank", "load_rank", "run_bench_tp", "start"]
