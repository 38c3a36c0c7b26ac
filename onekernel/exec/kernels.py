"""Separate-kernel executors: ``eager`` (one launch per op), ``graph`` (CUDA-graph replay), ``pdl``.

All three launch the per-op kernels that ``exec.codegen`` wraps around the ops' tile functions, in program
order, grid = the op's tiles.

* eager: Triton launches from Python every step.
* graph: the launch sequence is captured once into a ``torch.cuda.CUDAGraph`` and replayed. Graphs are
  cached by every bound tensor's address; when the KV cache moves, the next step re-captures.
  ``ONEKERNEL_NO_CUDA_GRAPH=1`` (or ``use_cuda_graph=False``) turns capture off: launches run eagerly.
* pdl: the same, with programmatic dependent launch (``launch_pdl=True``): each kernel runs its prologue
  (first weight chunk), then ``gdc_wait`` before its body, and triggers its dependent's launch after the body
  (``trigger="end"``), so the next kernel starts without a launch gap and its prologue overlaps this kernel's
  last memory operations. Captured in a CUDA graph like ``graph``. ``prologue_split=False`` waits before the
  prologue instead (measures what the prologue overlap is worth); ``trigger="entry"`` / ``"wait"`` trigger
  before the prologue / right after ``gdc_wait``: earlier launches park CTAs on the SMs (``codegen.eager_source``
  has the measurement).

``after``: {op name: host callable} run right after that op's launch, in program order (tensor parallel's
all-reduces, dist/tp_kernels.py). They are part of every launch sequence: called each step in eager, captured
with the kernels in graph and pdl (a collective that launches its own kernels must be capturable, as NCCL's
and symmetric memory's are). A PDL chain breaks at such a call: the next kernel waits for it to finish.
"""
from __future__ import annotations

import torch

from onekernel.errors import InputError
from onekernel.exec.base import StepRunner, cuda_graphs_enabled
from onekernel.exec.codegen import TRIGGERS, launch_op


class EagerRunner(StepRunner):
    """Options: ``profile`` (StepRunner); ``prologue_split``, ``trigger`` (read with PDL only: module doc);
    ``after`` (host calls after named ops: module doc; InputError for a name that is not an op)."""

    mode = "eager"
    pdl = False

    def __init__(self, step, *, prologue_split: bool = True, trigger: str = "end", profile: bool = False,
                 after: dict | None = None):
        super().__init__(step, profile=profile)
        if trigger not in TRIGGERS:
            raise InputError(f"unknown PDL trigger {trigger!r}; choose one of {', '.join(TRIGGERS)}")
        if after is not None and (not isinstance(after, dict) or not all(callable(f) for f in after.values())):
            raise InputError(f"after= must be a dict of op name -> callable (host calls after those ops), got "
                             f"{type(after).__name__}")
        self.after = dict(after or {})
        unknown = sorted(set(self.after) - {op.name for op in self.graph.ops})
        if unknown:
            raise InputError(f"after= names {', '.join(unknown)}, which are not ops of the step's graph")
        self.prologue_split = prologue_split  # read only with PDL (PdlRunner)
        self.trigger = trigger  # read only with PDL

    def launch_all(self) -> None:
        for op in self.graph.ops:
            launch_op(self.graph, op, self.tensors, pdl=self.pdl, prof=self.prof,
                      prof_base=op.task_ids[0] if op.task_ids else 0, prologue_split=self.prologue_split,
                      trigger=self.trigger)
            if op.name in self.after:
                self.after[op.name]()

    def _run(self, moved: bool) -> None:
        self.launch_all()


class CudaGraphRunner(EagerRunner):
    """Options: those of EagerRunner, and ``use_cuda_graph`` (None: on unless ONEKERNEL_NO_CUDA_GRAPH is set)."""

    mode = "graph"

    def __init__(self, step, *, use_cuda_graph: bool | None = None, **kw):
        super().__init__(step, **kw)
        self.use_cuda_graph = cuda_graphs_enabled(use_cuda_graph) and step.device.type == "cuda"
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._key: tuple | None = None
        self.captures = 0

    def address_key(self) -> tuple:
        return tuple(t.data_ptr() for t in self.tensors.values())

    def _capture(self) -> torch.cuda.CUDAGraph:
        # Compile and warm up outside the capture. A decode step is idempotent (it rewrites the same KV row
        # and recomputes every activation), so the warm-up run changes no result.
        self.launch_all()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.launch_all()
        self.captures += 1
        return g

    def _run(self, moved: bool) -> None:
        if not self.use_cuda_graph:
            self.launch_all()
            return
        if moved or self._key is None:
            self._key = self.address_key()
        g = self._graphs.get(self._key)
        if g is None:
            g = self._graphs[self._key] = self._capture()
        g.replay()


class PdlRunner(CudaGraphRunner):
    mode = "pdl"
    pdl = True
