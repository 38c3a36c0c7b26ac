"""Compile the tensor-parallel megakernel (rank 0 of N) for an H200 (sm_90a) on a machine WITHOUT a GPU.

    python scripts/tp_compile_check.py [MODEL] [BATCH] [--backend triton|gluon] [--tp N] [--gemv fma|mma] [--push]
                                       [--oneshot]
                                             # default llama-3.2-1b 1 triton, N = 2 (N must divide its heads)

Builds rank 0's shard (uninitialised weights of the shard's shapes: only shapes matter here, and a 70B shard
is never drawn on the CPU) and its TP graph (all-reduce tile tasks, ``models.decode_graph(tp=(0, N))``), a
MegakernelRunner over CPU stand-in pools (only the addresses' arithmetic matters for compiling), compiles the
kernel with Triton's ptxas as scripts/compile_check.py does, and checks the PTX for what the cross-GPU
protocol needs: ``ld.global.acquire.sys`` (remote waits), a system-scope release atomic (the signals other ranks
read: ``atom.global.sys.release``), ``ld.volatile.global.b16`` (the all-reduce's volatile reads of the bf16
partials, told apart from the error word's 32-bit volatile polls), and the
gpu-scope waits and signals of the local events. Prints registers and spills against the TP=1 kernel of the same
shard. Exit code 1 when a needed instruction is missing, 2 (one line on stderr) for a bad command line, model,
batch or TP size (below 2, or not dividing the model's heads).

``--backend gluon``: the streaming Gluon megakernel instead (``scripts/stream_compile_check.compile_stream`` on
rank 0's TP graph and on the same shard's TP=1 graph): registers, spills, shared memory, ring slots, and the same
instructions. Register spills fail it beyond SPILL_LIMIT, and any spill instruction inside the innermost loops with
tensor-core instructions (the GEMV's chunk loop; ``scripts/sass_loops.py`` prints where every spill sits).

``--push`` (with ``--backend gluon``): a third kernel, the TP kernel of the push all-reduce (constexpr PUSH:
producers store their rows into the peers' pools and signal there, ``stream_base.push_rows``), with the same
instructions needed and more stores of 16-bit values (``st.global`` of the pushed rows) than the pull kernel.

``--oneshot``: instead, the kernel modes' one-shot all-reduce kernel (dist/tp_oneshot.py) of every rank, without
and with PDL: ``atom.global.sys.release.exch`` (the flag posts), ``ld.global.sys.acquire`` (the polls: Triton's
lowering of an acquire add of 0),
``ld.volatile.global.b16`` (the peers' rows), and the same PTX on every rank (the rank is read from memory).

``--gemv``: the GEMV path of both kernels (default: the unsharded model's, as the TP runners take it:
``dist.tp_kernels.rank_gemv``; tensor cores for bf16 Llama models); it ends the labels (``..._tp2_mma``).
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("ONEKERNEL_CACHE", tempfile.mkdtemp(prefix="onekernel_cc_"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from compile_check import PTXDIR, compile_sm90  # noqa: E402
from onekernel.dist.sharding import shard_config  # noqa: E402
from onekernel.dist.tp_megakernel import pool_layout  # noqa: E402
from onekernel.exec import mk_device  # noqa: E402
from onekernel.exec.megakernel import MegakernelRunner  # noqa: E402
from onekernel.models.decode_graph import build_decode_step  # noqa: E402
from onekernel.models.config import expected_shapes, get_config  # noqa: E402
from onekernel.ops.tiling import Tiling  # noqa: E402
from onekernel.runtime.kv_cache import KVCache  # noqa: E402

# PTX spells the atomics atom.global.<scope>.release.add; a volatile=True load of bf16 is ld.volatile.global.b16 (the
# error word's volatile polls are .b32: counting every ld.volatile.global would pass a kernel reading no partial so)
NEEDED = {"ld.global.acquire.sys": r"ld\.global\.acquire\.sys", "atom.sys.release": r"atom\.global\.sys\.release",
          "ld.volatile.global.b16": r"ld\.volatile\.global\.b16", "ld.global.acquire.gpu": r"ld\.global\.acquire\.gpu",
          "atom.gpu.release": r"atom\.global\.gpu\.release"}

# The streaming kernel's spill bytes allowed, as at TP=1 (tests/test_stream_compile.py: the attention run's flattened
# loop carries the next block's K/V and the next tile's q, 0-12 bytes in both GEMV bodies)
SPILL_LIMIT = 32  # as tests/test_stream_compile.py allows (register-allocation noise at 255 registers)


def model_gemv(name: str) -> str:
    """The GEMV path the TP ranks of ``name`` take by default in bf16 (``dist.tp_kernels.rank_gemv``)."""
    from onekernel.models.decode_graph import default_gemv

    return default_gemv(get_config(name), torch.bfloat16)


def main_gluon(name: str = "llama-3.2-1b", batch: int = 1, n: int = 2, gemv: str | None = None,
               push: bool = False) -> int:
    """The streaming kernel's compile check (module doc)."""
    import time

    from stream_compile_check import compile_stream, report

    gemv = gemv or model_gemv(name)
    rows = []
    for tp, psh in ((None, False), ((0, n), False)) + ((((0, n), True),) if push else ()):
        t0 = time.perf_counter()
        k, plan, consts = compile_stream(name, batch, 132, 512, gemv=gemv, tp=tp, shard=(0, n), push=psh)
        rep = report(k)
        label = f"{name}_B{batch}_stream_{f'tp{n}' if tp else f'tp1shard{n}'}{'_push' if psh else ''}_{gemv}"
        ptx = k.asm["ptx"]
        PTXDIR.mkdir(parents=True, exist_ok=True)
        (PTXDIR / f"{label}.ptx").write_text(ptx)
        found = {n: len(re.findall(p, ptx)) for n, p in {**NEEDED, "st.global.b16": r"st\.global\.b16"}.items()}
        rows.append((label, rep, found, len(plan.graph.tasks), plan.events.n_events, consts,
                     time.perf_counter() - t0))
    ok = True
    for label, rep, found, tasks, events, consts, sec in rows:
        print(f"{label}: {tasks} tasks, {events} events, regs {rep['regs']}, spill {rep['spill_bytes']} B "
              f"({rep['hot_loop_spills']} spill instructions in HMMA loops), smem {rep['smem']} B, "
              f"slots {consts['SLOTS']}, setmaxnreg {rep['setmaxnreg']}, mma.sync {rep['mma_sync']}, "
              f"ldmatrix {rep['ldmatrix']}, CK {consts['CK']}, RG {consts['RG']}, "
              f"compile {sec:.1f} s; "
              + ", ".join(f"{n} x{c}" for n, c in found.items()))
        if rep["spill_bytes"] > SPILL_LIMIT:
            ok = False
            print(f"{label}: register spills over {SPILL_LIMIT} B (where: python scripts/sass_loops.py "
                  f"{PTXDIR / (label + '.ptx')})")
        if rep["hot_loop_spills"]:
            ok = False
            print(f"{label}: {rep['hot_loop_spills']} spill instructions inside the tensor-core loops")
        if (rep["mma_sync"] > 0) != (gemv == "mma"):
            ok = False
            print(f"{label}: mma.sync x{rep['mma_sync']} on the {gemv} path")
    for row in rows[1:]:
        missing = [n for n, c in row[2].items() if not c]
        if missing:
            ok = False
            print(f"MISSING in the {row[0]} kernel's PTX: {', '.join(missing)}")
    if push and rows[2][2]["st.global.b16"] <= rows[1][2]["st.global.b16"]:
        ok = False
        print("the push kernel stores no more 16-bit values than the pull kernel: nothing is pushed")
    if any(rows[0][2][n] for n in ("ld.global.acquire.sys", "atom.sys.release", "ld.volatile.global.b16")):
        ok = False
        print("the TP=1 kernel has system-scope or volatile partial loads: the TP switch is not compiled out")
    print(f"PTX in {PTXDIR}")
    return 0 if ok else 1


