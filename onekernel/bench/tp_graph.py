"""The PyTorch tensor-parallel + CUDA graph baseline ("torch+graph" at --tp N): one rank's
``runtime.reference.decode_one_token`` with ``dist.tp_reference``'s collectives (NCCL all-reduces of the
embedding, O-projection and down outputs; all-gathered logits; distributed argmax), captured in one
``torch.cuda.CUDAGraph`` with the NCCL calls inside and replayed every step (``bench.baselines``'
TorchGraphRunner, sharded).
"""
from __future__ import annotations

import torch

from onekernel.errors import DeviceError
from onekernel.models.config import rope_inv_freq
from onekernel.runtime.reference import decode_one_token


class TPTorchGraphRunner:
    """``step(tokens int32 [B], global ids) -> (logits float32 [B, V] (whole vocabulary), next_tokens int32
    [B])``, both static tensors of the graph, overwritten by the next step; ``model``: the rank's ShardedModel on
    its GPU, ``cache``: a KVCache of its local config, ``group``: its TPGroup. The first step warms up (twice,
    on a side stream, NCCL included) and captures; every rank must step in the same order. Raises DeviceError
    off a GPU; RankError from a collective of the warm-up."""

    mode = "torch+graph"

    def __init__(self, model, cache, group):
        if cache.k.device.type != "cuda":
            raise DeviceError("torch+graph captures a CUDA graph; it needs the rank's GPU")
        self.model, self.cache, self.group = model, cache, group
        self.tokens = torch.zeros(cache.batch, dtype=torch.int32, device=cache.k.device)
        self.inv_freq = rope_inv_freq(model.config).to(device=cache.k.device, dtype=torch.float32)
        self.graph = None

    @torch.no_grad()
    def _step(self):
        c, g = self.cache, self.group
        local = decode_one_token(self.model.config, self.model.weights, c.k, c.v, c.seq_lens, self.tokens,
                                 self.inv_freq, tp=g)
        return g.gather_logits(local), g.argmax(local)

    def step(self, tokens):
        self.tokens.copy_(tokens)
        if self.graph is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits, self.next = self._step()
        self.graph.replay()
        return self.logits, self.next

    def check(self) -> None:
        """Nothing to check: the collectives' errors come from the NCCL watchdog."""

    poll = check
