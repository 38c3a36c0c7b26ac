"""What every Triton executor shares: the step interface over a bound decode step.

``StepRunner.step(tokens)`` runs one decode step over the tensors of its ``BoundStep``:

* tokens: int32 [B] on the step's device (the token at position ``seq_lens[b]`` of each sequence);
* returns ``(logits, next_tokens)``: float32 [B, V] and int32 [B] (greedy argmax), both tensors owned by the
  step and overwritten by the next one. The caller advances ``seq_lens`` afterwards.

``check()`` raises an error the device recorded (only the megakernel has one: a bounded spin that gave up),
waiting for every queued step; ``poll()`` raises one of the steps that have already finished without waiting
for the rest (a pipelined caller that synchronised on step k's outputs polls while step k+1 runs). Both are
no-ops elsewhere, so callers treat every runner alike. When the caller's KV cache moves, the next step
re-points the views first (``BoundStep.repoint``), and graph-based modes re-capture.
"""
from __future__ import annotations

import os

import torch

from onekernel.errors import InputError
from onekernel.graph.step import BoundStep


def cuda_graphs_enabled(option: bool | None) -> bool:
    """The runner option ``use_cuda_graph`` if given, else True unless ``ONEKERNEL_NO_CUDA_GRAPH`` is set to
    anything but "" or "0" (the one place that reads the variable)."""
    if option is not None:
        return bool(option)
    return os.environ.get("ONEKERNEL_NO_CUDA_GRAPH", "0") in ("", "0")


class StepRunner:
    """Base of the Triton executors. ``profile``: allocate ``prof`` int64 [n_tasks, 4] (start, dependencies
    satisfied, end in ns, SM id) for the kernels to fill."""

    mode = "base"

    def __init__(self, step: BoundStep, *, profile: bool = False):
        if profile and step.device.type != "cuda":
            raise InputError("profile=True reads the GPU's timers (globaltimer, SM id); it needs a CUDA device, "
                             "not the Triton interpreter")
        self.bound = step
        self.profile = profile
        self.prof = (torch.zeros(len(step.graph.tasks), 4, dtype=torch.int64, device=step.device)
                     if profile else None)

    @property
    def graph(self):
        return self.bound.graph

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return self.bound.tensors

    def step(self, tokens: torch.Tensor):
        b = self.bound
        b.tensors[b.tokens].copy_(tokens)
        self._run(b.repoint())
        return b.tensors[b.logits], b.tensors[b.next_tokens]

    def check(self) -> None:
        """Raise a device-side error of the steps run so far (none in this mode)."""

    def poll(self) -> None:
        """Raise a device-side error of the steps that have finished (none in this mode)."""

    def _run(self, moved: bool) -> None:
        raise NotImplementedError
