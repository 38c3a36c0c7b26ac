"""Compile the streaming (Gluon) megakernel for sm_90a on a machine without a GPU and report registers,
spills, shared memory, the partitions' register split and the mbarrier offset:

    python scripts/stream_compile_check.py [MODEL] [BATCH] [WORKERS] [GEMV] [SEQ]  # e.g. llama-3.2-1b 1 132 mma 4096

(``STREAM_PROFILE=1``: the kernel ``profile=True`` runs, with its task stamps; ``STREAM_PDL=first|mid|last``: that
kernel of the separate-kernel pdl mode on these bodies, exec.stream_segments), prints one JSON record (compile seconds, registers, spill bytes, shared memory, ring slots, mbarrier offset,
and the PTX's tensor-core instructions: ``mma.sync``, ``ldmatrix``; ``cp_async_16``: the 16-byte ``cp.async.cg`` copies of
the activation-tile prefetch above batch 4 at CK 1024, ``stream_base.mma_async_a``). GEMV: "fma" (CUDA cores, the default) or
"mma" (the tensor-core body of a gemv="mma" step).

Only the graph's shapes matter (no weights are made): the plan, the records and the constants are built as on
the GPU; tensors are CPU stand-ins of the right dtypes.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

SMEM_OPTIN_H200 = 232448  # shared memory per block (opt-in) of an H100/H200


def compile_stream(model: str = "llama-3.2-1b", batch: int = 1, workers: int = 132, seq: int = 1024,
                   dtype=torch.bfloat16, gemv: str = "fma", tp: tuple[int, int] | None = None,
                   shard: tuple[int, int] | None = None, push: bool = False):
    """(compiled kernel, plan, constants) of the streaming megakernel for ``model`` compiled for sm_90a; with
    ``tp`` = (rank, n) rank's shard of the tensor-parallel graph (all-reduce tasks, remote waits); with only
    ``shard`` = (rank, n) that shard's single-GPU graph (the TP=1 kernel of the same shapes); ``push``: the TP
    kernel of the push all-reduce (constexpr PUSH)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from onekernel.exec import stream_device as sd
    from onekernel.exec.stream_plan import bars_guess, make_plan
    from onekernel.exec.stream_records import records
    from onekernel.exec.stream_runner import fit_kernel
    from onekernel.models.config import get_config
    from onekernel.models.decode_graph import decode_graph
    from onekernel.ops.tiling import Tiling

    cfg = get_config(model)
    if tp or shard:
        from onekernel.dist.sharding import shard_config
        rank, n = tp or shard
        cfg = shard_config(cfg, n, rank).config
    g, _, _ = decode_graph(cfg, batch, seq, dtype, tiling=Tiling(workers, "fit"), gemv=gemv, tp=tp)
    from onekernel.exec.stream_support import unsupported_graph
    reason = unsupported_graph(g, batch)
    if reason:  # the runner refuses this step ("auto" takes the Triton megakernel): its kernel would never run
        raise SystemExit(f"{model} batch {batch}: the streaming megakernel does not run this step: {reason}")
    plan = make_plan(SimpleNamespace(graph=g, batch=batch, device=torch.device("cpu")), workers)
    records(plan)  # the tables build on the host as on the GPU
    i32, i64 = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)
    args = [torch.zeros(8, dtype=dtype), i32, i32, i32, i64, i32, i32, i32, i32, i32, i64, torch.zeros(8, dtype=dtype),
            torch.zeros(4, dtype=torch.float32), i32, i32, i64, i32, i32, i32, i32]
    fn = sd.stream_megakernel
    consts = dict(plan.consts, WAIT_NS=2_000_000_000, PROFILE=os.environ.get("STREAM_PROFILE") == "1")
    if push:
        consts["PUSH"] = True
    seg = os.environ.get("STREAM_PDL")  # first | mid | last: a kernel of the segmented pdl mode (exec.stream_segments)
    if seg:
        consts.update(FIRST=seg == "first", LAST=seg == "last", PDL=True)
    consts["BARS"] = bars_guess(consts)
    sig = {n: mangle_type(a) for n, a in zip(fn.arg_names, args)}
    sig.update({n: "constexpr" for n in consts})
    unaligned = {fn.arg_names.index("qend"), fn.arg_names.index("cend")}  # qoff[1:], chunk_off[1:] at run time
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(args)
             if isinstance(a, torch.Tensor) and i not in unaligned}

    def compile_fn(c):
        cst = {(fn.arg_names.index(n),): v for n, v in c.items()}
        return triton.compile(GluonASTSource(fn, sig, cst, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4})

    n = [0]

    def counted(c):
        n[0] += 1
        return compile_fn(c)
    k, consts = fit_kernel(counted, consts, SMEM_OPTIN_H200)
    consts["compiles"] = n[0]
    return k, plan, consts


def report(k) -> dict:
    """ptxas registers and spill bytes, shared memory, the partitions' register split, the weight copies' sites, and
    the spill instructions inside the innermost loops with tensor-core instructions (sass_loops.spill_report)."""
    from sass_loops import assemble, spill_report

    ptx = k.asm["ptx"]
    sass, rep = assemble(ptx, "the streaming kernel")  # ptxas once: its -v report and the SASS
    regs = re.search(r"Used (\d+) registers", rep)
    spill = re.search(r"(\d+) bytes spill stores", rep)
    maxnreg = sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
    return {"regs": int(regs.group(1)) if regs else None, "spill_bytes": int(spill.group(1)) if spill else 0,
            "smem": k.metadata.shared, "setmaxnreg": maxnreg, "bulk_copies": ptx.count("cp.async.bulk.shared::cluster.global"),
            "mma_sync": ptx.count("mma.sync"), "ldmatrix": ptx.count("ldmatrix"),
            "cp_async_16": ptx.count("cp.async.cg.shared.global [ "),  # Triton's own (the activation tiles)
            "attn_copies": ptx.count("cp.async.cg.shared.global [%"),  # the tensor-core attention's inline ones
            "attn_skip": ptx.count("brev.b64"),  # the dead-tile walk's first-live lookups (exec.stream_attn_runs)
            "hot_loop_spills": spill_report(ptx, sass)["hot_loop_spills"]}


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-1b"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 132
    gemv = sys.argv[4] if len(sys.argv) > 4 else "fma"
    seq = int(sys.argv[5]) if len(sys.argv) > 5 else 1024  # KV cache positions (ops.attention.choose_split's S)
    t0 = time.perf_counter()
    k, plan, consts = compile_stream(model, batch, workers, gemv=gemv, seq=seq)
    rec = {"model": model, "batch": batch, "workers": workers, "gemv": gemv, "seq": seq,
           "compile_s": round(time.perf_counter() - t0, 1),
           **report(k), "tasks": len(plan.graph.tasks),
           **{n: consts[n] for n in ("B", "XB", "RG", "CK", "KXB", "SLOTS", "BARS", "NT", "BN", "GB", "HD", "ATTN_TC",
                                          "SPLIT", "NSPLIT", "NSS", "compiles")}}
    print(json.dumps(rec))
    if os.environ.get("PTX_OUT"):
        Path(os.environ["PTX_OUT"]).write_text(k.asm["ptx"])


if __name__ == "__main__":
    from onekernel.errors import OneKernelError

    try:
        main()
    except (OneKernelError, ValueError) as e:  # a bad model name, batch, worker count or GEMV path: one line
        raise SystemExit(f"stream_compile_check: {e}") from None
