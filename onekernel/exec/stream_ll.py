"""Flags in the data (NCCL's LL protocol) for the gate_up -> down hand-over of the streaming megakernel's
tensor-core path: the gate_up epilogue writes h as 8-byte words (two bf16 / fp16 values in the low 4 bytes, the
step's epoch in the high 4, one store, no fence), and a down task reads them without waiting on gate_up's event
counter: it loads each activation tile once and re-polls (``ld.relaxed.gpu``) only the words whose flag is not
yet the step's, so the poll and the activation load are one L2 round trip and a tile is staged as soon as its
own producers have written it (NCCL, src/device/prims_ll.h: ``storeLL`` / ``readLL``).

Host side (``ll_plan``): which (gate_up, down) op pairs hand over this way, their LL buffers (int32 [B, N]: N/2
words of [payload, flag] per row, ``stream.ll.<gate_up op>``), and the dependencies rewired (``ll_rewire``): a
down task depends on what its gate_up producers depended on (the o_proj tasks that wrote the residual it adds)
instead of on them. Device side: the word format (``pack_pairs``), the consumer's tile loads (``load_ll``) and
the bounded re-poll that stages them (``store_ll``). The switch: ``STREAM_LL=1`` (off by default until measured).
"""
from __future__ import annotations

import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.exec import stream_base as sd
from onekernel.exec.stream_base import mma_act_bases, view

LL = os.environ.get("STREAM_LL", "0") == "1"
# measurement switch: ns of nanosleep between re-polls; the kernel's constexpr LL is 1 + it (0: off)
SLEEP_NS = int(os.environ.get("STREAM_LL_SLEEP", "0"))
ERR_LL = gl.constexpr(7)  # error code of an activation-flag wait that gave up (stream_base.ERRORS)


# ----------------------------------------------------------------------------------------------- host
def ll_pairs(g, kinds: list[int]) -> list[tuple[int, int]]:
    """(gate_up op, down op) index pairs of graph ``g``: a K_RESID op whose activation ``x`` is the ``out`` of the
    nearest earlier K_GATEUP op, with no op between them writing that buffer."""
    pairs = []
    for c in g.ops:
        if kinds[c.index] != sd.K_RESID.value:
            continue
        for p in reversed(g.ops[:c.index]):
            if p.args.get("out") == c.args["x"] or any(r.buffer == c.args["x"] for t in p.task_ids
                                                        for r in g.tasks[t].writes):
                if kinds[p.index] == sd.K_GATEUP.value and p.args["out"] == c.args["x"]:
                    pairs.append((p.index, c.index))
                break
    return pairs


def ll_plan(g, kinds: list[int], B: int, enabled: bool) -> list[tuple[int, int]]:
    """Where ``enabled``: rename each pair's h buffer to its own LL buffer (int32 [B, N], added to ``g``; the task
    regions keep the step's buffer, so the dependencies are derived as without LL) and return the pairs."""
    if not enabled:
        return []
    pairs = ll_pairs(g, kinds)
    for p, c in pairs:
        prod, cons = g.ops[p], g.ops[c]
        n = g.buffers[prod.args["out"]].shape[-1]
        if n % 8:
            continue
        buf = g.add_buffer(f"stream.ll.{prod.name}", (B, n), torch.int32, "scratch")
        prod.args["out"] = buf.name
        cons.args["x"] = buf.name
    return [(p, c) for p, c in pairs if g.ops[c].args["x"].startswith("stream.ll.")]


def ll_rewire(g, deps: list[list[int]], pairs: list[tuple[int, int]]) -> list[list[int]]:
    """Dependencies with each LL consumer task's dependencies on its producer op's tasks replaced by those tasks'
    own dependencies (the flags in the data order the rest; module doc), transitively reduced again."""
    from onekernel.graph.deps import transitive_reduction

    prod_of = {c: p for p, c in pairs}
    out = [list(d) for d in deps]
    for t, task in enumerate(g.tasks):
        p = prod_of.get(task.op)
        if p is None:
            continue
        keep = {d for d in deps[t] if g.tasks[d].op != p}
        for d in deps[t]:
            if g.tasks[d].op == p:
                keep |= set(deps[d])
        out[t] = sorted(keep)
    return transitive_reduction(out)


