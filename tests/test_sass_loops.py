"""scripts/sass_loops.py: where a kernel's register spills sit. On a hand-written SASS listing (loops from backward
branches, the innermost loop of each spill, the kernel's own local arrays below the depot bound not counted), and on
a Triton kernel compiled for sm_90a on this CPU: a tensor-core loop squeezed into 40 registers by a ``.maxnreg``
directive spills inside its HMMA loop, the same PTX without the directive does not."""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sass_loops", ROOT / "scripts/sass_loops.py")
sl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sl)

# setup spills (outside loops: a 4-byte and a 16-byte store); outer loop 0x40-0x100 with a spill store and a predicated
# reload; inner HMMA loop 0x60-0xa0 with a spill load (LDL.LU); a local-array access below the 16-byte depot and one
# at [R1] itself (not spills); a divergent branch on a uniform register back to 0x40 (a third loop, 0x40-0x110)
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1+0x10], R4 ;
        /*0020*/                   STL.128 [R1+0x20], R8 ;
        /*0040*/                   IMAD R2, R3, R4, RZ ;
        /*0050*/                   STL.64 [R1+0x18], R6 ;
        /*0060*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0070*/                   LDL.LU R5, [R1+0x10] ;
        /*0080*/                   STL [R1+0x4], R9 ;
        /*0090*/                   ISETP.GE.AND P0, PT, R2, R5, PT ;
        /*00a0*/               @!P0 BRA 0x60 ;
        /*00b0*/               @P1 LDL R7, [R1+0x18] ;
        /*00c0*/                   LDL R9, [R1] ;
        /*00d0*/                   FFMA R2, R3, R4, R5 ;
        /*0100*/                   @P0 BRA P1, 0x40 ;
        /*0110*/                   BRA.DIV UR4, 0x40 ;
        /*0120*/                   EXIT ;
"""
PTX = ".visible .entry k(\n\t.local .align 4 .b8 \t__local_depot0[16];\n"


def test_loops_innermost_and_depot_bound():
    ins = sl.instructions(SASS)
    assert len(ins) == 16 and ins[5] == (0x60, "HMMA.16816.F32.BF16 R8, R12, R16, R8")
    assert sl.loops(ins) == [(0x40, 0x100), (0x40, 0x110), (0x60, 0xA0)]
    assert sl.depot_bytes(PTX) == 16 and sl.entries(PTX) == ["k"]
    rep = sl.spill_report(PTX, SASS)
    # [R1+0x4] and [R1] are the depot's, not spills
    assert (rep["spill_ld"], rep["spill_st"], rep["outside"]) == (2, 3, 2)
    assert [(r["lo"], r["hi"], r["spill_ld"], r["spill_st"], r["tc"]) for r in rep["loops"]] == \
        [(0x40, 0x100, 1, 1, 1), (0x60, 0xA0, 1, 0, 1)]
    assert rep["hot_loop_spills"] == 1
    # without a depot every [R1...] access is a spill; a loop without tensor-core instructions is never a hot one;
    # wgmma's HGMMA counts as one
    bare = sl.spill_report(".visible .entry k(\n", SASS)
    assert (bare["spill_ld"], bare["spill_st"], bare["hot_loop_spills"]) == (3, 4, 2)
    assert sl.spill_report(PTX, SASS.replace("HMMA.16816.F32.BF16", "FFMA"))["hot_loop_spills"] == 0
    assert sl.spill_report(PTX, SASS.replace("HMMA.16816.F32.BF16", "HGMMA.64x64x16.F32.BF16"))["hot_loop_spills"] == 1


def test_one_kernel_per_ptx():
    """The SASS of several kernels would share addresses (each function's start at 0): refused, as is PTX with none."""
    for ptx, found in ((PTX + ".visible .entry k2(\n", "found 2: k, k2"), ("\t.version 8.7\n", "found 0")):
        with pytest.raises(ValueError, match=found):
            sl.spill_report(ptx, SASS)


def test_opcode_reads_past_the_predicate():
    assert [sl.opcode(t) for t in ("@!P0 BRA 0x60", "LDL.64 R2, [R1+0x8]", "@P1 HMMA.16816.F32 R0, R2, R4, R0")] \
        == ["BRA", "LDL", "HMMA"]


DOT_LOOP = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def dot_loop(x, w, y, n, B: tl.constexpr):
    r = tl.arange(0, B)
    acc = tl.zeros((B, B), tl.float32)
    for i in range(n):
        a = tl.load(x + i * B * B + r[:, None] * B + r[None, :])
        b = tl.load(w + i * B * B + r[:, None] * B + r[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(y + r[:, None] * B + r[None, :], acc)


src = ASTSource(dot_loop, {"x": "*bf16", "w": "*bf16", "y": "*fp32", "n": "i32", "B": "constexpr"}, {(4,): 32},
                {(i,): [["tt.divisibility", 16]] for i in range(3)})
open(sys.argv[1], "w").write(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"])
"""


def _dot_loop_ptx(tmp_path) -> str:
    """PTX of a Triton kernel summing x[i] @ w[i] over a loop, compiled for sm_90a in a subprocess (the suite runs
    under the interpreter): one warp, one [32, 32] fp32 accumulator, mma.sync (not wgmma) in the loop."""
    (tmp_path / "dot_loop.py").write_text(DOT_LOOP)
    out = subprocess.run([sys.executable, str(tmp_path / "dot_loop.py"), str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return (tmp_path / "k.ptx").read_text()


def test_a_tensor_core_loop_squeezed_into_40_registers_spills_inside_its_hmma_loop(tmp_path):
    ptx = _dot_loop_ptx(tmp_path)
    assert "mma.sync" in ptx
    free = sl.spill_report(ptx)
    assert free["spill_ld"] == free["spill_st"] == free["hot_loop_spills"] == 0, free
    entry = re.search(r"\.entry \w+\([^)]*\)\s*", ptx)
    squeezed = ptx[:entry.end()] + ".maxnreg 40\n" + ptx[entry.end():]
    with tempfile.TemporaryDirectory() as d:  # ptxas's own figure agrees that the squeezed kernel spills
        (Path(d) / "k.ptx").write_text(squeezed)
        v = subprocess.run([str(sl.BIN / "ptxas"), "-v", "--gpu-name", "sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.o"],
                           capture_output=True, text=True).stderr
    assert int(re.search(r"(\d+) bytes spill stores", v).group(1)) > 0, v
    rep = sl.spill_report(squeezed)
    assert rep["hot_loop_spills"] > 0 and rep["spill_ld"] > 0 and rep["spill_st"] > 0, rep
    assert any(r["tc"] > 0 and r["spill_ld"] > 0 for r in rep["loops"]), rep


def test_bad_files_get_one_line_and_status_2(tmp_path, capsys):
    """PTX that does not assemble (ptxas's message on one line, naming the user's file), a missing file, a file that
    is not text, PTX of two kernels; --help prints the module doc."""
    bad = tmp_path / "bad.ptx"
    bad.write_text(".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k() { bogus; }\n")
    binary = tmp_path / "binary.ptx"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 64)
    two = tmp_path / "two.ptx"
    two.write_text(PTX + ".visible .entry k2(\n")
    for path, why in ((bad, f"ptxas rejected {bad}"), (tmp_path / "missing.ptx", "cannot read a PTX file"),
                      (binary, "cannot read a PTX file"), (two, "found 2: k, k2")):
        assert sl.main([str(path)]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err
    assert sl.main(["--help"]) == 0 and "Where a compiled kernel spills" in capsys.readouterr().out
