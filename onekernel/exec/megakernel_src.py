"""Source generation of the persistent megakernel.

The kernel is one program per worker CTA. Worker ``w`` runs the tasks ``queue[qoff[w]:qoff[w+1]]`` in order.
For each task (a row of ``ttab``: variant, tile, op index, signal event, prefetch bytes):

    prologue(tile, ...)                     # weights only: runs before any waiting
    [prefetch the next task's weights into L2]
    for each event e the task waits on:     # monotonic counters: count[e] >= expected[e] * epoch
        spin with acquire loads, bounded by SPIN_LIMIT; on timeout record (task, event, seen, want)
    CTA barrier
    body(tile, ...)                         # reads activations with .cg loads
    CTA barrier; one release atomic add on the task's event (gpu scope)

The epoch is read once from ``epoch_ptr`` at entry; the last worker to finish increments it, so CUDA-graph
replays and back-to-back launches need no reset of any counter (DESIGN.md, "Tasks and dependencies").
Pointers come from ``argtab[op, slot]`` (int64 addresses), cast to the variant's element types.
"""
from __future__ import annotations

from onekernel.exec.codegen import HEADER, Variant, fn_import

RUNTIME = '''

@triton.jit
def _spin(t, ev, want, ev_cnt, err, SPIN_LIMIT):
    """Bounded spin until ev_cnt[ev] >= want; on timeout record the first failure in err[0:5].

    Spins with volatile loads (served by L2, no read-modify-write traffic competing with the producers'
    atomics), then one acquire read-modify-write orders this CTA's later loads after the producers' stores."""
    seen = tl.load(ev_cnt + ev, volatile=True)
    n = 0
    bad = tl.load(err, volatile=True)
    while (seen < want) & (n < SPIN_LIMIT) & (bad == 0):
        seen = tl.load(ev_cnt + ev, volatile=True)
        bad = tl.load(err, volatile=True)
        n += 1
    seen = tl.atomic_add(ev_cnt + ev, 0, sem="acquire", scope="gpu")
    if (seen < want) & (bad == 0):
        if tl.atomic_cas(err, 0, 1) == 0:
            tl.store(err + 1, t)
            tl.store(err + 2, ev)
            tl.store(err + 3, seen)
            tl.store(err + 4, want)


@triton.jit
def _wait(t, epoch, wptr, wids, ev_cnt, ev_exp, err, SPIN_LIMIT):
    w0 = tl.load(wptr + t)
    w1 = tl.load(wptr + t + 1)
    for i in range(w0, w1):
        ev = tl.load(wids + i)
        _spin(t, ev, tl.load(ev_exp + ev) * epoch, ev_cnt, err, SPIN_LIMIT)
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


# One kernel argument per element type: every buffer pointer is rebuilt as base + element offset, so the
# compiler keeps the base's 16-byte alignment (known from argument specialization) and emits 16-byte vector
# loads; a pointer cast from an int64 would carry no alignment and every load would be scalar.
BASE = {"tl.bfloat16": "base_bf16", "tl.float16": "base_f16", "tl.float32": "base_f32", "tl.int32": "base_i32",
        "tl.int64": "base_i64"}
ALIGN = {"tl.bfloat16": 8, "tl.float16": 8, "tl.float32": 4, "tl.int32": 4, "tl.int64": 2}  # 16 bytes


def _branch(idx: int, v: Variant, maxa: int) -> str:
    kind = v.okind
    consts = "".join(f", {val!r}" for val in v.const_values())
    args = ", ".join(f"a{j}" for j in range(len(kind.args)))
    state = ", ".join(f"s{i}" for i in range(kind.n_state))
    out = [f"        {'if' if idx == 0 else 'elif'} var == {idx}:  # {v.kind}"]
    for j, dt in enumerate(v.dtypes):
        out.append(f"            a{j} = {BASE[dt]} + tl.multiple_of(tl.load(argtab + op * {maxa} + {j}), {ALIGN[dt]})")
    out += [
        f"            {state} = P{idx}(tile, {args}{consts})",
        "            if PREFETCH:",
        "                if pf_n > 0:",
        "                    _prefetch_l2(pf_a, pf_n)",
        "            _wait(t, epoch, wptr, wids, ev_cnt, ev_exp, err, SPIN_LIMIT)",
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
def megakernel(queue, qoff, ttab, argtab, wptr, wids, ev_cnt, ev_exp, epoch_ptr, done_ptr, err, prof,
               pf_tab, base_bf16, base_f16, base_f32, base_i32, base_i64, n_workers, SPIN_LIMIT,
               PROFILE: tl.constexpr, PREFETCH: tl.constexpr):
    wid = tl.program_id(0)
    epoch = tl.load(epoch_ptr, volatile=True)
    q0 = tl.load(qoff + wid)
    q1 = tl.load(qoff + wid + 1)
    for qi in range(q0, q1):
        t = tl.load(queue + qi)
        var = tl.load(ttab + t * 4)
        tile = tl.load(ttab + t * 4 + 1)
        op = tl.load(ttab + t * 4 + 2)
        sig = tl.load(ttab + t * 4 + 3)
        pf_a = tl.load(pf_tab + qi * 2)
        pf_n = tl.load(pf_tab + qi * 2 + 1)
        if PROFILE:
            _stamp(prof, t, 0, globaltimer())
{branches}
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