# the one-shot all-reduce kernel (dist/tp_oneshot.py): the flag post (an exchange with system-scope release), the
# bounded polls (an atomic add of 0 with system-scope acquire, which Triton 3.6 compiles to ld.global.sys.acquire)
# and the volatile reads of the peers' bf16 rows
ONESHOT_NEEDED = {"atom.sys.release.exch": r"atom\.global\.sys\.release\.exch",
                  "ld.sys.acquire": r"ld\.global\.sys\.acquire|atom\.global\.sys\.acquire\.add",
                  "ld.volatile.global.b16": r"ld\.volatile\.global\.b16"}


def shard_step(cfg, n: int, rank: int, batch: int, tiles: str, tp, gemv: str):
    """Rank ``rank`` of ``n``'s shard of ``cfg`` (uninitialised bf16 weights: only shapes matter here), its KV cache of
    512 positions on the CPU and its bound decode step tiled for 132 SMs with ``tiles``, at ``tp`` ((rank, n), or None:
    the same shard at TP=1) on the ``gemv`` path."""
    shard = shard_config(cfg, n, rank)
    weights = {k: torch.empty(s, dtype=torch.bfloat16) for k, s in expected_shapes(shard.config).items()}
    if cfg.tie_embeddings:
        weights["lm_head"] = weights["tok_embeddings"]
    cache = KVCache(shard.config, batch, 512, torch.bfloat16, "cpu")
    return build_decode_step(shard.config, weights, cache, tiling=Tiling(132, tiles), tp=tp, gemv=gemv)


