"""scripts/ptx_compare.normalise: PTX that differs only in register numbers, label names, line records and
debug-scope labels compares equal; one changed instruction or operand order does not."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("ptx_compare", Path(__file__).resolve().parents[1] / "scripts/ptx_compare.py")
pc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pc)

A = """\t.reg .b32 \t%r<12>;
\t.loc 1 10 3
$L__tmp4:
\tld.global.b32 %r7, [%rd3];
\tadd.s32 %r8, %r7, 1;
$L__BB0_2:
\tsetp.lt.s32 %p1, %r8, %r9;
\t@%p1 bra $L__BB0_2;
"""
B = """\t.reg .b32 \t%r<40>;
\t.loc 1 99 7

\tld.global.b32 %r21, [%rd5];
\tadd.s32 %r22, %r21, 1;
$L__BB0_9:
$L__tmp17:
\tsetp.lt.s32 %p3, %r22, %r23;
\t@%p3 bra $L__BB0_9;
"""


def test_renamed_registers_and_labels_compare_equal():
    assert pc.normalise(A) == pc.normalise(B)


def test_a_changed_instruction_or_operand_order_compares_different():
    assert pc.normalise(A) != pc.normalise(B.replace("add.s32 %r22, %r21, 1", "add.s32 %r22, %r21, 2"))
    assert pc.normalise(A) != pc.normalise(B.replace("%r22, %r23", "%r23, %r22"))
    assert pc.normalise(A) != pc.normalise(B.replace("ld.global.b32", "ld.global.cg.b32"))


P1 = """.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
\t.param .u32 k_param_1
)
{
\tld.param.b64 \t%rd1, [k_param_0];
\tld.param.b32 \t%r1, [k_param_1];
\tld.global.b32 %r2, [%rd1];
}
"""
# the same code with a new first argument: every parameter index moves up by one
P2 = P1.replace("k_param_1", "k_param_2").replace("k_param_0", "k_param_1").replace(
    "\t.param .u64 .ptr .global .align 1 k_param_1,", "\t.param .u64 .ptr .global .align 1 k_param_0,\n"
    "\t.param .u64 .ptr .global .align 1 k_param_1,")


def test_params_ignores_a_new_argument_but_not_a_changed_instruction():
    assert P1 != P2 and pc.normalise(P1) != pc.normalise(P2)
    assert pc.normalise(P1, params=True) == pc.normalise(P2, params=True)
    assert pc.normalise(P1, params=True) != pc.normalise(P2.replace("ld.global.b32", "ld.global.cg.b32"), params=True)


def test_kernels_option_names_other_single_gpu_kernels():
    assert pc.parse_kernels(None) == pc.KERNELS
    assert pc.parse_kernels("qwen3-8b:8:mma,qwen3-0.6b:1:mma") == [("qwen3-8b", 8, "mma", None),
                                                                  ("qwen3-0.6b", 1, "mma", None)]
