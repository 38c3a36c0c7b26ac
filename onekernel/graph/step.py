"""A decode-step graph bound to tensors: the one object every executor receives.

``models.decode_graph.build_decode_step`` builds it; executors (``onekernel.exec``) run it and never know which
model it came from. The caller owns the weights and the KV cache; the step owns its activations, scratch and
outputs and the ``tokens`` input. When a caller-owned tensor moves (the KV cache is reallocated), ``repoint``
swaps the new views in before the next run, so a stale address is never used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from onekernel.errors import InputError
from onekernel.graph.ir import Graph


@dataclass
class BoundStep:
    """graph: the decode step; tensors: buffer name -> tensor for every buffer of the graph.

    tokens: name of the input buffer int32 [B] (the token at position seq_lens[b] of each sequence, copied in
    by the runner before each run); logits / next_tokens: names of the outputs float32 [B, V] / int32 [B]
    (greedy argmax). external: () -> {buffer name: current tensor} for the caller-owned tensors that may move
    (KV-cache views, seq_lens); external_key: () -> a tuple that changes whenever one of them moved (addresses:
    cheap, called every step)."""

    graph: Graph
    tensors: dict[str, torch.Tensor]
    tokens: str
    logits: str
    next_tokens: str
    external: Callable[[], dict[str, torch.Tensor]]
    external_key: Callable[[], tuple]

    def __post_init__(self):
        self._key = self.external_key()

    @property
    def batch(self) -> int:
        return self.graph.buffers[self.tokens].shape[0]

    @property
    def device(self) -> torch.device:
        return self.tensors[self.tokens].device

    def repoint(self) -> bool:
        """Rebind the caller-owned views if any moved since the last call; True when they did. Raises
        InputError (binding nothing) when a moved tensor no longer has its buffer's shape, dtype or device."""
        key = self.external_key()
        if key == self._key:
            return False
        new = self.external()
        dev = self.device
        for name, t in new.items():
            b = self.graph.buffers[name]
            if tuple(t.shape) != b.shape or t.dtype != b.dtype or t.device != dev:
                raise InputError(f"{name!r} was replaced by a {tuple(t.shape)} {t.dtype} tensor on {t.device}, but "
                                 f"the step was built for {b.shape} {b.dtype} on {dev}; build a new runner for "
                                 f"a cache of another shape, dtype or device")
        self.tensors.update(new)
        self._key = key
        return True
