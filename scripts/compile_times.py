"""Cold and warm start of the decode step on the GPU machine (issue 12): what a first run and a later run wait.

    python scripts/compile_times.py --out DIR [--cases MODEL:BATCH:MODE,...] [--timeout S] [--jobs N] [--ctx N]

For each case (model with random weights, batch size, mode; ``megakernel/triton`` passes backend="triton"),
two fresh processes (``MODE@mma`` / ``MODE@fma`` picks the GEMV path; default the model's):
* cold: empty ``TRITON_CACHE_DIR`` and ``ONEKERNEL_CACHE``; times building the runner and its first step
  (every kernel compiles: the cold-cache first step the issue limits to 60 s);
* warm: the same caches, now full; the same timings (the warm start the issue limits to 5 s).
Each child reports: the model load (random weights on the GPU, not a compile), ``first_step_s`` (runner build +
first step + sync), ``step_ms`` (the median of 20 later steps: the compile changed nothing, a sanity figure),
the Triton kernels loaded or compiled and the seconds spent in them (``cli_compile.CompileWatch``), the
runner class, and its process wall time. A child past ``--timeout`` is killed and recorded as such (a cold
timeout skips the warm run: the cache is incomplete). Cases run ``--jobs`` at a time (each compile is one CPU
core; the figures say how many ran at once). Writes ``DIR/compile_times-<date>-<commit>.json`` (date, GPU, commit from
``bench.report.commit_id``, every figure) and ``.md`` (a table), and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Batch 1 once per model (nothing in it changed), the rest at 8 and 16: both megakernel backends (auto picks the
# streaming one for big models) and graph; Qwen3-8B's q/k-norm path (the one body that still unrolls the rows)
# and its eager batch 8 (4 minutes before issue 12).
DEFAULT_CASES = ",".join([f"{m}:1:megakernel" for m in ("llama-3.2-1b", "llama-3.1-8b")]
                         + [f"{m}:{b}:{mode}" for m in ("llama-3.2-1b", "llama-3.1-8b") for b in (8, 16)
                            for mode in ("megakernel", "megakernel/triton", "graph")]
                         + ["qwen3-8b:16:megakernel/triton", "qwen3-8b:8:eager"])


def child(model: str, batch: int, mode: str, ctx: int) -> dict:
    """One start, in this process: load, build the runner, first step; then 20 timed steps."""
    import torch

    from onekernel.cli_compile import CompileWatch
    from onekernel.models.load import load_model
    from onekernel.runtime.kv_cache import KVCache
    from onekernel.runtime.runners import make_step_runner

    t0 = time.perf_counter()
    m = load_model(model, random_weights=True, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    tok = torch.zeros(batch, dtype=torch.int32, device="cuda")
    t1 = time.perf_counter()
    with CompileWatch() as w:
        cache = KVCache(m.config, batch, min(ctx, m.config.max_seq_len), torch.bfloat16, "cuda")
        cache.seq_lens.fill_(min(ctx, m.config.max_seq_len) // 2)
        mode, _, gemv = mode.partition("@")
        name, _, backend = mode.partition("/")
        r = make_step_runner(name, m, cache, **({"backend": backend} if backend else {}),
                             **({"gemv": gemv} if gemv else {}))
        r.step(tok)
        torch.cuda.synchronize()
    first = time.perf_counter() - t1
    times = []
    for _ in range(20):
        a = time.perf_counter()
        r.step(tok)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - a) * 1e3)
    r.check()
    return {"load_s": round(load_s, 2), "first_step_s": round(first, 2), "step_ms": round(sorted(times)[10], 3),
            "kernels": w.count, "kernel_load_s": round(w.seconds, 2), "runner": type(r).__name__}


def run_child(model: str, batch: int, mode: str, ctx: int, env: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    cmd = [sys.executable, str(Path(__file__)), "--child", model, str(batch), mode, "--ctx", str(ctx)]
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timeout": timeout, "process_s": round(time.perf_counter() - t0, 1)}
    wall = round(time.perf_counter() - t0, 1)
    if p.returncode:
        return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1][:300], "process_s": wall}
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "process_s": wall}


def run_case(case: str, ctx: int, timeout: float) -> dict:
    model, batch, mode = case.split(":")
    base = tempfile.mkdtemp(prefix="ok_compile_")
    env = {**os.environ, "TRITON_CACHE_DIR": f"{base}/triton", "ONEKERNEL_CACHE": f"{base}/gen",
           "TRITON_INTERPRET": "0"}
    rec = {"model": model, "batch": int(batch), "mode": mode, "ctx": ctx}
    rec["cold"] = run_child(model, int(batch), mode, ctx, env, timeout)
    if "first_step_s" in rec["cold"]:
        rec["warm"] = run_child(model, int(batch), mode, ctx, env, timeout)
    print(json.dumps(rec), flush=True)
    return rec


def cell(r: dict, key: str) -> str:
    if "timeout" in r:
        return f"> {r['timeout']:.0f} (killed)"
    if "error" in r:
        return "error"
    return f"{r[key]:.1f}"


def table(records: list[dict]) -> str:
    rows = ["| model | batch | mode | cold first step (s) | cold process (s) | warm first step (s) | warm process (s) "
            "| kernels | step (ms) | runner |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        c, w = r["cold"], r.get("warm", {"error": "-"})
        rows.append(f"| {r['model']} | {r['batch']} | {r['mode']} | {cell(c, 'first_step_s')} | "
                    f"{cell(c, 'process_s')} | {cell(w, 'first_step_s') if 'warm' in r else '-'} | "
                    f"{cell(w, 'process_s') if 'warm' in r else '-'} | {c.get('kernels', '-')} | "
                    f"{c.get('step_ms', '-')} | {c.get('runner', '-')} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated MODEL:BATCH:MODE")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per process (cold and warm each)")
    ap.add_argument("--jobs", type=int, default=1, help="cases at once")
    ap.add_argument("--ctx", type=int, default=512, help="KV-cache length (the kernels are compiled for it)")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "BATCH", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2], a.ctx)))
        return
    if not a.out:
        ap.error("--out DIR is required")
    import torch
    import triton

    cases = [c for c in a.cases.split(",") if c]
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        records = list(ex.map(lambda c: run_case(c, a.ctx, a.timeout), cases))
    from onekernel.bench.report import commit_id

    commit = commit_id()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": gpu, "commit": commit,
            "torch": torch.__version__, "triton": triton.__version__, "jobs": a.jobs, "timeout_s": a.timeout,
            "cpus": os.cpu_count()}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"compile_times-{time.strftime('%Y-%m-%d')}-{commit or 'nocommit'}"
    Path(f"{stem}.json").write_text(json.dumps({**meta, "records": records}, indent=1))
    md = (f"Cold (empty Triton cache) and warm start, fresh process each; {meta['gpu']}, commit {commit or '?'}, "
          f"{meta['date']}, {a.jobs} case(s) at once on {meta['cpus']} CPUs, timeout {a.timeout:.0f} s.\n\n"
          + table(records) + "\n")
    Path(f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
