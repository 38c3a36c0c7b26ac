"""Executors: every mode runs the same decode-step graph and the same tile functions.

``make_runner(mode, model, cache, batch, interpret=False, **options)`` returns an object with
``step(tokens int32 [B]) -> (logits float32 [B, V], next_tokens int32 [B])``.

Modes: ``reference`` (PyTorch), ``eager`` (one Triton launch per op), ``graph`` (CUDA-graph replay),
``pdl`` (programmatic dependent launch inside a CUDA graph), ``megakernel`` (one persistent kernel).
Raises DeviceError for a Triton mode on a machine without a GPU unless ``interpret=True`` (Triton
interpreter on the CPU: slow, fp32, no PDL, no CUDA graphs, one megakernel worker).
"""
from __future__ import annotations

from onekernel.errors import DeviceError, InputError

MODES = ("reference", "eager", "graph", "pdl", "megakernel")
GPU_MODES = MODES[1:]  # the Triton modes: need CUDA or interpret=True


def make_runner(mode: str, model, cache, batch: int, *, interpret: bool = False, **options):
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "reference":
        from onekernel.runtime.reference import ReferenceRunner
        return ReferenceRunner(model, cache)
    if not cache.k.is_cuda and not interpret:
        raise DeviceError(f"mode {mode!r} runs Triton kernels and needs a CUDA GPU; use --mode reference, or "
                          f"--interpret to run it under the Triton interpreter on the CPU (slow)")
    if interpret:
        import os
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise DeviceError("--interpret needs TRITON_INTERPRET=1 set before Triton is imported; the CLI "
                              "sets it when you pass --interpret")
    if mode == "megakernel":
        from onekernel.exec.megakernel import make_megakernel
        return make_megakernel(model, cache, batch, interpret=interpret, **options)
    from onekernel.exec.kernels import CudaGraphRunner, EagerRunner, PdlRunner
    cls = {"eager": EagerRunner, "graph": CudaGraphRunner, "pdl": PdlRunner}[mode]
    if interpret and mode == "pdl":
        cls = EagerRunner  # the interpreter has no PDL: run the same launches without it
    return cls(model, cache, batch, **options)
