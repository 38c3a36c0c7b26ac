"""Compile decode attention's kernels (``attn_partial_fold``, and ``attn_partial`` / ``attn_merge`` beside it) for
sm_90a on a machine without a GPU, and say what the PTX holds:

    python scripts/fold_compile_check.py [MODEL ...] [--batch 1,16] [--context 512,8192,131072]

One JSON line per kernel (per-op kernel, PDL off and on): model, batch, context, kernel, SPLIT / NSPLIT, ptxas
registers and spill bytes, shared memory, and the fold's memory-ordering instructions: ``atom``
(``atom.global.gpu.acq_rel``: one arrival per tile), ``bar`` (``bar.sync``: the CTA barrier before it and Triton's broadcast of
its result), ``ld_cg`` (``ld.global.cg``: L2 loads of activations and partials). The kernels' constexprs hold no
batch size, so every batch compiles the same kernel (its grid differs); the split follows the context
(``ops.attention.choose_split``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("ONEKERNEL_CACHE", tempfile.mkdtemp(prefix="onekernel_fold_"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from compile_check import PTXDIR, compile_sm90  # noqa: E402
from onekernel.exec.codegen import eager_kernel  # noqa: E402
from onekernel.models.config import get_config  # noqa: E402
from onekernel.models.decode_graph import decode_graph  # noqa: E402
from onekernel.ops.tiling import Tiling  # noqa: E402

KINDS = ("attn_partial_fold", "attn_partial", "attn_merge")


def attention_ops(model: str, batch: int, context: int) -> list:
    """(graph, op) for the first op of each of KINDS in ``model``'s bf16 decode step, folded and not."""
    out = []
    for fold in (True, False):
        g, _, _ = decode_graph(get_config(model), batch, context, torch.bfloat16, tiling=Tiling(132, "cover"),
                               fold_merge=fold)
        out += [(g, next(op for op in g.ops if op.kind.name == k)) for k in KINDS if any(
            op.kind.name == k for op in g.ops)]
    return out


def compile_attention(model: str, batch: int, context: int, g, op, pdl: bool) -> dict:
    kd = op.kind
    ptrs = [torch.zeros(8, dtype=g.buffers[op.args[a]].dtype) for a in kd.args]
    consts = {**{n: op.params[n] for n in kd.consts}, "PDL": pdl, "PROFILE": False, "PROLOGUE_SPLIT": True,
              "TRIGGER": 2}
    name = f"{model}_B{batch}_S{context}_{kd.name}{'_pdl' if pdl else ''}"
    rep = compile_sm90(eager_kernel(kd), ptrs + [ptrs[0], 0], consts, kd.num_warps, name)
    ptx = (PTXDIR / f"{name}.ptx").read_text()
    return {"model": model, "batch": batch, "context": context, "kernel": kd.name, "pdl": pdl,
            "SPLIT": op.params.get("SPLIT"), "NSPLIT": op.params["NSPLIT"], "num_warps": kd.num_warps,
            **{k: rep[k] for k in ("regs", "spill_bytes", "smem", "compile_s")},
            "atom": len(re.findall(r"\batom\.global\.gpu\.acq_rel\.", ptx)), "bar": len(re.findall(r"\bbar\.sync", ptx)),
            "ld_cg": len(re.findall(r"\bld\.global\.cg", ptx))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["llama-3.2-1b", "llama-3.1-8b"])
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--context", default="512,8192,131072")
    a = ap.parse_args()
    for model in a.models:
        for context in map(int, a.context.split(",")):
            for batch in map(int, a.batch.split(",")):
                for g, op in attention_ops(model, batch, context):
                    for pdl in (False, True):
                        print(json.dumps(compile_attention(model, batch, context, g, op, pdl)), flush=True)


if __name__ == "__main__":
    main()
