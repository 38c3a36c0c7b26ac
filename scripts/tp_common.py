"""What the multi-GPU scripts (tp_sm_study.py, tp_profile.py) share: starting the ranks under torchrun (``--tp``
of their command line, default 2), and one rank's shard of a model with random bf16 weights (seed 0: every rank
draws the same full tensors one at a time and keeps its shard: ``dist.sharding.load_shard``); and, for the
one-GPU scripts (shard_bench.py, stream_profile.py --shard), a rank's shard as a model of its own."""
from __future__ import annotations

import os
import socket
import sys


def add_tp_argument(ap) -> None:
    ap.add_argument("--tp", type=int, default=2, help="ranks (one GPU each), 2..8")


def relaunch_under_torchrun(script: str, n: int | None = None) -> None:
    """Unless already in a rank (WORLD_SIZE set): exec ``torch.distributed.run`` with ``n`` processes (default: the
    ``--tp N`` / ``--tp=N`` of this process's arguments, else 2) running ``script`` with this process's arguments,
    on a free port, NVLink multicast off. Returns only in a rank."""
    if "WORLD_SIZE" in os.environ:
        return
    if n is None:
        n = 2
        for i, arg in enumerate(sys.argv):
            if arg == "--tp" and i + 1 < len(sys.argv):
                n = int(sys.argv[i + 1])
            elif arg.startswith("--tp="):
                n = int(arg.split("=", 1)[1])
    from onekernel.dist.process import NO_MULTICAST

    os.environ.update(NO_MULTICAST)
    os.environ.setdefault("ONEKERNEL_TP_TIMEOUT", "50")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                              "--master-addr", "127.0.0.1", "--master-port", str(port), script, *sys.argv[1:]])


def load_shard(name: str, n: int, rank: int, dev, dtype):
    """(the rank's ShardedModel, its TPGroup) of ``name`` with random weights."""
    import torch

    from onekernel.dist.sharding import load_shard as load, shard_config
    from onekernel.dist.tp_reference import TPGroup
    from onekernel.models.load import open_model

    files = open_model(name, random_weights=True)
    shard = shard_config(files.config, n, rank)
    model = load(files, shard, random_weights=True, dtype=dtype, device=dev, seed=0)
    torch.cuda.empty_cache()
    return model, TPGroup(shard)


def shard_as_model(name: str, tp: int, rank: int, seed: int = 0, layers: int | None = None):
    """Rank ``rank``'s shard of config ``name`` at tensor-parallel size ``tp`` as a plain LoadedModel on the GPU: the
    shard's config (``dist.sharding.shard_config``; its first ``layers`` layers when given, as tests/test_stream_gpu.py
    takes two) with random bf16 weights of its shapes (``seed``), for the single-GPU runners (which refuse a
    ShardedModel): its step is the rank's without the all-reduces. Raises what ``shard_config`` raises."""
    import dataclasses

    import torch

    from onekernel.dist.sharding import shard_config
    from onekernel.models.config import get_config
    from onekernel.models.load import LoadedModel
    from onekernel.models.random_init import random_weights
    from onekernel.models.tokenizer import Tokenizer

    cfg = shard_config(get_config(name), tp, rank).config
    if layers is not None:
        cfg = dataclasses.replace(cfg, n_layers=layers)
    return LoadedModel(cfg, random_weights(cfg, torch.bfloat16, "cuda", seed), Tokenizer.byte_level(), cfg.name)
