"""Source generation of the persistent megakernel.

The kernel is one program per worker CTA. Worker ``w`` runs queue positions ``qoff[w]:qoff[w+1]`` in order.
Each position has one record ``qrec[qi]`` (int64 x REC: task id, variant, tile, op index, signal event,
prefetch address and bytes, wait-list range, first wait's event and expected count), so a task needs no
dependent table lookups: the record of position qi+1 is loaded while task qi runs (software pipelining),
and the first wait is inline (most tasks wait on exactly one event); the next task's pointer offsets
(``argtab[op]``) are loaded after the current body. Per task:

    prologue(tile, ...)                     # weights only: runs before any waiting
    [prefetch the next task's weights into L2]
    for each event e the task waits on:     # monotonic counters: count[e] >= expected[e] * epoch
        spin with ld.acquire.gpu loads (interpreter: volatile loads + one acquire RMW), bounded by
        SPIN_LIMIT; on timeout record (task, event, seen, want)
    CTA barrier
    body(tile, ...)                         # reads activations with .cg loads
    CTA barrier; one release atomic add on the task's event (gpu scope)

The epoch is read once from ``epoch_ptr`` at entry; the last worker to finish increments it, so CUDA-graph
replays and back-to-back launches need no reset of any counter (DESIGN.md, "Tasks and dependencies").
Pointers come from ``argtab[op, slot]`` (offsets in 16-byte units from one base pointer per element type).
"""
from __future__ import annotations

from onekernel.exec.codegen import HEADER, Variant, fn_import

RUNTIME = '''

@triton.jit
def _ld_acquire(p):
    """``ld.acquire.gpu`` of one int32: later loads of this thread are ordered after it (PTX memory model)."""
    return tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _spin(t, ev, want, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD: tl.constexpr):
    """Bounded spin until ev_cnt[ev] >= want; on timeout record the first failure in err[0:5].

    ACQ_LOAD (GPU): every poll is an ``ld.acquire.gpu`` (one L2 round trip, no read-modify-write competing
    with the producers' atomics); the CTA barrier after the waits extends the ordering to the whole CTA.
    Else (interpreter): volatile polls, then one acquire read-modify-write."""
    if ACQ_LOAD:
        seen = _ld_acquire(ev_cnt + ev)
    else:
        seen = tl.load(ev_cnt + ev, volatile=True)
    n = 0
    bad = tl.load(err, volatile=True)
    while (seen < want) & (n < SPIN_LIMIT) & (bad == 0):
        if ACQ_LOAD:
            seen = _ld_acquire(ev_cnt + ev)
        else:
            seen = tl.load(ev_cnt + ev, volatile=True)
        bad = tl.load(err, volatile=True)
        n += 1
    if not ACQ_LOAD:
        seen = tl.atomic_add(ev_cnt + ev, 0, sem="acquire", scope="gpu")
    if (seen < want) & (bad == 0):
        if tl.atomic_cas(err, 0, 1) == 0:
            tl.store(err + 1, t)
            tl.store(err + 2, ev)
            tl.store(err + 3, seen)
            tl.store(err + 4, want)


@triton.jit
def _wait(t, epoch, ev0, ex0, wb, we, wl, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD: tl.constexpr):
    """Spin on the task's events: the first (ev0, ex0) from the record, the rest from ``wl[wb+1:we]``."""
    if we > wb:
        _spin(t, ev0, ex0 * epoch, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD)
        for i in range(wb + 1, we):
            _spin(t, tl.load(wl + 2 * i), tl.load(wl + 2 * i + 1) * epoch, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD)
    tl.debug_barrier()


@triton.jit
def _prefetch_l2(addr, nbytes):
    """Issue prefetch.global.L2 for every 128-byte line of [addr, addr + nbytes)."""
    offs = tl.arange(0, 1024) * 128
    base = addr.to(tl.pointer_type(tl.int8))
    for start in range(0, nbytes, 1024 * 128):
        p = base + start + offs
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [p], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def _stamp(prof, t, k, value):
    tl.store(prof + t * 4 + k, value)
'''


# One kernel argument per element type: every buffer pointer is rebuilt as base + (offset in 16-byte units)
# * (elements per 16 bytes), so the compiler knows the 16-byte alignment (the base's from argument
# specialization, the offset's from the constant factor, which survives the loop-carried prefetch of the
# offsets where a ``tl.multiple_of`` hint would not) and emits 16-byte vector loads; a pointer cast from an
# int64 would carry no alignment and every load would be scalar.
BASE = {"tl.bfloat16": "base_bf16", "tl.float16": "base_f16", "tl.float32": "base_f32", "tl.int32": "base_i32",
        "tl.int64": "base_i64"}
