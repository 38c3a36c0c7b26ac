"""The serving benchmark: per mode, start ``onekernel serve``, run 1, 4, 16 concurrent streaming clients
(``bench.serve_load``), stop it; measure the mode's plain decode-step time in the same run, before the
servers; write ``serve-MODES.json`` (date, GPU, commit, every figure; rewritten after every record, so a run
stopped at a time limit keeps what it measured) and ``serve-MODES.md`` (a table) under
``--out`` (MODES: the modes joined by "-", so one run per mode fills one folder).

    python -m onekernel.bench.serve --model smollm2-135m --random-weights --out benchmarks/results/serve
    python -m onekernel.bench.serve --model tiny --random-weights --modes reference --clients 1,4 --out /tmp/s  # CPU

``itl_over_step`` (1 client): the inter-token latency p50 over the step time (1.0 = no serving overhead).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from onekernel.bench.report import commit_id
from onekernel.bench.serve_load import run_clients
from onekernel.bench.serve_process import Server
from onekernel.models.load import DTYPE_CHOICES, dtype_option


def step_ms(model, mode: str, context: int, interpret: bool, steps: int = 100) -> float:
    """The plain decode-step time (ms) of ``mode`` at batch 1, a cache of ``context`` positions, at its last
    position: ``bench.modes`` (CUDA-event median) on a GPU, a wall-clock median of a few steps on the CPU.
    Raises RuntimeError when the mode fails."""
    if torch.cuda.is_available() and not interpret:
        from onekernel.bench.modes import bench_modes
        rec = bench_modes(model, model.config.name, 1, context, [mode], bw_gbs=1.0, steps=steps)[0]
        if rec["ms_per_step"] is None:
            raise RuntimeError(f"the {mode} step failed: {rec.get('error')}")
        return rec["ms_per_step"]
    from onekernel.runtime.kv_cache import KVCache
    from onekernel.runtime.runners import make_step_runner
    w = model.weights["tok_embeddings"]
    cache = KVCache(model.config, 1, context, w.dtype, w.device)
    cache.seq_lens.fill_(context - 1)
    runner = make_step_runner(mode, model, cache, interpret=interpret)
    tokens, times = torch.zeros(1, dtype=torch.int32), []
    for _ in range(3 if interpret else 10):
        t0 = time.perf_counter()
        runner.step(tokens)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def table(records: list[dict]) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"
    lines = ["| mode | clients | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | tokens/s | step ms | ITL/step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['mode']} | {r['clients']} | {f(r['ttft_p50_ms'])} | {f(r['ttft_p99_ms'])} | "
                     f"{f(r['itl_p50_ms'])} | {f(r['itl_p99_ms'])} | {f(r['tokens_per_s'])} | {f(r['step_ms'])} | "
                     f"{f(r.get('itl_over_step'))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m onekernel.bench.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--modes", default="megakernel,graph,pdl")
    p.add_argument("--clients", default="1,4,16", help="concurrent client counts")
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per request (ignore_eos)")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--dtype", type=str.lower, choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--interpret", action="store_true", help="CPU smoke test of Triton modes")
    p.add_argument("--out", required=True, help="folder for serve-MODES.json and serve-MODES.md")
    p.add_argument("--server-timeout", type=float, default=1800.0, help="seconds to wait for warm-up (compiles)")
    args = p.parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    from onekernel.models.load import load_model
    modes, counts = args.modes.split(","), [int(c) for c in args.clients.split(",")]
    device = "cuda" if torch.cuda.is_available() and not args.interpret else "cpu"
    dtype = dtype_option(args.dtype, device)
    model = load_model(args.model, random_weights=args.random_weights, dtype=dtype, device=device)
    # one cache length for the step bench and the server (the kernels are compiled for it): a power of two >= 512
    ctx = min(model.config.max_seq_len, max(512, 1 << (args.prompt_len + args.max_tokens - 1).bit_length()))
    steps = {}
    for mode in modes:  # before any server holds the GPU
        steps[mode] = step_ms(model, mode, ctx, args.interpret)
        print(f"{mode}: step {steps[mode]:.3f} ms", file=sys.stderr, flush=True)
    vocab = model.config.vocab_size
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    serve_args = ["--model", args.model, "--max-batch", str(args.max_batch), "--max-seq-len", str(ctx),
                  "--max-queue", "1024", "--dtype", args.dtype] + ["--random-weights"] * args.random_weights + \
        ["--interpret"] * args.interpret
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
            "commit": commit_id() or "unknown", "model": args.model, "random_weights": args.random_weights, "dtype": str(dtype),
            "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "max_batch": args.max_batch,
            "max_seq_len": ctx,
            "requests_per_client": args.requests_per_client, "torch": torch.__version__}
    stem = "serve-" + "-".join(modes)
    records = []
    for mode in modes:
        print(f"{mode}: starting the server (warm-up compiles every batch bucket)", file=sys.stderr, flush=True)
        with Server(*serve_args, "--mode", mode, timeout=args.server_timeout) as server:
            run_clients(server.url, 1, 1, args.prompt_len, args.max_tokens, vocab, seed=99)  # warm the HTTP path
            for n in counts:
                rec = {"mode": mode, "step_ms": steps[mode],
                       **run_clients(server.url, n, args.requests_per_client, args.prompt_len, args.max_tokens,
                                     vocab, seed=n)}
                if n == 1:
                    rec["itl_over_step"] = rec["itl_p50_ms"] / steps[mode] if rec["itl_p50_ms"] else None
                records.append(rec)
                print(table([rec]).splitlines()[-1], file=sys.stderr, flush=True)
                # after every record: a run stopped at its time limit keeps what it measured
                (out / f"{stem}.json").write_text(json.dumps({**meta, "records": records}, indent=1))
    md = (f"# Serving benchmark: {args.model} on {gpu}, {meta['date']}, commit {meta['commit'][:12]}\n\n"
          f"prompt {args.prompt_len} tokens, {args.max_tokens} tokens per request (greedy, ignore_eos), "
          f"{args.requests_per_client} requests per client, --max-batch {args.max_batch}\n\n" + table(records))
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