def main_oneshot(name: str = "llama-3.2-1b", batch: int = 1, n: int = 2, gemv: str | None = None) -> int:
    """``--oneshot``: the kernel modes' one-shot all-reduce kernel (``ALLREDUCE_ONESHOT``) of the first all-reduce of
    every rank's TP graph (per-op tiling "cover"), without and with PDL: the instructions of ONESHOT_NEEDED, and the
    same PTX on every rank (the rank is data, so one compiled kernel serves them all)."""
    from onekernel.dist.tp_oneshot import SPIN_LIMIT, oneshot_ops
    from onekernel.exec.codegen import eager_kernel
    from onekernel.ops.allreduce import ALLREDUCE_ONESHOT

    cfg = get_config(name)
    gemv = gemv or model_gemv(name)
    ptx_of, ok = {}, True
    for rank in range(n):
        g = shard_step(cfg, n, rank, batch, "cover", (rank, n), gemv).graph
        oneshot_ops(g, rank, SPIN_LIMIT)
        op = next(o for o in g.ops if o.kind is ALLREDUCE_ONESHOT)
        kd = op.kind
        bufs = [g.buffers[op.args[role]] for role in kd.args]  # CPU stand-ins: only the element types matter
        ptrs = [torch.empty(b.shape, dtype=b.dtype) for b in bufs]
        for pdl in (False, True):
            c = {**{k: op.params[k] for k in kd.consts}, "PDL": pdl, "PROFILE": False, "PROLOGUE_SPLIT": True,
                 "TRIGGER": 1}
            label = f"{name}_B{batch}_oneshot_tp{n}_rank{rank}{'_pdl' if pdl else ''}"
            rep = compile_sm90(eager_kernel(kd), ptrs + [ptrs[0], 0], c, kd.num_warps, label)
            ptx = (PTXDIR / f"{label}.ptx").read_text()
            found = {k: len(re.findall(v, ptx)) for k, v in ONESHOT_NEEDED.items()}
            ptx_of[(rank, pdl)] = re.sub(r"^//.*$", "", ptx, flags=re.M)  # the header comment names the file
            print(f"{label}: {op.name} ({op.n_tiles} tiles), regs {rep['regs']}, spill {rep['spill_bytes']} B, "
                  f"compile {rep['s']:.1f} s; " + ", ".join(f"{k} x{v}" for k, v in found.items()))
            missing = [k for k, v in found.items() if not v]
            if missing:
                ok = False
                print(f"MISSING in {label}'s PTX: {', '.join(missing)}")
    for (rank, pdl), ptx in ptx_of.items():
        if ptx != ptx_of[(0, pdl)]:
            ok = False
            print(f"rank {rank}'s one-shot kernel{' (pdl)' if pdl else ''} differs from rank 0's: the rank is compiled in")
    print(f"PTX in {PTXDIR}")
    return 0 if ok else 1