def is_ll_input(op) -> bool:
    """Whether op's activation ``x`` is an LL buffer (its record's F_XLL)."""
    return str(op.args.get("x", "")).startswith("stream.ll.")


# ----------------------------------------------------------------------------------------------- device
@gluon.constexpr_function
def ll_layout(CK):
    """[4 warp slices, 4 batch rows, CK/8 words] register layout of an LL tile: each thread's 4 words hold the 8 k
    that stream_mma.stage_layout gives it."""
    KS = CK // 4
    TK = 32 if KS >= 256 else KS // 8
    return gl.BlockedLayout([1, 1, 4], [1, 32 // TK, TK], [4, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def ll_act_layout(CK):
    """The staged activation tile's shared layout (stream_base.mma_act_bases) viewed as int32 [4, 16, CK/8]: the
    bf16 layout without its k bit 0 (a pair of k is one int32), every other base's k halved (all even)."""
    b = mma_act_bases(CK)
    assert tuple(b[0]) == (0, 0, 1) and all(c[2] % 2 == 0 for c in b[1:]), b
    return gl.SharedLinearLayout([[c[0], c[1], c[2] // 2] for c in b[1:]])


@gluon.constexpr_function
def _poll_asm(p, wait_ns, sleep_ns):
    """PTX of ``poll_ll`` for ``p`` words per thread: operands $0..p-1 the words out, $p.. the words in, $2p.. their
    addresses, $3p the epoch."""
    chk = " ".join(f"shr.u64 x, w{i}, 32; cvt.u32.u64 h, x; setp.ne.u32 s{i}, h, ${3 * p};" for i in range(p))
    anys = "mov.pred a, s0;" + "".join(f" or.pred a, a, s{i};" for i in range(1, p))
    return ("{ .reg .pred a, q, s<%d>; .reg .b64 w<%d>, x, t0, tn; .reg .b32 h; " % (p, p)
            + " ".join(f"mov.b64 w{i}, ${p + i};" for i in range(p)) + " " + chk + " " + anys
            + " @!a bra LLD${:uid}; mov.u64 t0, %globaltimer; LLL${:uid}: "
            + " ".join(f"@s{i} ld.relaxed.gpu.global.b64 w{i}, [${2 * p + i}];" for i in range(p)) + " " + chk + " "
            + anys + " @!a bra LLD${:uid}; " + (f"nanosleep.u32 {int(sleep_ns)}; " if sleep_ns else "")
            + "mov.u64 tn, %globaltimer; sub.u64 tn, tn, t0;"
            + f" setp.lt.u64 q, tn, {int(wait_ns)}; @q bra LLL${{:uid}}; LLD${{:uid}}: "
            + " ".join(f"mov.b64 ${i}, w{i};" for i in range(p)) + " }")


@gluon.constexpr_function
def _poll_constraints(p):
    return ",".join(["=l"] * p + ["l"] * (2 * p) + ["r"] * p)


@gluon.constexpr_function
def _words_per_thread(CK):
    return 4 * 4 * (CK // 8) // 128


@gluon.jit
def _ll_index(kb, K, CK: gl.constexpr):
    """(word index [4, 1, CK/8] of tile kb's k-slices, row-in-quad [1, 4, 1], words per row) in ll_layout."""
    L: gl.constexpr = ll_layout(CK)
    KW: gl.constexpr = CK // 8
    kw = kb * (CK // 2) + gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))[:, None, None] * KW + \
        gl.arange(0, KW, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))[None, None, :]
    r4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))[None, :, None]
    return kw, r4, K // 2


@gluon.jit
def load_ll(xw, K, kb, epoch, B: gl.constexpr, CK: gl.constexpr):
    """The ``.cg`` loads of LL tile kb (int64 words at xw, [B, K/2]) per 4-row quad holding a row < B, as
    [4, 4, CK/8] int64; masked words read as (0, epoch), so they never wait."""
    kw, r4, KW = _ll_index(kb, K, CK)
    fill = epoch.to(gl.int64) << 32
    vs = ()
    for q in gl.static_range(4):
        if q * 4 < B:
            vs = vs + (gl.load(xw + (q * 4 + r4) * KW + kw, mask=((q * 4 + r4) < B) & (kw < KW), other=fill,
                               cache_modifier=".cg"),)
    return vs


@gluon.jit
def store_ll(abuf, vs, xw, K, kb, epoch, err, t, B: gl.constexpr, CK: gl.constexpr, WAIT_NS: gl.constexpr,
             LL: gl.constexpr):
    """Stage LL tile kb (its words ``vs`` from load_ll) into the activation tile abuf: every thread re-polls its
    words whose flag is not ``epoch`` (``ld.relaxed.gpu``, no CTA barrier inside: threads finish apart) for at
    most WAIT_NS, then stores the payloads through the int32 view of abuf (ll_act_layout). A word still stale
    records (7, task, tile, flag seen, epoch) in err. LL: the kernel's constexpr (1 + ns of nanosleep between
    re-polls)."""
    L: gl.constexpr = ll_layout(CK)
    KWT: gl.constexpr = CK // 8
    P: gl.constexpr = _words_per_thread(CK)
    kw, r4, KW = _ll_index(kb, K, CK)
    av = view(abuf, gl.int32, [4, 16, KWT], ll_act_layout(CK))
    ep = gl.zeros([4, 4, KWT], gl.int32, L) + epoch
    for q in gl.static_range(4):
        if q * 4 < B:
            w = gl.inline_asm_elementwise(_poll_asm(P, WAIT_NS, LL - 1), _poll_constraints(P),
                                          [vs[q], xw + (q * 4 + r4) * KW + kw, ep], dtype=gl.int64, is_pure=False,
                                          pack=P)
            flag = (w >> 32).to(gl.int32)
            _record_if(flag != ep, err, t, kb, flag, ep)
            av.slice(q * 4, 4, dim=1).store(w.to(gl.int32))


@gluon.jit
def _record_if(bad, err, t, kb, seen, ep):
    """stream_base.record (7, t, kb, seen, ep), predicated per element on ``bad``: the first failure claims err[0]."""
    z = gl.zeros_like(seen)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 zz, o; setp.ne.b32 p, $1, 0; mov.b32 zz, 0; mov.b32 o, 1;"
        " @p atom.global.relaxed.gpu.cas.b32 o, [$2], zz, $3; setp.eq.and.b32 p, o, 0, p;"
        " @p st.global.b32 [$2+4], $4; @p st.global.b32 [$2+8], $5; @p st.global.b32 [$2+12], $6;"
        " @p st.global.b32 [$2+16], $7; mov.b32 $0, 0; }",
        "=r,r,l,r,r,r,r,r", [bad.to(gl.int32), err + z, z + ERR_LL, z + t, z + kb, seen, ep],
        dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def pack_pairs(v, r, epoch, AL: gl.constexpr):
    """LL words of the values v [BP, RG] (model dtype, layout AL; pairs of rows (2j, 2j + 1) in neighbouring lanes):
    int64 [BP, RG] whose even-row entries hold (v[:, 2j] | v[:, 2j + 1] << 16 | epoch << 32); odd entries: unused."""
    bits = v.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    nb = gl.gather(bits, gl.zeros(v.shape, gl.int32, AL) + (r ^ 1)[None, :], 1)
    return ((bits | (nb << 16)).to(gl.int64) & 0xFFFFFFFF) | (epoch.to(gl.int64) << 32)
