"""One entry point for a decode-step runner of any mode, over a model and a KV cache.

``make_step_runner(mode, model, cache)`` is what the generation loop, the CLI tools and the benchmarks call:

* ``reference``: the PyTorch decoder (``runtime.reference.ReferenceRunner``);
* ``eager | graph | pdl | megakernel``: the decode step built and bound by
  ``models.decode_graph.build_decode_step`` (tiled as the mode wants: ``exec.DEFAULT_TILING``), handed to
  ``exec.make_runner``.

Every runner has ``step(tokens int32 [B]) -> (logits float32 [B, V], next_tokens int32 [B])``, ``check()`` and
``poll()`` (``exec.base.StepRunner``).
"""
from __future__ import annotations

import torch

from onekernel.errors import InputError
from onekernel.exec import (DEFAULT_TILING, STEP_MODES, auto_streams, check_device, make_runner, sm_count,
                             smem_per_block)
from onekernel.models.decode_graph import build_decode_step, default_gemv
from onekernel.ops.tiling import Tiling
from onekernel.runtime.args import check_flag, check_int, check_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner


def _check_cache(model, cache) -> None:
    """InputError unless ``cache`` is a KVCache for ``model``'s config, dtype and device."""
    if not isinstance(cache, KVCache):
        raise InputError(f"cache must be a KVCache (onekernel.runtime.kv_cache.KVCache(model.config, batch, "
                         f"max_seq_len, dtype, device)), got {type(cache).__name__}")
    w = model.weights["tok_embeddings"]
    if cache.cfg != model.config:
        raise InputError(f"cache is for the model config {cache.cfg.name!r}, not {model.config.name!r}; build it "
                         f"with KVCache(model.config, ...)")
    if (cache.k.dtype, cache.k.device) != (w.dtype, w.device):  # tensors' devices: "cuda" is always "cuda:N"
        raise InputError(f"cache holds {cache.k.dtype} on {cache.k.device} but the model's weights are {w.dtype} on "
                         f"{w.device}; build the cache with the model's dtype and device")


def check_mode(mode: str, device, interpret: bool = False) -> None:
    """The one check that ``mode`` exists and can run on ``device``: InputError for an unknown mode, and for a
    Triton mode ``exec.check_device`` (DeviceError without a GPU unless ``interpret``)."""
    if mode not in STEP_MODES:
        raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(STEP_MODES)}")
    if mode != "reference":
        check_device(mode, device, interpret)


def make_step_runner(mode: str, model, cache, *, interpret: bool = False, tiles: str | None = None,
                     n_sm: int | None = None, fuse_merge: bool = False, gemv: str | None = None, **options):
    """The runner of ``mode`` for ``model`` (a LoadedModel) over ``cache`` (a KVCache of the model's dtype and
    device; its batch is the step's).

    tiles: "cover" | "fit" (default per mode, ``exec.DEFAULT_TILING``), for a GPU of ``n_sm`` SMs (default:
    the cache's device); fuse_merge, gemv ("fma" | "mma" | None: the model's default, ``megakernel_step`` for the
    megakernel on a Hopper GPU): see ``models.decode_graph.decode_graph``; interpret: run a Triton mode in
    the Triton interpreter on the CPU; options: the executor's own (``onekernel.exec.make_runner``).
    Raises InputError (unknown mode or option value; model not a LoadedModel, or a tensor-parallel shard; cache
    not a KVCache of the model's config, dtype and device; a flag not a bool; ``interpret`` with a bf16 model on the
    tensor-core path, which the interpreter computes wrongly), DeviceError (a Triton mode without a GPU),
    UnsupportedModelError (a model the kernels can't run)."""
    check_model(model)
    if getattr(model, "shard", None) is not None:
        raise InputError("model is one rank's tensor-parallel shard (onekernel.dist.sharding.ShardedModel); run it "
                         "through onekernel.dist.tp_reference (generate(..., parallel=TPGroup(model.shard)))")
    _check_cache(model, cache)
    check_flag("interpret", interpret)
    check_flag("fuse_merge", fuse_merge)
    check_mode(mode, cache.k.device, interpret)
    if mode == "reference":
        given = [k for k, v in (("tiles", tiles), ("n_sm", n_sm), ("fuse_merge", fuse_merge or None),
                                ("gemv", gemv)) if v is not None]
        if options or given:
            raise InputError(f"the reference mode takes no runner options, got {', '.join(given + sorted(options))}")
        return ReferenceRunner(model, cache)
    if interpret and cache.k.dtype == torch.bfloat16 and (gemv or default_gemv(model.config, cache.k.dtype)) == "mma":
        raise InputError("the Triton interpreter has no bf16 tensor-core dot (tl.dot on bf16 gives wrong values on the "
                         "CPU): interpret the tensor-core path in fp32 (--dtype fp32), or take the CUDA-core path "
                         "(--gemv fma)")
    if n_sm is not None:
        check_int("n_sm", n_sm)
    tiling = Tiling(sm_count(cache.k.device) if n_sm is None else n_sm, tiles or DEFAULT_TILING[mode],
                    smem_per_block(cache.k.device))
    if mode == "megakernel" and gemv is None and not interpret:
        from onekernel.exec.megakernel import MegakernelRunner

        step = megakernel_step(model, cache, tiling, fuse_merge, options)
        r = make_runner(mode, step, **options)
        if step.graph.meta["gemv"] == default_gemv(model.config, cache.k.dtype) or not isinstance(r, MegakernelRunner):
            return r
        # "auto" fell back to the Triton megakernel (the streaming kernel did not build: logged): the model's own
        # path there, not the tensor cores megakernel_step chose for the streaming kernel (0.896 against 0.671 ms
        # on SmolLM2-135M, run 19 call 190)
        del r, step  # gemv is None: the model's own path
    step = build_decode_step(model.config, model.weights, cache, tiling=tiling, fuse_merge=fuse_merge, gemv=gemv)
    return make_runner(mode, step, interpret=interpret, **options)


