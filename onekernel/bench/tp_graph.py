"""The PyTorch tensor-parallel + CUDA graph baseline ("torch+graph" at --tp N): one rank's
``runtime.reference.decode_one_token`` with ``dist.tp_reference``'s collectives (NCCL all-reduces of the
embedding, O-projection and down outputs; all-gathered logits; distributed argmax), captured in one
``torch.cuda.CUDAGraph`` with the NCCL calls inside and replayed every step (``bench.baselines``'
TorchGraphRunner, sharded).
"""
from __future__ import annotations

import torch

from onekernel.bench.baselines import TorchGraphRunner
from onekernel.errors import DeviceError
from onekernel.runtime.reference import decode_one_token


class TPTorchGraphRunner(TorchGraphRunner):
    """``step(tokens int32 [B], global ids) -> (logits float32 [B, V] (whole vocabulary), next_tokens int32
    [B])``, both static tensors of the graph, overwritten by the next step; ``model``: the rank's ShardedModel on
    its GPU, ``cache``: a KVCache of its local config, ``group``: its TPGroup. The first step warms up (twice,
    on a side stream, NCCL included) and captures; every rank must step in the same order. Raises DeviceError
    off a GPU; RankError from a collective of the warm-up."""

    def __init__(self, model, cache, group):
        if cache.k.device.type != "cuda":
            raise DeviceError("torch+graph captures a CUDA graph; it needs the rank's GPU")
        super().__init__(model, cache)
        self.group = group

    @torch.no_grad()
    def _step(self):
        c, g = self.cache, self.group
        local = decode_one_token(self.model.config, self.model.weights, c.k, c.v, c.seq_lens, self.tokens,
                                 self.inv_freq, tp=g)
        return g.gather_logits(local), g.argmax(local)
