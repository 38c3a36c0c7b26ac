"""What the two-GPU scripts (tp_sm_study.py, tp_profile.py) share: starting the ranks under torchrun, and one
rank's shard of a model with random bf16 weights (seed 0: every rank draws the same full weights, keeps its
shard)."""
from __future__ import annotations

import os
import socket
import sys


def relaunch_under_torchrun(script: str, n: int = 2) -> None:
    """Unless already in a rank (WORLD_SIZE set): exec ``torch.distributed.run`` with ``n`` processes running
    ``script`` with this process's arguments, on a free port, NVLink multicast off. Returns only in a rank."""
    if "WORLD_SIZE" in os.environ:
        return
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
    from onekernel.dist.sharding import ShardedModel, shard_config, shard_weights
    from onekernel.dist.tp_reference import TPGroup
    from onekernel.models.load import open_model

    files = open_model(name, random_weights=True)
    full = files.load(random_weights=True, dtype=dtype, device=dev, seed=0)
    shard = shard_config(files.config, n, rank)
    model = ShardedModel(shard.config, shard_weights(shard, full.weights), files.tokenizer, name, shard)
    del full
    import torch

    torch.cuda.empty_cache()
    return model, TPGroup(shard)
