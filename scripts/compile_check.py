"""Compile every generated kernel for an H200 (sm_90) on a machine WITHOUT a GPU, and report what matters.

Triton ships ptxas, so the per-op kernels and the megakernel can be compiled here, costing no device time:

    python scripts/compile_check.py [MODEL] [BATCH]      # e.g. smollm2-135m 1, llama-3.2-1b 8

For each kernel: registers per thread and spill bytes (from ``ptxas -v``), shared memory, and the number of
global loads that are 16-byte (v4) or 8-byte (v2) vectors: a weight stream without v4 loads is a bandwidth bug
(seen: the megakernel's int64-cast pointers lost their alignment and every load became scalar). Pointer
arguments are declared 16-byte aligned, as Triton's JIT specializes them at a real launch. PTX files are
written to $PTXDIR (default /tmp/onekernel_ptx) for reading.
"""
from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("ONEKERNEL_CACHE", tempfile.mkdtemp(prefix="onekernel_cc_"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from onekernel.exec import mk_device  # noqa: E402
from onekernel.exec.codegen import eager_kernel  # noqa: E402
from onekernel.exec.megakernel import MegakernelRunner  # noqa: E402
from onekernel.models.decode_graph import build_decode_step  # noqa: E402
from onekernel.models.load import load_model  # noqa: E402
from onekernel.ops.tiling import Tiling  # noqa: E402
from onekernel.runtime.kv_cache import KVCache  # noqa: E402
from sass_loops import BIN  # noqa: E402  (scripts/ is sys.path[0] when run as a script)

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = BIN / "ptxas"  # Triton's (sass_loops.BIN)
PTXDIR = Path(os.environ.get("PTXDIR", "/tmp/onekernel_ptx"))
TYPES = {torch.int32: "*i32", torch.int64: "*i64", torch.float32: "*fp32", torch.bfloat16: "*bf16",
         torch.float16: "*fp16"}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (ptxas runs as one)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ast_source(fn, args: list, constexprs: dict) -> ASTSource:
    """What ``triton.compile`` takes for JITFunction ``fn`` with ``args`` (tensors -> 16-byte aligned pointers, as
    the JIT specialises them at a launch; ints -> i32/i64) and ``constexprs``; its ``hash()`` is the kernel's key in
    Triton's on-disk cache (with the target and options)."""
    sig, consts, attrs = {}, {}, {}
    for i, (n, a) in enumerate(zip(fn.arg_names, args)):
        if isinstance(a, torch.Tensor):
            sig[n] = TYPES[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "i32" if abs(a) < 2 ** 31 else "i64"
    for n, v in constexprs.items():
        sig[n] = "constexpr"
        consts[(fn.arg_names.index(n),)] = v
    return ASTSource(fn, sig, consts, attrs)


def compile_sm90(fn, args: list, constexprs: dict, num_warps: int, name: str, out_dir: Path | None = None,
                 ttgir: bool = False) -> dict:
    """Compile JITFunction ``fn`` for sm_90 with ``args`` (tensors -> aligned pointers, ints -> i32/i64).
    Writes ``name``.ptx (and with ``ttgir`` ``name``.ttgir) to ``out_dir`` (default $PTXDIR)."""
    t0, c0 = time.time(), cpu_seconds()
    k = triton.compile(ast_source(fn, args, constexprs), target=TARGET, options={"num_warps": num_warps})
    compile_s, compile_cpu_s = time.time() - t0, cpu_seconds() - c0
    ptx = k.asm["ptx"]
    out_dir = out_dir or PTXDIR
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.ptx").write_text(ptx)
    if ttgir:
        (out_dir / f"{name}.ttgir").write_text(k.asm["ttgir"])
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    rep = subprocess.run([str(PTXAS), "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    os.unlink(f.name)
    spill = re.search(r"(\d+) bytes spill stores", rep)
    return {"regs": int(re.search(r"Used (\d+) registers", rep).group(1)), "spill_bytes": int(spill.group(1)) if
            spill else 0, "smem": k.metadata.shared, "v4": len(re.findall(r"ld\.global(?:\.[\w:]+)*\.v4", ptx)),
            "v2": len(re.findall(r"ld\.global(?:\.[\w:]+)*\.v2", ptx)), "loads": len(re.findall(r"ld\.global", ptx)),
            "s": time.time() - t0, "compile_s": round(compile_s, 2),
            "compile_cpu_s": round(compile_cpu_s, 2), "ptx_bytes": len(ptx),
            "cubin_bytes": len(k.asm["cubin"])}


def main(name: str = "smollm2-135m", batch: int = 1) -> None:
    model = load_model(name, random_weights=True, dtype=torch.bfloat16)
    cache = KVCache(model.config, batch, 512, torch.bfloat16, "cpu")
    r = MegakernelRunner(build_decode_step(model.config, model.weights, cache, tiling=Tiling(132, "cover")),
                         n_workers=132)  # the per-op kernels' tiles
    mk = MegakernelRunner(build_decode_step(model.config, model.weights, cache, tiling=Tiling(132, "fit")),
                          n_workers=132)
    print(f"{name} batch {batch}: megakernel {len(mk.graph.tasks)} tasks, {mk.events.n_events} events, "
          f"{len(mk.variants)} branches; separate kernels {len(r.graph.tasks)} tiles")
    row = ("{:28s} regs {regs:3d} spill {spill_bytes:4d} B  smem {smem:6d}  loads {loads:4d} (v4 {v4:3d}, v2 {v2:3d})"
           "  compile {s:5.1f} s")
    for kind in sorted({op.kind.name for op in r.graph.ops}):
        op = next(o for o in r.graph.ops if o.kind.name == kind)
        kd = op.kind
        ptrs = [r.tensors[op.args[a]] for a in kd.args]
        for pdl in (False, True):
            c = {**{n: op.params[n] for n in kd.consts}, "PDL": pdl, "PROFILE": False, "PROLOGUE_SPLIT": True,
                 "TRIGGER": 1}
            rep = compile_sm90(eager_kernel(kd), ptrs + [ptrs[0], 0], c, kd.num_warps,
                               f"{name}_B{batch}_{kind}{'_pdl' if pdl else ''}")
            print(row.format(f"{kind}{' (pdl)' if pdl else ''}", **rep))
    for flags in (False, True):
        kw = {**mk._kw(), "PROFILE": flags, "PREFETCH": flags, "ACQ_LOAD": True}
        kw.pop("num_warps")
        rep = compile_sm90(mk_device.megakernel, list(mk._args()), kw, mk.num_warps,
                           f"{name}_B{batch}_megakernel{'_prof_pf' if flags else ''}")
        print(row.format(f"megakernel{' (profile+prefetch)' if flags else ''}", **rep))
    print(f"PTX in {PTXDIR}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m", int(sys.argv[2]) if len(sys.argv) > 2 else 1)
