"""Executors: every mode runs the same bound decode step (``graph.step.BoundStep``) and the same tile functions.

``make_runner(mode, step, interpret=False, **options)`` returns a runner with
``step(tokens int32 [B]) -> (logits float32 [B, V], next_tokens int32 [B])``, ``check()`` and ``poll()`` (raise
a pending device-side error, waiting for the queued steps or not; see ``exec.base.StepRunner``).

Modes: ``eager`` (one Triton launch per op), ``graph`` (CUDA-graph replay), ``pdl`` (programmatic dependent
launch inside a CUDA graph), ``megakernel`` (one persistent kernel). The PyTorch ``reference`` mode is not an
executor of the graph: ``runtime.runners.make_step_runner`` dispatches it. An executor imports ``graph/`` and
``ops/`` only: it never knows which model it runs.
"""
from __future__ import annotations

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

    from onekernel.ops.base import INTERPRETED

    if mode not in MODES:
        raise InputError(f"{mode!r} is not a Triton mode; choose one of {', '.join(MODES)} (the reference mode "
                         "runs through onekernel.runtime.runners.make_step_runner)")
    if torch.device(device).type != "cuda" and not interpret:
        raise DeviceError(f"mode {mode!r} runs Triton kernels on a CUDA GPU, but the model is on "
                          f"{torch.device(device).type} (GPU available: {torch.cuda.is_available()}); use --mode "
                          f"reference, or --interpret to run the kernels in the Triton interpreter on the CPU "
                          f"(slow; use fp32)")
    if interpret and not INTERPRETED:
        raise DeviceError("interpret=True needs TRITON_INTERPRET=1 in the environment before onekernel is imported "
                          "(Triton reads it when the kernels are defined); the CLI sets it for --interpret")


