"""Where a compiled kernel spills: its SASS loops, each with its spill loads / stores and its instruction mix.

``ptxas -v`` gives one figure per kernel ("108 bytes spill stores"); whether that costs time depends on where the
spill instructions sit. A spill in the setup of a persistent kernel runs once; one in the weight-streaming GEMV loop
runs for every chunk. This tool assembles a PTX file of one kernel (one ``.entry``, as Triton writes them) for sm_90a
with Triton's ptxas, disassembles it with Triton's cuobjdump (no GPU needed) and reports, for every loop (a backward
branch and the instructions it spans) that is the innermost loop of a spill, its address range, its length, its spill
loads and stores, its tensor-core instructions (TC_OPS: HMMA for mma.sync, HGMMA for wgmma) and its most frequent
opcodes, so the loop can be told apart (GEMV: HMMA and LDSM; CUDA-core attention: FFMA, SHFL, MUFU exponentials):

    python scripts/sass_loops.py /tmp/onekernel_ptx/llama-3.1-70b_B1_stream_tp8_mma.ptx

A spill is a local-memory access at a constant offset of the stack pointer R1 at or past the PTX's
``__local_depot`` (the kernel's own local arrays, e.g. libdevice sin/cos's range-reduction table, sit below it and
are not spills). Counts are of instructions in the code, not of executions. Limits: loops are found from backward
branches only (code reached by CALL, or placed after the kernel's EXIT, counts as outside every loop), and the
"innermost loops with tensor-core instructions" are the smallest loops holding one: where those instructions sit
in a sub-loop of a chunk loop, spills elsewhere in the chunk loop are not counted as hot. Exit status 2 (one line
on stderr) when the file is missing, unreadable, not one kernel's PTX, or ptxas rejects it.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton

BIN = Path(triton.__file__).parent / "backends/nvidia/bin"
TC_OPS = ("HMMA", "HGMMA")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;")
# BRA [.modifiers] [predicate or uniform register operand,] 0xTARGET
_BRANCH = re.compile(r"\bBRA(?:\.\w+)*(?:\s+!?U?(?:P|R)\w+\s*,)?\s+0x([0-9a-f]+)")
_LOCAL = re.compile(r"\b(LDL|STL)(?:\.[\w.]+)?\s+(?:\S+,\s*)?\[R1(?:\+0x([0-9a-f]+))?\]")


def _run(args: list, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True)
    except OSError as e:
        raise RuntimeError(f"cannot run {what} ({e}); it ships with the triton wheel in {BIN}") from None


def assemble(ptx: str, name: str = "the PTX") -> tuple[str, str]:
    """(sm_90a SASS text, ptxas's ``-v`` report: registers, spill bytes) of PTX source ``ptx``: Triton's ptxas once,
    then cuobjdump -sass. RuntimeError naming ``name`` with ptxas's message (on one line) when it does not assemble,
    or when a tool cannot run."""
    with tempfile.TemporaryDirectory() as d:
        src, cubin = Path(d) / "k.ptx", Path(d) / "k.cubin"
        src.write_text(ptx)
        r = _run([BIN / "ptxas", "-v", "--gpu-name", "sm_90a", src, "-o", cubin], "ptxas")
        if r.returncode:
            msg = " ".join(r.stderr.replace(str(src), name).split())
            raise RuntimeError(f"ptxas rejected {name}: {msg}")
        verbose = r.stderr
        r = _run([BIN / "cuobjdump", "-sass", cubin], "cuobjdump")
        if r.returncode:
            raise RuntimeError(f"cuobjdump failed on {name}'s cubin: {' '.join(r.stderr.split())}")
        return r.stdout, verbose


def sass_of(ptx: str, name: str = "the PTX") -> str:
    """The sm_90a SASS text of PTX source ``ptx`` (``assemble``; the same errors)."""
    return assemble(ptx, name)[0]


def entries(ptx: str) -> list[str]:
    """The kernel (``.entry``) names of PTX source ``ptx``."""
    return re.findall(r"\.entry\s+([\w$]+)\s*\(", ptx)


def depot_bytes(ptx: str) -> int:
    """Bytes of the kernel's own local arrays (PTX ``.local ... __local_depotN[bytes]``; 0 without one)."""
    return sum(int(n) for n in re.findall(r"__local_depot\d+\[(\d+)\]", ptx))


def instructions(sass: str) -> list[tuple[int, str]]:
    """(byte address, instruction text with its predicate, without the trailing ';') of every SASS instruction."""
    return [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.match, sass.splitlines()) if m]