def main(name: str = "llama-3.2-1b", batch: int = 1, n: int = 2, gemv: str | None = None) -> int:
    cfg = get_config(name)
    gemv = gemv or model_gemv(name)
    rows = []
    for tp in (None, (0, n)):
        step = shard_step(cfg, n, 0, batch, "fit", tp, gemv)
        kw = {}
        if tp:
            nbytes, n_counters, offsets = pool_layout(step.graph)
            pools = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(n)]
            for nm, (p, src) in step.graph.meta["peers"].items():
                b = step.graph.buffers[nm]
                step.tensors[nm] = pools[p][offsets[src]:offsets[src] + b.nbytes].view(b.dtype).view(b.shape)
            kw = {"rank": 0, "counters": [p[:4 * n_counters].view(torch.int32) for p in pools]}
        mk = MegakernelRunner(step, n_workers=132, **kw)
        k = {**mk._kw(), "ACQ_LOAD": True}
        k.pop("num_warps")
        label = f"{name}_B{batch}_megakernel_{f'tp{n}' if tp else f'tp1shard{n}'}_{gemv}"
        rep = compile_sm90(mk_device.megakernel, list(mk._args()), k, mk.num_warps, label)
        ptx = (PTXDIR / f"{label}.ptx").read_text()
        found = {n: len(re.findall(p, ptx)) for n, p in NEEDED.items()}
        rows.append((label, rep, found, len(mk.graph.tasks), mk.events.n_events))
    ok = True
    for label, rep, found, tasks, events in rows:
        print(f"{label}: {tasks} tasks, {events} events, regs {rep['regs']}, spill {rep['spill_bytes']} B, "
              f"loads {rep['loads']} (v4 {rep['v4']}), compile {rep['s']:.1f} s; " +
              ", ".join(f"{n} x{c}" for n, c in found.items()))
    tp_found = rows[1][2]
    missing = [n for n, c in tp_found.items() if not c]
    if missing:
        ok = False
        print(f"MISSING in the TP kernel's PTX: {', '.join(missing)}")
    if any(rows[0][2][n] for n in ("ld.global.acquire.sys", "atom.sys.release", "ld.volatile.global.b16")):
        ok = False
        print("the TP=1 kernel has system-scope or volatile partial loads: the TP switch is not compiled out")
    print(f"PTX in {PTXDIR}")
    return 0 if ok else 1


def usage_error(message: str) -> int:
    """Print one line for a bad command line (stderr) and return exit status 2."""
    print(f"tp_compile_check: {message} (see --help)", file=sys.stderr)
    return 2


def cli(argv: list[str]) -> int:
    """Parse the command line (module doc) and run one check: 0 when it passes, 1 when the compiled kernels miss
    something, 2 for a bad command line, model, batch or TP size (one line on stderr, nothing compiled)."""
    from onekernel.errors import OneKernelError

    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    flags = {"--tp": "2", "--backend": "triton", "--gemv": None}
    for f in flags:
        if f in argv:
            i = argv.index(f)
            if i + 1 >= len(argv):
                return usage_error(f"{f} needs a value")
            flags[f] = argv[i + 1]
            del argv[i:i + 2]
    push, oneshot = "--push" in argv, "--oneshot" in argv
    for f in ("--push", "--oneshot"):
        if f in argv:
            argv.remove(f)
    backend, gemv = flags["--backend"], flags["--gemv"]
    if oneshot and (backend != "triton" or push):
        return usage_error("--oneshot is the kernel modes' all-reduce kernel: no --backend gluon, no --push")
    if push and backend != "gluon":
        return usage_error("--push needs --backend gluon (the push all-reduce is the streaming kernel's)")
    if backend not in ("triton", "gluon"):
        return usage_error(f"--backend must be triton or gluon, got {backend!r}")
    if gemv not in (None, "fma", "mma"):
        return usage_error(f"--gemv must be fma or mma, got {gemv!r}")
    stray = [a for a in argv if a.startswith("-") and not a.lstrip("-").isdecimal()]
    if len(argv) > 2 or stray:
        return usage_error(f"unexpected arguments {stray or argv[2:]}")
    try:
        batch, n = int(argv[1]) if len(argv) > 1 else 1, int(flags["--tp"])
    except ValueError:
        batch = n = 0
    if batch < 1 or n < 2:
        return usage_error(f"BATCH takes an integer >= 1 and --tp one >= 2, got {(argv[1:2] or ['1'])[0]!r} and "
                           f"{flags['--tp']!r}")
    name = (argv[0:1] or ["llama-3.2-1b"])[0]
    try:  # the model and the TP size before anything is built: an unknown model, a TP size not dividing the heads
        shard_config(get_config(name), n, 0)
    except OneKernelError as e:
        return usage_error(str(e))
    fn = main_gluon if backend == "gluon" else main_oneshot if oneshot else main
    try:
        return fn(name, batch, n=n, gemv=gemv, **({"push": True} if push else {}))
    except OneKernelError as e:  # bad input found while building (e.g. a batch the kernel cannot hold)
        return usage_error(str(e))


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