def sm_count(device) -> int:
    """SMs of ``device`` (132, an H200's, for a CPU device: the interpreter's graphs are tiled as for one)."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def smem_per_block(device) -> int:
    """Bytes of shared memory one CTA may use on ``device`` (``cudaDevAttrMaxSharedMemoryPerBlockOptin``; an H200's
    227 KB, ``ops.tiling.SM90_SMEM``, for a CPU device or where CUDA is not available)."""
    import torch

    from onekernel.ops.tiling import SM90_SMEM
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return SM90_SMEM
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


BACKENDS = ("auto", "gluon", "triton")


def megakernel_class(step, backend: str, interpret: bool, options: dict):
    """The megakernel runner class for ``backend``: "triton" (``exec.megakernel``, every device and the
    interpreter), "gluon" (``exec.stream_runner``: the weight-streaming kernel, with CUDA-core or tensor-core
    GEMV bodies as the step's ``gemv`` says; InputError with the reason when the step is unsupported) or "auto"
    (``auto_streams``). The streaming kernel takes every batch 1..16 of a model it supports, with either GEMV path,
    so "auto" picks the same backend for all of them (bitwise batch invariance); a batch above 16 takes the Triton
    kernel."""
    from onekernel.exec.megakernel import MegakernelRunner

    if backend not in BACKENDS:
        raise InputError(f"unknown megakernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "triton" or interpret:
        if backend == "gluon":
            raise InputError("backend='gluon' runs on a Hopper GPU only, not in the Triton interpreter")
        return MegakernelRunner
    from onekernel.exec.stream_runner import StreamMegakernelRunner

    if backend == "gluon" or auto_streams(step.graph, step.batch, step.device, options):
        return StreamMegakernelRunner
    return MegakernelRunner


def auto_streams(graph, batch: int, device, options: dict) -> bool:
    """Whether ``backend="auto"`` runs a megakernel step of ``graph`` at ``batch`` on ``device`` (a torch.device) on
    the streaming kernel: no Triton-only option (``profile`` included: the profile tools read the step graph's
    tasks, the streaming kernel stamps its own re-tiled ones; backend='gluon' gets them) among ``options``, a Hopper
    GPU and a step it supports (``stream_support.unsupported_device`` / ``unsupported_graph``), and a model it runs
    faster (``stream_support.prefer_stream``). Needs only the graph (``runtime.runners.megakernel_step`` asks it of
    the tensor-core step it bound, before any runner is built)."""
    import inspect

    from onekernel.exec.stream_support import prefer_stream, unsupported_device, unsupported_graph
    from onekernel.exec.stream_runner import StreamMegakernelRunner

    takes = set(inspect.signature(StreamMegakernelRunner.__init__).parameters)
    if set(options) - takes or options.get("profile"):
        return False
    if unsupported_device(device) or unsupported_graph(graph, batch):
        return False
    return prefer_stream(graph, options.get("n_workers") or sm_count(device))


def pdl_streams(graph, batch: int, device, options: dict) -> bool:
    """Whether mode "pdl" with backend "auto" runs on the streaming kernel's bodies (``exec.stream_segments``: one
    persistent kernel per op, each loader streaming its op's weights through the shared-memory ring before the op's
    inputs exist; issue 11 item 4) instead of the Triton per-op kernels: a tensor-core step (``graph.meta["gemv"]``
    "mma": the model's own path for bf16 / fp16 models of hidden size >= 1024) that ``auto_streams`` would stream, and
    only options those kernels take (SEGMENT_OPTIONS; ``after``, ``prologue_split``, ``trigger`` and ``profile`` keep
    the Triton kernels). A property of the model and options, never of the batch (``auto_streams`` answers the same
    for batches 1..16), so every batch of a model runs the same kernels and keeps its batch-1 bits. Measured (H200,
    run 26 call 260, ms per step at batch 1 / 8): Llama-3.2-1B 0.990 / 1.163 against the Triton kernels' 1.094 /
    1.242; Llama-3.1-8B 4.213 / 4.662 against 4.914 / 5.315. CUDA-core steps (SmolLM2-135M; Qwen3-0.6B until run
    29) keep the Triton kernels: there the streaming bodies would change the path (docs/DESIGN.md, "Small models")."""
    if graph.meta.get("gemv") != "mma" or set(options) - set(SEGMENT_OPTIONS) or options.get("profile"):
        return False
    return auto_streams(graph, batch, device, {k: v for k, v in options.items() if k not in ("backend", "segment")})


def _build_or_fall_back(build, what: str, instead: str, fall_back):
    """``build()``; if it raises a compile error of any kind (not onekernel's own errors, not out of memory), log it
    and return ``fall_back()``: backend "auto" must not cost the user the mode when a Triton's Gluon API moved again
    (backend="gluon" raises the error). Out of memory is not a build failure: falling back would change the backend,
    and so the bits, of one batch size only (run 8: an 8B batch-16 start ran the Triton kernel while GPU memory was
    short)."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - compile errors of every kind; onekernel's own errors pass
        import logging

        import torch

        from onekernel.errors import OneKernelError
        if isinstance(e, (OneKernelError, torch.OutOfMemoryError)):
            raise
        logging.getLogger("onekernel").warning("%s did not build (%s: %.200s); running %s instead (backend='gluon' "
                                               "raises the error)", what, type(e).__name__, e, instead)
        return fall_back()


# The runner options a caller may pass, per mode (README, "Runner options"; each runner class documents them);
# make_step_runner takes STEP_OPTIONS itself. graph / pdl with backend="gluon" take SEGMENT_OPTIONS.
RUNNER_OPTIONS = {
    "eager": ("profile", "after"),
    "graph": ("profile", "after", "use_cuda_graph", "backend"),
    "pdl": ("profile", "after", "use_cuda_graph", "backend", "prologue_split", "trigger"),
    "megakernel": ("backend", "n_workers", "policy", "events", "prefetch", "profile", "spin_limit", "use_cuda_graph",
                   "num_warps", "check_every", "comm_workers", "wait_ms", "schedule"),
}
SEGMENT_OPTIONS = ("backend", "profile", "use_cuda_graph", "segment", "n_workers", "wait_ms", "check_every")
STEP_OPTIONS = ("gemv", "tiles", "n_sm", "fuse_merge", "interpret")


def _check_options(mode: str, cls, options: dict, public) -> None:
    """InputError for an option of ``options`` that is not both public for ``mode`` and taken by ``cls``, naming
    the ones that are."""
    import inspect

    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    takes = {p.name for c in cls.__mro__ if "__init__" in vars(c)
             for p in inspect.signature(c.__init__).parameters.values() if p.kind in named}
    allowed = (set(public) & takes) | ({"backend"} & set(public))
    bad = sorted(set(options) - allowed)
    if bad:
        raise InputError(f"mode {mode!r} has no option {', '.join(bad)}; its options are {', '.join(sorted(allowed))} "
                         f"(make_step_runner also takes {', '.join(STEP_OPTIONS)})")


def make_runner(mode: str, step, *, interpret: bool = False, **options):
    """The runner of ``mode`` over ``step`` (a BoundStep). options: the runner's keyword options (see each
    runner class; the megakernel also takes ``backend``: see ``megakernel_class``). Raises InputError for an
    option the mode does not take (naming the ones it does), and as ``check_device``."""
    import inspect

    from onekernel.exec.kernels import CudaGraphRunner, EagerRunner, PdlRunner
    from onekernel.exec.megakernel import MegakernelRunner
    from onekernel.graph.step import BoundStep

    check_device(mode, step.device if isinstance(step, BoundStep) else "cpu", interpret)
    if not isinstance(step, BoundStep):
        raise InputError(f"step must be a BoundStep (onekernel.models.decode_graph.build_decode_step), got "
                         f"{type(step).__name__}")
    cls = {"eager": EagerRunner, "graph": CudaGraphRunner, "pdl": PdlRunner, "megakernel": MegakernelRunner}[mode]
    backend = options.pop("backend", "auto") if mode in ("megakernel", "graph", "pdl") else None
    auto_pdl = (mode == "pdl" and backend == "auto" and not interpret
                and pdl_streams(step.graph, step.batch, step.device, options))
    if auto_pdl:
        backend = "gluon"
    if mode == "megakernel":
        cls = megakernel_class(step, backend, interpret, options)
    elif backend is not None and backend not in ("auto", "triton"):  # graph / pdl on the streaming kernel's bodies
        if backend != "gluon":
            raise InputError(f"unknown {mode} backend {backend!r}; choose one of auto, triton, gluon")
        if interpret:
            raise InputError("backend='gluon' runs on a Hopper GPU only, not in the Triton interpreter")
        from onekernel.exec.stream_segments import StreamSegmentRunner
        cls = StreamSegmentRunner
    segmented = backend == "gluon" and mode != "megakernel"
    _check_options(mode, cls, options, SEGMENT_OPTIONS if segmented else RUNNER_OPTIONS[mode])
    if segmented:
        options["pdl"] = mode == "pdl"
    if mode == "megakernel":
        if cls is MegakernelRunner:
            return cls(step, interpret=interpret, **options)
        if backend == "gluon":
            return cls(step, **options)
        keep = inspect.signature(MegakernelRunner.__init__).parameters
        return _build_or_fall_back(lambda: cls(step, **options), "the streaming megakernel", "the Triton megakernel",
                                   lambda: MegakernelRunner(step, **{k: v for k, v in options.items() if k in keep}))
    if auto_pdl:
        def triton_pdl():
            options.pop("pdl", None)
            bad = sorted(set(options) - set(RUNNER_OPTIONS["pdl"]))
            if bad:  # segment / n_workers / wait_ms / check_every: the streaming kernels' own
                raise InputError(f"pdl fell back to the Triton kernels, which take no option {', '.join(bad)}")
            return PdlRunner(step, **options)
        return _build_or_fall_back(lambda: cls(step, **options), "pdl on the streaming kernel's bodies",
                                   "the Triton kernels", triton_pdl)
    if interpret and mode != "eager":  # no CUDA graphs or PDL in the interpreter: the same launches, eagerly
        options.pop("use_cuda_graph", None)
        cls = EagerRunner
    return cls(step, **options)