ALIGN = {"tl.bfloat16": 8, "tl.float16": 8, "tl.float32": 4, "tl.int32": 4, "tl.int64": 2}  # 16 bytes


# Fields of one queue-position record (int64 each), in order; REC = the row stride (one 128-byte line).
REC_FIELDS = ("t", "var", "tile", "op", "sig", "pf_a", "pf_n", "wb", "we", "ev0", "ex0")
REC = 16
_NARROW = {"var", "tile", "op", "sig", "ev0", "ex0", "t"}  # int32 in the kernel (tile math stays 32-bit)


def _rec_loads(pos: str, prefix: str, indent: int = 4) -> str:
    """Source lines loading the record at queue position ``pos`` into ``{prefix}{field}`` variables."""
    pad = " " * indent
    lines = [f"{pad}r = qrec + ({pos}) * {REC}"]
    for j, f in enumerate(REC_FIELDS):
        cast = ".to(tl.int32)" if f in _NARROW else ""
        lines.append(f"{pad}{prefix}{f} = tl.load(r + {j}){cast}")
    return "\n".join(lines)


def _arg_loads(maxa: int, indent: int) -> str:
    """Source lines loading the next task's pointer offsets ``argtab[nop, :]`` into ``no{j}``: issued after
    the current task's body (its record arrived long before), consumed by the next task without a wait."""
    pad = " " * indent
    return "\n".join(f"{pad}no{j} = tl.load(argtab + nop * {maxa} + {j})" for j in range(maxa))


def _branch(idx: int, v: Variant, maxa: int) -> str:
    kind = v.okind
    consts = "".join(f", {val!r}" for val in v.const_values())
    args = ", ".join(f"a{j}" for j in range(len(kind.args)))
    state = ", ".join(f"s{i}" for i in range(kind.n_state))
    out = [f"        {'if' if idx == 0 else 'elif'} var == {idx}:  # {v.kind}"]
    for j, dt in enumerate(v.dtypes):
        out.append(f"            a{j} = {BASE[dt]} + o{j} * {ALIGN[dt]}")
    out += [
        f"            {state} = P{idx}(tile, {args}{consts})",
        "            if PREFETCH:",
        "                if pf_n > 0:",
        "                    _prefetch_l2(pf_a, pf_n)",
        "            _wait(t, epoch, ev0, ex0, wb, we, wl, ev_cnt, err, SPIN_LIMIT, ACQ_LOAD)",
        "            if PROFILE:",
        "                _stamp(prof, t, 1, globaltimer())",
        f"            B{idx}(tile, {state}, {args}{consts})",
    ]
    return "\n".join(out)


def megakernel_source(variants: list[Variant], maxa: int) -> str:
    """Python source of the megakernel for ``variants`` (index = the variant id stored in the task table)."""
    imports = []
    for i, v in enumerate(variants):
        imports.append(fn_import(v.okind.prologue, f"P{i}"))
        imports.append(fn_import(v.okind.body, f"B{i}"))
    branches = "\n".join(_branch(i, v, maxa) for i, v in enumerate(variants))
    return f"""{HEADER}
{chr(10).join(imports)}
{RUNTIME}

@triton.jit
def megakernel(qrec, qoff, wl, argtab, ev_cnt, epoch_ptr, done_ptr, err, prof,
               base_bf16, base_f16, base_f32, base_i32, base_i64, n_workers, SPIN_LIMIT,
               PROFILE: tl.constexpr, PREFETCH: tl.constexpr, ACQ_LOAD: tl.constexpr):
    wid = tl.program_id(0)
    epoch = tl.load(epoch_ptr, volatile=True)
    q0 = tl.load(qoff + wid)
    q1 = tl.load(qoff + wid + 1)
{_rec_loads("q0", "n")}
{_arg_loads(maxa, 4)}
    for qi in range(q0, q1):
        t, var, tile, op, sig, pf_a, pf_n, wb, we, ev0, ex0 = {", ".join("n" + f for f in REC_FIELDS)}
        {", ".join(f"o{j}" for j in range(maxa))}, = {", ".join(f"no{j}" for j in range(maxa))},
{_rec_loads("qi + 1", "n", indent=8)}
        if PROFILE:
            _stamp(prof, t, 0, globaltimer())
{branches}
{_arg_loads(maxa, 8)}
        tl.debug_barrier()
        if sig >= 0:
            tl.atomic_add(ev_cnt + sig, 1, sem="release", scope="gpu")
        if PROFILE:
            _stamp(prof, t, 2, globaltimer())
            _stamp(prof, t, 3, smid().to(tl.int64))
    done = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if done == n_workers * epoch - 1:
        tl.atomic_add(epoch_ptr, 1, sem="release", scope="gpu")
"""
