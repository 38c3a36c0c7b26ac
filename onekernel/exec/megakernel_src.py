"""The generated part of the megakernel: ``run_task``, the dispatch over the tile-function variants.

Everything else of the kernel is plain Triton in ``exec.mk_device``; ``run_task`` is generated because each
variant calls its own op kind's prologue and body with its own constants and pointer dtypes, and Triton has
no function pointers. For variant ``i`` of kind K with constants C and pointer dtypes D:

    elif rec[R_VARIANT] == i:
        a_j = base_<D_j> + o[j] * <elements per 16 bytes>      # 16-byte alignment known to the compiler
        state = K.prologue(tile, a..., C...)
        before_body(rec, ...)                                  # prefetch, wait on the task's events, stamp
        K.body(tile, *state, a..., C...)

Pointers are rebuilt as base + (offset in 16-byte units) * (elements per 16 bytes), so the compiler knows the
16-byte alignment (the base's from argument specialization, the offset's from the constant factor, which
survives the loop-carried prefetch of the offsets where a ``tl.multiple_of`` hint would not) and emits
16-byte vector loads; a pointer cast from an int64 would carry no alignment and every load would be scalar.
"""
from __future__ import annotations

from onekernel.exec.codegen import HEADER, Variant, fn_import

BASE = {"tl.bfloat16": "base_bf16", "tl.float16": "base_f16", "tl.float32": "base_f32", "tl.int32": "base_i32",
        "tl.int64": "base_i64"}
ALIGN = {"tl.bfloat16": 8, "tl.float16": 8, "tl.float32": 4, "tl.int32": 4, "tl.int64": 2}  # 16 bytes


def _branch(idx: int, v: Variant) -> str:
    kind = v.kind
    consts = "".join(f", {val!r}" for val in v.const_values())
    args = ", ".join(f"a{j}" for j in range(len(kind.args)))
    state = ", ".join(f"s{i}" for i in range(kind.n_state))
    out = [f"    {'if' if idx == 0 else 'elif'} rec[R_VARIANT] == {idx}:  # {v.name}"]
    out += [f"        a{j} = {BASE[dt]} + o[{j}] * {ALIGN[dt]}" for j, dt in enumerate(v.dtypes)]
    out += [f"        {state} = P{idx}(tile, {args}{consts})",
            "        before_body(rec, epoch, wl, ev_cnt, err, prof, SPIN_LIMIT, rwl, peer_off, PREFETCH, PROFILE, "
            "ACQ_LOAD, TP)",
            f"        B{idx}(tile, {state}, {args}{consts})"]
    return "\n".join(out)


def run_task_source(variants: list[Variant]) -> str:
    """Python source of ``run_task`` for ``variants`` (index = the variant id stored in the queue records)."""
    imports = []
    for i, v in enumerate(variants):
        imports.append(fn_import(v.kind.prologue, f"P{i}"))
        imports.append(fn_import(v.kind.body, f"B{i}"))
    branches = "\n".join(_branch(i, v) for i, v in enumerate(variants))
    return f"""{HEADER}
from onekernel.exec.mk_device import R_TILE, R_VARIANT, before_body
{chr(10).join(imports)}


@triton.jit
def run_task(rec, o, base_bf16, base_f16, base_f32, base_i32, base_i64, epoch, wl, ev_cnt, err, prof, SPIN_LIMIT,
             rwl, peer_off, PROFILE: tl.constexpr, PREFETCH: tl.constexpr, ACQ_LOAD: tl.constexpr, TP: tl.constexpr):
    tile = rec[R_TILE]
{branches}
"""