def opcode(text: str) -> str:
    """The opcode family of an instruction (``@P0 LDL.64 R2, [R1+0x8]`` -> ``LDL``)."""
    words = text.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """Every loop as (first address, address of the backward branch), one per distinct range."""
    out = set()
    for a, t in ins:
        m = _BRANCH.search(t)
        if m and int(m.group(1), 16) <= a:
            out.add((int(m.group(1), 16), a))
    return sorted(out)


def spill_report(ptx: str, sass: str | None = None) -> dict:
    """Spill instructions of one kernel's PTX ``ptx`` (its SASS ``sass``, by default assembled here) by innermost
    enclosing loop.

    Returns {"spill_ld": int, "spill_st": int, "outside": int (spills in no loop), "loops": [{"lo", "hi" (byte
    addresses), "instructions", "spill_ld", "spill_st", "tc" (tensor-core instructions), "top" ([(opcode, count)]
    x 6)}], "hot_loop_spills": int}: "loops" are the loops that are the innermost loop of at least one spill, in
    address order; "hot_loop_spills" counts the spills inside the innermost loops that hold tensor-core instructions
    (the tensor-core GEMV's chunk loop and the tensor-core attention's block loop; 0 on a CUDA-core kernel).
    ValueError when ``ptx`` does not hold exactly one kernel (the SASS of several would share addresses)."""
    names = entries(ptx)
    if len(names) != 1:
        raise ValueError(f"expected the PTX of one kernel (one .entry), found {len(names)}"
                         + (f": {', '.join(names)}" if names else ""))
    sass = sass if sass is not None else sass_of(ptx)
    ins, floor = instructions(sass), depot_bytes(ptx)
    spills = {}
    for a, t in ins:
        m = _LOCAL.search(t)
        if m and int(m.group(2) or "0", 16) >= floor:
            spills[a] = m.group(1)
    ranges = loops(ins)
    by_loop: dict = {}
    outside = 0
    for a, kind in spills.items():
        inner = min((r for r in ranges if r[0] <= a <= r[1]), key=lambda r: r[1] - r[0], default=None)
        if inner is None:
            outside += 1
        else:
            by_loop.setdefault(inner, Counter())[kind] += 1
    rows = []
    for (lo, hi), c in sorted(by_loop.items()):
        body = [t for a, t in ins if lo <= a <= hi]
        ops = Counter(opcode(t) for t in body)
        rows.append({"lo": lo, "hi": hi, "instructions": len(body), "spill_ld": c["LDL"], "spill_st": c["STL"],
                     "tc": sum(ops[o] for o in TC_OPS), "top": ops.most_common(6)})
    kinds = Counter(spills.values())
    tc = [a for a, t in ins if opcode(t) in TC_OPS]
    hot = [r for r in ranges if any(r[0] <= a <= r[1] for a in tc)]  # loops holding tensor-core instructions ...
    hot = [r for r in hot if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in hot)]  # ... the innermost
    return {"spill_ld": kinds["LDL"], "spill_st": kinds["STL"], "outside": outside, "loops": rows,
            "hot_loop_spills": sum(any(lo <= a <= hi for lo, hi in hot) for a in spills)}


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    if len(argv) != 1:
        print("sass_loops: usage: python scripts/sass_loops.py KERNEL.ptx", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        ptx = path.read_text()
        rep = spill_report(ptx, sass_of(ptx, str(path)) if len(entries(ptx)) == 1 else None)
    except (OSError, UnicodeDecodeError) as e:
        print(f"sass_loops: cannot read a PTX file at {path} ({e.__class__.__name__}: {e}); compile_check.py and its "
              "kin write them to $PTXDIR", file=sys.stderr)
        return 2
    except (RuntimeError, ValueError) as e:
        print(f"sass_loops: {path}: {e}", file=sys.stderr)
        return 2
    print(f"{path.name}: {rep['spill_ld']} spill loads, {rep['spill_st']} spill stores; {rep['outside']} outside "
          f"every loop, {rep['hot_loop_spills']} in the innermost loops with tensor-core instructions")
    for r in rep["loops"]:
        mix = ", ".join(f"{op} {n}" for op, n in r["top"])
        print(f"  loop {r['lo']:#07x}-{r['hi']:#07x}: {r['instructions']:5d} instructions, {r['spill_ld']} spill "
              f"loads, {r['spill_st']} spill stores, tensor-core {r['tc']}; {mix}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
