"""Does a refactor change the streaming megakernel's machine code? Compile it in this tree and in another one
(e.g. a ``git worktree`` of the commit the tables were measured at) for sm_90a, on a machine without a GPU, and
compare the PTX up to register and label names (debug-scope labels, line records and blank lines dropped):

    python scripts/ptx_compare.py OTHER_TREE [--out DIR] [--kernels qwen3-8b:8:mma,llama-3.2-1b:8:fma:0:2,...]
                                  [--params] [--seq 512]

Seven kernels: Llama-3.2-1B batch 1 / 8 / 16 and Llama-3.1-8B batch 1 with tensor cores, SmolLM2-135M batch 3
and Llama-3.2-1B batch 1 with CUDA cores, and a TP=2 rank of Llama-3.2-1B at batch 8 (``--kernels``: others;
``STREAM_PROFILE=1``: the profiling builds, ``scripts/stream_compile_check``). Equal PTX means a
benchmark table measured with the other tree still describes this one. Prints one line per kernel and exits 1
when any differs (the normalised PTX of both trees stays in --out for a diff).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = [("llama-3.2-1b", 1, "mma", None), ("llama-3.2-1b", 8, "mma", None), ("llama-3.2-1b", 16, "mma", None),
           ("llama-3.1-8b", 1, "mma", None), ("smollm2-135m", 3, "fma", None), ("llama-3.2-1b", 1, "fma", None),
           ("llama-3.2-1b", 8, "fma", (0, 2))]

DUMP = """
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
tree, out, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree, tree + "/scripts"]
from stream_compile_check import compile_stream
for m, b, gv, tp in {kernels!r}:
    k, _, _ = compile_stream(m, b, 132, gemv=gv, tp=tp, seq=seq)
    open(f"{{out}}/{{m}}-{{b}}-{{gv}}-{{f'tp{{tp[0]}}of{{tp[1]}}' if tp else 'x'}}.ptx", "w").write(k.asm["ptx"])
"""


def normalise(ptx: str, params: bool = False) -> str:
    """PTX without line records, comments, debug sections, debug-scope labels and register declarations, its
    registers and labels renamed in order of first appearance; ``params``: the parameter declarations dropped and
    every parameter named alike (one tree's kernel has an argument the other lacks: the code is compared)."""
    if params:
        ptx = "\n".join(ln for ln in ptx.splitlines() if not ln.strip().startswith(".param"))
        ptx = re.sub(r"\w+_param_\d+", "PARAM", ptx)
    ptx = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
    ptx = "\n".join(ln for ln in ptx.splitlines() if not ln.strip().startswith((".loc", ".file", "//")))
    ptx = re.sub(r"^\$L__tmp\d+:\s*$", "", ptx, flags=re.M)
    ptx = re.sub(r"\.reg\s+[^;]*;", "", ptx)
    regs: dict[str, dict[str, str]] = {}
    ptx = re.sub(r"%([a-z]+)(\d+)", lambda m: regs.setdefault(m.group(1), {}).setdefault(
        m.group(0), f"%{m.group(1)}#{len(regs[m.group(1)])}"), ptx)
    labels: dict[str, str] = {}
    ptx = re.sub(r"\$L__\w+", lambda m: labels.setdefault(m.group(0), f"L{len(labels)}"), ptx)
    return "\n".join(ln for ln in ptx.splitlines() if ln.strip())


def dump(tree: Path, out: Path, kernels: list = KERNELS, seq: int = 1024) -> None:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", DUMP.format(kernels=kernels), str(tree), str(out), str(seq)], check=True,
                   env=dict(os.environ, TRITON_INTERPRET="0"))


def parse_kernels(spec: str | None) -> list:
    """``MODEL:BATCH:GEMV[:RANK:N],...`` -> the (model, batch, gemv, tp) list dump takes (single GPU, or with
    RANK:N that rank of a TP=N graph); None: KERNELS. ValueError (saying which entry and why) for another form, a
    batch below 1, a GEMV path other than fma / mma, a rank outside [0, N), or an entry given twice."""
    if not spec:
        return KERNELS
    out = []
    for k in spec.split(","):
        f = k.split(":")
        if len(f) not in (3, 5):
            raise ValueError(f"kernel {k!r}: expected MODEL:BATCH:GEMV or MODEL:BATCH:GEMV:RANK:N")
        try:
            nums = [int(x) for x in [f[1]] + f[3:]]
        except ValueError:
            raise ValueError(f"kernel {k!r}: BATCH, RANK and N must be integers") from None
        if nums[0] < 1 or f[2] not in ("fma", "mma"):
            raise ValueError(f"kernel {k!r}: BATCH must be >= 1 and GEMV fma or mma")
        tp = (nums[1], nums[2]) if len(f) == 5 else None
        if tp and not 0 <= tp[0] < tp[1]:
            raise ValueError(f"kernel {k!r}: RANK must be in [0, N)")
        if (f[0], nums[0], f[2], tp) in out:
            raise ValueError(f"kernel {k!r} is given twice")
        out.append((f[0], nums[0], f[2], tp))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("other", help="the other tree (a checkout of the commit to compare with)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", default=None, metavar="MODEL:BATCH:GEMV[:RANK:N],...",
                    help="other kernels than the seven (e.g. qwen3-8b:8:mma, which older trees do not stream; "
                         "llama-3.2-1b:8:fma:0:2: rank 0 of a TP=2 graph)")
    ap.add_argument("--seq", type=int, default=1024,
                    help="the KV cache length the kernels are compiled for (default 1024, where attention skips "
                         "dead split-KV tiles; the benchmark tables' kernels: 512)")
    ap.add_argument("--params", action="store_true",
                    help="ignore the kernel's parameter list (a new argument), compare the code")
    a = ap.parse_args()
    if a.seq < 1:
        ap.error(f"--seq must be >= 1, got {a.seq}")
    try:
        kernels = parse_kernels(a.kernels)
    except ValueError as e:
        ap.error(str(e))
    if not (Path(a.other) / "scripts" / "stream_compile_check.py").is_file():
        ap.error(f"{a.other} is not a onekernel tree (no scripts/stream_compile_check.py); give a checkout, e.g. "
                 "`git worktree add /tmp/base COMMIT`")
    out = Path(a.out or tempfile.mkdtemp(prefix="ptx_compare_"))
    trees = {"this": ROOT, "other": Path(a.other).resolve()}
    for name, tree in trees.items():
        dump(tree, out / name, kernels, a.seq)
    differ = 0
    for f in sorted((out / "this").glob("*.ptx")):
        ptx = {n: normalise((out / n / f.name).read_text(), a.params) for n in trees}
        for n, text in ptx.items():
            (out / n / f.name).with_suffix(".norm.ptx").write_text(text)
        same = ptx["this"] == ptx["other"]
        differ += not same
        print(f"{f.stem:28s} {'same' if same else 'DIFFERENT'}  "
              f"{hashlib.sha256(ptx['this'].encode()).hexdigest()[:12]} {hashlib.sha256(ptx['other'].encode()).hexdigest()[:12]}")
    n = len(list((out / "this").glob("*.ptx"))) - len(list((out / "this").glob("*.norm.ptx")))
    if n != len(kernels):
        print(f"{len(kernels)} kernels asked, {n} compared: a kernel's file is missing")
        return 1
    print(f"{n - differ} of {n} kernels have the same PTX; normalised files in {out}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
