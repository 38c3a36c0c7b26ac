"""The streaming megakernel's stream-K pieces, device side (Gluon; host side and the math: ``exec.stream_splitk``):
a task's piece of a split unit stores its fp32 sums in its partials slot and arrives on the unit's counter; the
piece that arrives last sums every piece's slot in k order and runs the unit's epilogue (RoPE + q / KV-cache rows,
or SiLU(gate) * up), the same pattern as attention's folded merge (``stream_attn._arrive_and_merge``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.exec.stream_base import F_SKT, F_SKW, K_GATEUP, K_QKV, barrier
from onekernel.exec.stream_epilogue import gateup_out, qkv_out, rope_cos_sin

# the partials buffer's slot in a GEMV op's arguments (exec.stream_plan.ROLES, which asserts them); the arrival
# counters follow it
SKP_ARG, SKP_ARG_QKV = gl.constexpr(4), gl.constexpr(10)


@gluon.jit
def split_piece(kind, rec, a, base_f, base_i, acc0, acc1, u, slot, nkb, f, r, bm, b64, pos, q, kc, vc, out, N,
                B: gl.constexpr, BP: gl.constexpr, RG: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
                HD: gl.constexpr, S: gl.constexpr, AL: gl.constexpr):
    """This task's piece of split unit ``u`` (its sums acc0, acc1 fp32 [BP, RG] in layout AL: the unit's chunk
    groups, acc1 gate_up's up rows) into slot ``slot`` of the op's partials stream.skp fp32 [2 W, 2, B, RG] (argtab
    role SKP_ARG*), then one ``atom.add.acq_rel.gpu`` on the unit's counter (role + 1, int32 [units]). The piece that
    brings it to the unit's piece count (tasks w0..w1 by the record's W and T: stream_splitk.task_of) resets it to 0
    for the next step, reads every piece's slot (``.cg``, after the acquire and a CTA barrier) and sums them from
    zero in k order (w0 first: the same sums whoever is last), then the epilogue: qkv_out with RoPE at each row's
    position (``f``: the unit's inverse frequencies [RG]) or gateup_out."""
    V1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    dt: gl.constexpr = q.dtype.element_ty
    CH: gl.constexpr = HD // RG
    arg = gl.where(kind == K_QKV, SKP_ARG_QKV, SKP_ARG)
    skp = base_f + gl.load(a + arg) * 4
    ska = base_i + gl.load(a + arg + 1) * 4
    W = gl.load(rec + F_SKW)
    T = gl.load(rec + F_SKT)
    offs = b64 * RG + r[None, :]
    gl.store(skp + (2 * slot) * (B * RG) + offs, acc0, mask=bm)
    if kind == K_GATEUP:
        gl.store(skp + (2 * slot + 1) * (B * RG) + offs, acc1, mask=bm)
    barrier()  # every thread's partial stores issued before the release
    j = gl.arange(0, 128, layout=V1)  # one element per thread: one atomic, no replicated ones
    old = gl.atomic_add(ska + u + j * 0, j * 0 + 1, mask=j == 0, sem="acq_rel", scope="gpu")
    w0 = ((u * nkb + 1) * W - 1) // T
    w1 = ((u + 1) * nkb * W - 1) // T
    last = gl.sum(gl.where((j == 0) & (old + 1 == w1 - w0 + 1), 1, 0), axis=0)  # a CTA reduction: every thread
    if last != 0:
        gl.store(ska + u + j * 0, j * 0, mask=j == 0)
        ag = gl.zeros([BP, RG], gl.float32, AL)
        au = gl.zeros([BP, RG], gl.float32, AL)
        for w in range(w0, w1 + 1):
            s = 2 * w + (u != ((w * T) // W) // nkb).to(gl.int32)
            ag += gl.load(skp + (2 * s) * (B * RG) + offs, mask=bm, other=0.0, cache_modifier=".cg")
            if kind == K_GATEUP:
                au += gl.load(skp + (2 * s + 1) * (B * RG) + offs, mask=bm, other=0.0, cache_modifier=".cg")
        if kind == K_GATEUP:
            gateup_out(ag, au, u, r, b64, bm, N, out, RG)
        else:
            cs, sn = rope_cos_sin(pos, f, dt)
            qkv_out(ag, cs, sn, u // CH, u % CH, r, bm, b64, pos, q, kc, vc, HQ, HKV, HD, S, RG, BP, AL)
