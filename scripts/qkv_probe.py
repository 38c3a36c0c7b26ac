"""Where does the separate kernels' qkv_rope spend its time? Time it against variants that leave a part out, on the GPU:

    python scripts/qkv_probe.py [--models llama-3.2-1b,llama-3.1-8b] [--batch 1] [--warm] [--out F]

Variants of ``ops.qkv.qkv_rope_body`` made by editing its source text (written to a temporary module, so the repository
holds one body): "base" (the op as it is), "no-rope" (the RoPE rotation left out: q and k stored as the GEMV gives them;
the cos / sin and the pair exchange become dead code), "no-norm" (no RMSNorm: neither the rstd pass over x nor the
per-chunk scaling), "gemv-only" (both left out). Beside them, for the same weight bytes: gate_up with 2F = the qkv rows
(a GEMV with RMSNorm and the SiLU epilogue), at the separate kernels' tiling. Every variant: every layer's op back to back
in one CUDA graph, L2 flushed before each timed replay, median us per op (as scripts/gemv_sweep.py). Only the base is
checked against the reference (the others compute something else on purpose). ``--warm``: compile and run each once.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

EDITS = {  # variant -> [(text in qkv_rope_body, replacement)]
    "no-rope": [("yr = (rnd(y * cs, dt) + rnd(rot * sn, dt)).to(dt)", "yr = y.to(dt)")],
    "no-norm": [("rstd = rms_rstd(x, B, D, BLOCK_B, EPS)", "rstd = tl.full([BLOCK_B], 1.0, tl.float32)"),
                ("B, D, R, BLOCK_K, True, STAGES)", "B, D, R, BLOCK_K, False, STAGES)")],
}
EDITS["gemv-only"] = EDITS["no-rope"] + EDITS["no-norm"]


def variant_kind(name: str):
    """The qkv_rope OpKind with its body edited as EDITS[name] (a module written under a temporary directory on
    sys.path, so that the generated kernel can import it)."""
    from onekernel.ops import qkv
    src = textwrap.dedent(inspect.getsource(qkv.qkv_rope_body.fn))
    for old, new in EDITS[name]:
        if old not in src:
            raise RuntimeError(f"{name}: {old!r} is no longer in qkv_rope_body; update EDITS")
        src = src.replace(old, new)
    mod = f"qkv_probe_{name.replace('-', '_')}"
    d = Path(tempfile.gettempdir()) / "qkv_probe"
    d.mkdir(exist_ok=True)
    (d / f"{mod}.py").write_text("import triton\nimport triton.language as tl\nfrom onekernel.ops.qkv import *\n"
                                 "from onekernel.ops.qkv import _qkv_rows\n\n" + src)
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
    body = importlib.import_module(mod).qkv_rope_body
    return dataclasses.replace(qkv.QKV_ROPE, name=f"qkv_rope_{mod}", body=body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    import gemv_sweep
    from onekernel.bench.timing import graph_median_ms
    from onekernel.exec.codegen import launch_op
    from onekernel.models.config import get_config

    recs = []
    for name in a.models.split(","):
        cfg = get_config(name)
        rows = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        cases = [("qkv_rope", v, cfg) for v in ("base", "no-rope", "no-norm", "gemv-only")]
        cases.append(("gate_up", "2F = qkv rows", dataclasses.replace(cfg, ffn_dim=rows // 2)))
        for kind, var, c in cases:
            g, t = gemv_sweep.build(kind, c, a.batch, {}, 1 if a.warm else c.n_layers)
            ops = g.ops
            if var not in ("base", "2F = qkv rows"):
                vk = variant_kind(var)
                ops = [dataclasses.replace(op, kind=vk) for op in ops]
            rec = {"model": name, "kind": kind, "variant": var, "batch": a.batch, "tiles": ops[0].n_tiles,
                   "params": {k: v for k, v in ops[0].params.items() if k in ("P", "U", "BLOCK_N", "BLOCK_K", "STAGES")}}
            if var in ("base", "2F = qkv rows"):
                out = next(iter(ops[0].args[r] for r in ("q", "out") if r in ops[0].args))
                rec["rel_err"] = gemv_sweep.check(g, t, ops[0], out)
            if a.warm:
                for op in ops:
                    launch_op(g, op, t)
            else:
                ms = graph_median_ms(lambda: [launch_op(g, op, t) for op in ops], inner=3, steps=20, flush_l2=True)
                nbytes = sum(g.tasks[tk].bytes for op in g.ops for tk in op.task_ids)
                rec.update(us_per_op=1e3 * ms / len(ops), mb_per_op=nbytes / len(ops) / 1e6)
            print(json.dumps(rec), flush=True)
            recs.append(rec)
            del g, t
            torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
