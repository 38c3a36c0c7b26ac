"""Compile time and code size of every kernel of a decode step, for sm_90, on a machine WITHOUT a GPU.

    python scripts/compile_sizes.py MODEL[,MODEL...] BATCH[,BATCH...] [--kernels all|megakernel|ops]
                                    [--timeout S] [--out FILE.jsonl] [--ctx N]

Each kernel compiles in its own process with an empty ``TRITON_CACHE_DIR`` (a cold compile, ptxas included)
and a wall-clock ``--timeout`` (a kernel that takes longer is recorded as ``{"timeout": S}``). No weights are
loaded: the graph comes from the config (``models.decode_graph.decode_graph``) and every pointer argument is
a 16-byte placeholder of the buffer's dtype, so an 8B model costs no memory. Per-op kernels are the
eager/graph kernels ("cover" tiles, PDL off; the PDL variant is the same body); the megakernel is the default
runner's (its "fit" tiles, prefetch on, profile off). One JSON line per kernel: model, batch, kernel,
compile_s (triton.compile, wall clock), compile_cpu_s (its CPU seconds, ptxas included: the figure to compare
on a shared machine), regs, spill_bytes, ptx_bytes, cubin_bytes, loads, v4 (16-byte loads).
``--key MODEL BATCH KERNEL`` prints the kernel's key in Triton's on-disk cache instead (tests/test_compile_cli.py
checks that two processes get the same one).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(model: str, batch: int, ctx: int, kernel: str):
    """(fn, args, constexprs, num_warps) of one kernel: an op kind's per-op kernel or "megakernel"."""
    import torch

    from onekernel.exec import mk_device
    from onekernel.exec.codegen import eager_kernel, load_source, variant_of
    from onekernel.exec.megakernel_src import run_task_source
    from onekernel.models.config import get_config
    from onekernel.models.decode_graph import decode_graph
    from onekernel.ops.tiling import Tiling

    cfg = get_config(model)
    ph = {}  # one placeholder per dtype

    def t(dt):
        return ph.setdefault(dt, torch.empty(16, dtype=dt))

    if kernel == "megakernel":
        g, _, _ = decode_graph(cfg, batch, min(ctx, cfg.max_seq_len), torch.bfloat16, tiling=Tiling(132, "fit"))
        variants = []
        for op in g.ops:
            v = variant_of(g, op)
            if v not in variants:
                variants.append(v)
        run_task = load_source(run_task_source(variants), "megakernel").run_task
        i32, i64 = t(torch.int32), t(torch.int64)
        args = [i64, i32, i32, i64, i32, i32, i32, i32, i64, t(torch.bfloat16), t(torch.float16),
                t(torch.float32), i32, i64, 132, 1 << 26]
        kw = {"RUN_TASK": run_task, "MAXA": max(len(op.kind.args) for op in g.ops), "PROFILE": False,
              "PREFETCH": True, "ACQ_LOAD": True}
        return mk_device.megakernel, args, kw, max(v.kind.num_warps for v in variants)
    g, _, _ = decode_graph(cfg, batch, min(ctx, cfg.max_seq_len), torch.bfloat16, tiling=Tiling(132, "cover"))
    op = next(o for o in g.ops if o.kind.name == kernel)
    kd = op.kind
    ptrs = [t(g.buffers[op.args[a]].dtype) for a in kd.args]
    c = {**{n: op.params[n] for n in kd.consts}, "PDL": False, "PROFILE": False, "PROLOGUE_SPLIT": True,
         "TRIGGER": 1}
    return eager_kernel(kd), ptrs + [t(torch.int64), 0], c, kd.num_warps


def kernel_names(model: str) -> list[str]:
    import torch

    from onekernel.models.config import get_config
    from onekernel.models.decode_graph import decode_graph

    g, _, _ = decode_graph(get_config(model), 1, 64, torch.bfloat16)
    return sorted({op.kind.name for op in g.ops})


def one(model: str, batch: int, ctx: int, kernel: str) -> dict:
    """Compile one kernel here (the child process) and return its record."""
    from compile_check import compile_sm90

    fn, args, kw, nw = build(model, batch, ctx, kernel)
    rep = compile_sm90(fn, args, kw, nw, f"{model}_B{batch}_{kernel}")
    return {"model": model, "batch": batch, "kernel": kernel, **rep}


def run_case(model: str, batch: int, ctx: int, kernel: str, timeout: float) -> dict:
    """One kernel in a fresh process with an empty Triton cache; {"timeout": s} if it ran past ``timeout``."""
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton_cold_"), "TRITON_INTERPRET": "0"}
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, str(Path(__file__)), "--one", model, str(batch), kernel, "--ctx",
                            str(ctx)], capture_output=True, text=True, timeout=timeout, env=env, cwd=HERE)
    except subprocess.TimeoutExpired:
        return {"model": model, "batch": batch, "kernel": kernel, "timeout": timeout}
    if p.returncode:
        return {"model": model, "batch": batch, "kernel": kernel, "error": p.stderr.strip().splitlines()[-1:]}
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    rec["process_s"] = round(time.time() - t0, 1)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="?")
    ap.add_argument("batches", nargs="?")
    ap.add_argument("--kernels", default="all", help="all | megakernel | ops | a comma-separated list of kinds")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--out", default=None, help="append JSON lines here too")
    ap.add_argument("--one", nargs=3, metavar=("MODEL", "BATCH", "KERNEL"), help=argparse.SUPPRESS)
    ap.add_argument("--key", nargs=3, metavar=("MODEL", "BATCH", "KERNEL"),
                    help="print the kernel's key in Triton's on-disk cache (no compile)")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.ctx, a.one[2])))
        return
    if a.key:
        from compile_check import ast_source

        fn, args, kw, _ = build(a.key[0], int(a.key[1]), a.ctx, a.key[2])
        print(ast_source(fn, args, kw).hash())
        return
    for model in a.models.split(","):
        ops = kernel_names(model)
        ks = {"all": ops + ["megakernel"], "megakernel": ["megakernel"], "ops": ops}.get(a.kernels)
        for batch in [int(b) for b in a.batches.split(",")]:
            for k in ks or a.kernels.split(","):
                rec = run_case(model, batch, a.ctx, k, a.timeout)
                line = json.dumps(rec)
                print(line, flush=True)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    main()
