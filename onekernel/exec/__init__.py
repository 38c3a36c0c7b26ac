"""Executors: every mode runs the same bound decode step (``graph.step.BoundStep``) and the same tile functions.

``make_runner(mode, step, interpret=False, **options)`` returns a runner with
``step(tokens int32 [B]) -> (logits float32 [B, V], next_tokens int32 [B])`` and ``check()`` (raise a pending
device-side error; see ``exec.base.StepRunner``).

Modes: ``eager`` (one Triton launch per op), ``graph`` (CUDA-graph replay), ``pdl`` (programmatic dependent
launch inside a CUDA graph), ``megakernel`` (one persistent kernel). The PyTorch ``reference`` mode is not an
executor of the graph: ``runtime.runners.make_step_runner`` dispatches it. An executor imports ``graph/`` and
``ops/`` only: it never knows which model it runs.
"""
from __future__ import annotations

import os

from onekernel.errors import DeviceError, InputError

MODES = ("eager", "graph", "pdl", "megakernel")
STEP_MODES = ("reference", *MODES)  # every mode a decode step runs in (reference: runtime.runners dispatches it)
# The tiling each mode's step is built with by default (ops/tiling.py, Tiling.policy): the megakernel runs one
# worker per SM and wants at most one tile per worker per op; the separate kernels cover every SM.
DEFAULT_TILING = {"eager": "cover", "graph": "cover", "pdl": "cover", "megakernel": "fit"}


def check_device(mode: str, device, interpret: bool = False) -> None:
    """The one check that ``mode`` can run on ``device``: InputError for an unknown mode; DeviceError for a
    Triton mode off a CUDA device unless ``interpret`` (then TRITON_INTERPRET=1 must be set before Triton is
    imported: the CLI sets it for --interpret)."""
    import torch

    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; choose one of reference, {', '.join(MODES)}")
    if torch.device(device).type != "cuda" and not interpret:
        raise DeviceError(f"mode {mode!r} runs Triton kernels on a CUDA GPU, but the model is on "
                          f"{torch.device(device).type} (GPU available: {torch.cuda.is_available()}); use --mode "
                          f"reference, or --interpret to run the kernels in the Triton interpreter on the CPU "
                          f"(slow; use fp32)")
    if interpret and os.environ.get("TRITON_INTERPRET") != "1":
        raise DeviceError("--interpret needs TRITON_INTERPRET=1 set before Triton is imported; the CLI sets it "
                          "when you pass --interpret")


def sm_count(device) -> int:
    """SMs of ``device`` (132, an H200's, for a CPU device: the interpreter's graphs are tiled as for one)."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def make_runner(mode: str, step, *, interpret: bool = False, **options):
    """The runner of ``mode`` over ``step`` (a BoundStep). options: the runner's keyword options (see each
    runner class). Raises InputError / DeviceError as ``check_device``."""
    check_device(mode, step.device, interpret)
    if mode == "megakernel":
        from onekernel.exec.megakernel import MegakernelRunner
        return MegakernelRunner(step, interpret=interpret, **options)
    from onekernel.exec.kernels import CudaGraphRunner, EagerRunner, PdlRunner
    cls = {"eager": EagerRunner, "graph": CudaGraphRunner, "pdl": PdlRunner}[mode]
    if interpret and mode == "pdl":
        cls = EagerRunner  # the interpreter has no PDL: run the same launches without it
    return cls(step, **options)