def megakernel_step(model, cache, tiling: Tiling, fuse_merge: bool, options: dict):
    """The megakernel's bound step on a Hopper GPU when no GEMV path is asked for: on the tensor cores ("mma")
    where the megakernel then runs the streaming kernel (backend "gluon", or "auto" as ``exec.auto_streams`` decides;
    ``stream_support.prefer_stream`` always streams a tensor-core step), else on the model's own path (``default_gemv``;
    "mma" already for bf16 / fp16 models of a hidden size >= 1024). So it changes the path only for smaller bf16 /
    fp16 models the streaming kernel supports. SmolLM2-135M (H200, run 19 call 190, ms per step at batch 1 / 8 / 16):
    the streaming tensor-core megakernel 0.613 / 0.745 / 0.975, the Triton megakernel on CUDA cores 0.671 at batch 1
    (run 16: 1.888 at batch 8, the real model). graph, eager and pdl keep the model's path: their tensor-core kernels
    are slower at batch 1 there (pdl 0.805 against 0.547 ms). A property of the model, mode and backend, never of
    the batch (``auto_streams`` gives the same answer for batches 1..16): every batch of a model runs the same
    kernel path, so each sequence's logits equal its batch-1 run's. A model that does not stream is bound twice
    (tensor-core step first, freed, then its own path). ``make_step_runner`` also rebinds the model's own path when
    "auto" falls back to the Triton megakernel because the streaming kernel did not build. Tensor-parallel ranks
    keep the model's own path (``dist.tp_kernels.rank_gemv``), so a small model's TP megakernel runs its CUDA-core
    path."""
    cfg, dev = model.config, cache.k.device
    backend = options.get("backend", "auto")
    if (default_gemv(cfg, cache.k.dtype) == "fma" and backend in ("auto", "gluon")
            and (backend == "gluon" or not options.get("profile"))  # "auto" profiles on the Triton kernel
            and cache.k.dtype in (torch.bfloat16, torch.float16) and dev.type == "cuda"):
        from onekernel.exec.stream_support import unsupported, unsupported_device

        if unsupported_device(dev):
            return build_decode_step(cfg, model.weights, cache, tiling=tiling, fuse_merge=fuse_merge)
        step = build_decode_step(cfg, model.weights, cache, tiling=tiling, fuse_merge=fuse_merge, gemv="mma")
        if backend == "gluon":
            streams = unsupported(step) is None
        else:
            streams = auto_streams(step.graph, step.batch, dev, {k: v for k, v in options.items() if k != "backend"})
        if streams:
            return step
        del step  # its buffers go before the model's own step is bound
    return build_decode_step(cfg, model.weights, cache, tiling=tiling, fuse_merge=fuse_merge)
