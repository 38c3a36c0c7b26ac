"""``onekernel warmup``: compile every kernel a later run needs, ahead of time, into Triton's on-disk cache.

For each requested batch size and mode: build the decode step of a KV cache of ``--max-seq-len`` positions and
run it once (a step compiles every kernel its mode launches; the megakernel compiles when its runner is
built, and its runner stores its dependencies, events, schedule and records in ``exec.host_cache``, so a later
start loads them instead of recomputing seconds of Python). One progress line per case on stderr; a summary on stdout. The kernels are specialised on the model,
dtype, batch size and cache length, so a later ``generate`` reuses them when those match: without
``--max-seq-len``, ``generate`` on a GPU sizes the cache to the same default for prompts + new tokens <= 512
(``runtime.generate.default_cache_len``), and ``bench`` uses ``--context`` (default 512).
"""
from __future__ import annotations

import sys
import time

from onekernel.errors import DeviceError, InputError
from onekernel.exec import MODES
from onekernel.models.load import DTYPE_CHOICES
from onekernel.ops.tiling import MAX_BATCH
from onekernel.runtime.args import add_gemv_argument, gemv_options

DEFAULT_MODES = "megakernel"


def add_warmup(p) -> None:
    p.add_argument("--model", default=None, metavar="PATH|NAME", help="a .gguf, an HF folder or a config name")
    p.add_argument("--random-weights", action="store_true", help="random weights for the named config")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--batch", default="1", help=f"comma-separated batch sizes to compile for (1..{MAX_BATCH}; "
                                                "e.g. 1,2,4,8,16)")
    p.add_argument("--mode", default=DEFAULT_MODES,
                   help=f"comma-separated Triton modes ({', '.join(MODES)}) or 'all' (default: {DEFAULT_MODES})")
    p.add_argument("--max-seq-len", type=int, default=None, metavar="N",
                   help="KV-cache length the kernels are compiled for: pass the same to generate (default: "
                        "generate's own default for short prompts, 512 or the model's context if smaller)")
    p.add_argument("--dtype", type=str.lower, choices=DTYPE_CHOICES, default="auto",
                   help="model dtype the kernels are compiled for (auto: bfloat16; float32 with --interpret; "
                        "bf16/fp16/fp32 are aliases; default: %(default)s)")
    p.add_argument("--interpret", action="store_true",
                   help="run the steps in the Triton interpreter on the CPU (compiles nothing: checks the setup)")
    add_gemv_argument(p)


def parse_cases(batch: str, mode: str) -> tuple[list[int], list[str]]:
    """``--batch`` and ``--mode`` as lists; InputError naming the flag for a bad value."""
    try:
        batches = [int(x) for x in batch.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--batch must be comma-separated integers, got {batch!r}") from None
    bad = [b for b in batches if not 1 <= b <= MAX_BATCH]
    if not batches or bad:
        raise InputError(f"every --batch must be between 1 and {MAX_BATCH}, got "
                         f"{', '.join(map(str, bad)) if bad else repr(batch)}")
    modes = list(MODES) if mode.strip() == "all" else [m.strip() for m in mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise InputError(f"--mode takes comma-separated Triton modes ({', '.join(MODES)}) or 'all', got {mode!r}")
    return batches, modes


def run_warmup(args) -> int:
    import os
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the CLI imports it lazily)
    import torch

    from onekernel.cli_compile import CompileWatch, cache_dirs
    from onekernel.cli_output import say
    from onekernel.models.load import dtype_option, load_model
    from onekernel.runtime.generate import default_cache_len
    from onekernel.runtime.kv_cache import KVCache
    from onekernel.runtime.runners import make_step_runner

    batches, modes = parse_cases(args.batch, args.mode)
    gemv = gemv_options(args.gemv, modes[0])
    if args.max_seq_len is not None and args.max_seq_len < 2:
        raise InputError(f"--max-seq-len must be >= 2, got {args.max_seq_len}")
    if not args.interpret and not torch.cuda.is_available():
        raise DeviceError("warmup compiles the kernels for this machine's GPU, and no CUDA GPU was found; run it "
                          "on the GPU machine (--interpret runs the steps in the Triton interpreter instead)")
    device = "cpu" if args.interpret else "cuda"
    dtype = dtype_option(args.dtype, device)
    t0 = time.perf_counter()
    model = load_model(args.model, random_weights=args.random_weights, dtype=dtype, device=device, seed=args.seed)
    cfg, dtype = model.config, model.weights["norm"].dtype
    seq = args.max_seq_len or default_cache_len(1, cfg.max_seq_len, True)
    if seq > cfg.max_seq_len:
        raise InputError(f"--max-seq-len {seq} is longer than {cfg.name}'s context ({cfg.max_seq_len})")
    name, n = cfg.name, len(batches) * len(modes)
    say(f"onekernel warmup: {name}, {n} case(s), cache length {seq}, dtype {str(dtype).removeprefix('torch.')}")
    total = 0
    for i, (b, mode) in enumerate([(b, m) for b in batches for m in modes], 1):
        say(f"onekernel warmup: [{i}/{n}] batch {b}, {mode}: "
            f"{'running one step in the Triton interpreter...' if args.interpret else 'compiling...'}")
        t = time.perf_counter()
        with CompileWatch() as watch:
            cache = KVCache(cfg, b, seq, dtype, device)
            runner = make_step_runner(mode, model, cache, interpret=args.interpret, **gemv)
            runner.step(torch.zeros(b, dtype=torch.int32, device=device))
            runner.check()
            if device == "cuda":
                torch.cuda.synchronize()
        total += watch.count
        say(f"onekernel warmup: [{i}/{n}] batch {b}, {mode}: {time.perf_counter() - t:.1f} s, "
            f"{watch.count} kernel(s) compiled or loaded ({watch.seconds:.1f} s)")
        del runner, cache
    triton_dir, gen_dir = cache_dirs()
    print(f"warmed up {name}: {n} case(s) (batch {','.join(map(str, batches))}; {', '.join(modes)}; cache length "
          f"{seq}), {total} kernel(s), {time.perf_counter() - t0:.1f} s; Triton cache: {triton_dir}; generated "
          f"sources: {gen_dir}; megakernel schedules and tables: {os.path.join(gen_dir, 'host')}")
    sys.stdout.flush()
    return 0


WARMUP = {"warmup": ("compile the kernels of a model for the given batch sizes and modes ahead of time",
                     add_warmup, run_warmup)}
