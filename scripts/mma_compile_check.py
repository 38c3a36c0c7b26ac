"""Compile the GEMV kernels of both paths (gemv="fma" CUDA cores, "mma" tensor cores) for sm_90a on a machine
without a GPU, and say what the PTX holds:

    python scripts/mma_compile_check.py [MODEL] [BATCH] [--megakernel] [--paths fma,mma]

One JSON line per kernel: model, batch, path, kind, N x K, BLOCK_N / BLOCK_K, ptxas registers and spill bytes,
shared memory, and instruction counts: ``mma`` (``mma.sync``, Triton's MMAv2 for tiles of 16-48 rows),
``wgmma`` (``wgmma.mma_async``, MMAv3 for tiles of 64 rows), ``fma`` (``fma.rn.f32``: the CUDA-core path's
products; on the MMA path only RMSNorm / RoPE / epilogue arithmetic is left). ``--megakernel``: also the
Triton megakernel of MODEL (random weights on the CPU, 132 workers, "fit" tiles) with every variant's
dispatch. Only shapes matter: the per-op kernels are compiled for stand-in tensors of the graph's dtypes.
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
os.environ.setdefault("ONEKERNEL_CACHE", tempfile.mkdtemp(prefix="onekernel_mma_"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from compile_check import PTXDIR, compile_sm90  # noqa: E402
from onekernel.exec.codegen import eager_kernel  # noqa: E402
from onekernel.models.config import get_config  # noqa: E402
from onekernel.models.decode_graph import decode_graph  # noqa: E402
from onekernel.ops.tiling import GEMV_PATHS, Tiling, pow2_ceil  # noqa: E402


def ptx_counts(ptx: str) -> dict:
    """Tensor-core and fp32 FMA instruction counts of a PTX text."""
    return {"mma": len(re.findall(r"\bmma\.sync\.aligned", ptx)), "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
            "fma": len(re.findall(r"\bfma\.rn\.f32", ptx))}


def gemv_ops(model: str, batch: int, gemv: str) -> list:
    """(graph, op) for one op of every GEMV kind and weight shape of ``model``'s decode step (the fused merge
    graph adds ``oproj_merge``), tiled for the separate kernels of an H200."""
    cfg = get_config(model)
    seen, out = set(), []
    for fuse in (False, True):
        g, _, _ = decode_graph(cfg, batch, 512, torch.bfloat16, tiling=Tiling(132, "cover"), fuse_merge=fuse,
                               gemv=gemv)
        for op in g.ops:
            key = (op.kind.name, g.buffers[op.args["w"]].shape if "w" in op.args else None)
            if "MMA" in op.kind.consts and key not in seen:
                seen.add(key)
                out.append((g, op))
    return out


def compile_op(model: str, batch: int, gemv: str, g, op) -> dict:
    """Compile the eager kernel of ``op`` for sm_90a (stand-in pointers of the buffers' dtypes)."""
    kd = op.kind
    ptrs = [torch.zeros(8, dtype=g.buffers[op.args[a]].dtype) for a in kd.args]
    consts = {**{n: op.params[n] for n in kd.consts}, "PDL": False, "PROFILE": False, "PROLOGUE_SPLIT": True,
              "TRIGGER": 1}
    w = g.buffers[op.args["w"]].shape
    name = f"{model}_B{batch}_{gemv}_{kd.name}_{w[0]}x{w[1]}"
    rep = compile_sm90(eager_kernel(kd), ptrs + [ptrs[0], 0], consts, kd.num_warps, name)
    p = op.params
    return {"model": model, "batch": batch, "gemv": gemv, "kernel": kd.name, "NxK": f"{w[0]}x{w[1]}",
            # qkv_rope: its register rows, 2 next_pow2(U) P
            "BLOCK_N": p.get("BLOCK_N", 2 * p.get("P", 0) * pow2_ceil(p.get("U", 1))), "BLOCK_K": p["BLOCK_K"],
            **{k: rep[k] for k in ("regs", "spill_bytes", "smem", "v4", "compile_s")},
            **ptx_counts((PTXDIR / f"{name}.ptx").read_text())}


def compile_megakernel(model: str, batch: int, gemv: str) -> dict:
    """Compile the Triton megakernel of ``model`` (every variant in its dispatch) for sm_90a."""
    from onekernel.exec import mk_device
    from onekernel.exec.megakernel import MegakernelRunner
    from onekernel.models.decode_graph import build_decode_step
    from onekernel.models.load import load_model
    from onekernel.runtime.kv_cache import KVCache

    m = load_model(model, random_weights=True, dtype=torch.bfloat16)
    cache = KVCache(m.config, batch, 512, torch.bfloat16, "cpu")
    mk = MegakernelRunner(build_decode_step(m.config, m.weights, cache, tiling=Tiling(132, "fit"), gemv=gemv),
                          n_workers=132)
    kw = {**mk._kw(), "PROFILE": False, "PREFETCH": True, "ACQ_LOAD": True}
    kw.pop("num_warps")
    name = f"{model}_B{batch}_{gemv}_megakernel"
    rep = compile_sm90(mk_device.megakernel, list(mk._args()), kw, mk.num_warps, name)
    return {"model": model, "batch": batch, "gemv": gemv, "kernel": "megakernel", "variants": len(mk.variants),
            **{k: rep[k] for k in ("regs", "spill_bytes", "smem", "v4", "compile_s")},
            **ptx_counts((PTXDIR / f"{name}.ptx").read_text())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="llama-3.2-1b")
    ap.add_argument("batch", nargs="?", type=int, default=8)
    ap.add_argument("--paths", default=",".join(GEMV_PATHS))
    ap.add_argument("--megakernel", action="store_true")
    a = ap.parse_args()
    for gemv in a.paths.split(","):
        for g, op in gemv_ops(a.model, a.batch, gemv):
            print(json.dumps(compile_op(a.model, a.batch, gemv, g, op)), flush=True)
        if a.megakernel:
            print(json.dumps(compile_megakernel(a.model, a.batch, gemv)), flush=True)


if __name__ == "__main__":
    main()
