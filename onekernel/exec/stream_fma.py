"""The streaming megakernel's CUDA-core GEMV body (Gluon, sm_90; a ``gemv="fma"`` step): per task the activation
read once into shared memory with RMSNorm applied once (the first XB batch rows; the others re-read and
re-normalised from L2 per chunk with the same operations), then per chunk of the ring: wait ``ready``, chunk ->
registers, each warp releases the slot, in-thread partial sums per batch row in k order, one 32-lane reduction per
row group; the epilogues of ``exec.stream_epilogue``. docs/DESIGN.md, "The streaming megakernel as built"; the
worker loop that calls it: ``exec.stream_device``; the tensor-core body: ``exec.stream_mma``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.exec.stream_base import (F_IDX, F_SYS, K_GATEUP, K_LMHEAD, K_QKV, K_RESID, barrier, push_rows,
                                        smem_addr, view, wait_bounded, warp_release)
from onekernel.exec.stream_epilogue import gateup_out, gemv_task, lm_out, qkv_buffers, qkv_out, rope_angles
from onekernel.ops.gemv_rows import rnd  # the ops' own rounding (a Triton function Gluon calls)


@gluon.jit
def _fill_x(xbuf, x, nw, K, B: gl.constexpr, BP: gl.constexpr, XB: gl.constexpr, KXB: gl.constexpr,
            CK: gl.constexpr, NORM: gl.constexpr, EPS: gl.constexpr):
    """xbuf[b, j, :] = (RMSNorm?)x[b, j*CK:(j+1)*CK] (model dtype, 0 past K) for the batch rows b < XB that
    shared memory holds: the activation read once per task (RMSNorm computed once per task). Returns fp32 [BP]
    rstd of every row (NORM; _xrow normalises the rows b >= XB with it, chunk by chunk). RMSNorm as HF:
    ``w * (x.float() * rstd).to(dt)`` rounded to dt. The norm weight is loaded with x (one memory round trip);
    each thread reads back only the elements it stored, so the two passes need no barrier between them."""
    BL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    XR: gl.constexpr = 4 if KXB >= 4 else KXB
    dt: gl.constexpr = x.dtype.element_ty
    offs = gl.arange(0, XR, layout=gl.SliceLayout(1, BL))[:, None] * CK + \
        gl.arange(0, CK, layout=gl.SliceLayout(0, BL))[None, :]
    RL: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])     # per-batch-row rstd [BP]
    ridx = gl.arange(0, BP, layout=RL)
    rstd_all = gl.zeros([BP], gl.float32, RL)
    gs = ()
    if NORM:
        for j in gl.static_range(0, KXB, XR):
            gs = gs + (gl.load(nw + offs + j * CK, mask=offs + j * CK < K, other=0.0),)
    for b in range(B):
        xb = x + b * K
        ss = gl.zeros([XR, CK], gl.float32, BL)
        for j in gl.static_range(0, KXB, XR):
            o = offs + j * CK
            v = gl.load(xb + o, mask=o < K, other=0.0, cache_modifier=".cg")
            if NORM:
                f = v.to(gl.float32)
                ss += f * f
            if b < XB:
                xbuf.index(b).slice(j, XR).store(v)
        if NORM:
            rstd = gl.rsqrt(gl.sum(gl.sum(ss, axis=1), axis=0) / K + EPS)
            rstd_all = gl.where(ridx == b, rstd, rstd_all)
            if b < XB:
                for j in gl.static_range(0, KXB, XR):
                    xv = xbuf.index(b).slice(j, XR).load(BL).to(gl.float32)
                    h = rnd(rnd(xv * rstd, dt) * gs[j // XR].to(gl.float32), dt)
                    xbuf.index(b).slice(j, XR).store(h.to(dt))
    barrier()
    return rstd_all


@gluon.jit
def _xrow(x, nw, K, rstd_all, b, kb, BP: gl.constexpr, CK: gl.constexpr, NORM: gl.constexpr, X3: gl.constexpr):
    """Chunk kb of batch row b's (RMSNorm?)activation, [CK/256, 32, 8] in layout X3, read from global memory
    (L2) for the rows xbuf does not hold: the same operations as _fill_x, so the same bits."""
    dt: gl.constexpr = x.dtype.element_ty
    NREP: gl.constexpr = CK // 256
    o = kb * CK + \
        gl.arange(0, NREP, layout=gl.SliceLayout(1, gl.SliceLayout(2, X3)))[:, None, None] * 256 + \
        gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, X3)))[None, :, None] * 8 + \
        gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, X3)))[None, None, :]
    v = gl.load(x + b * K + o, mask=o < K, other=0.0, cache_modifier=".cg")
    if NORM:
        rstd = gl.sum(gl.where(gl.arange(0, BP, layout=rstd_all.type.layout) == b, rstd_all, 0.0), axis=0)
        g = gl.load(nw + o, mask=o < K, other=0.0)
        v = rnd(rnd(v.to(gl.float32) * rstd, dt) * g.to(gl.float32), dt).to(dt)
    return v


@gluon.jit
def _group(ring, bars, xbuf, xs, nkb, ok, i, err, t, B: gl.constexpr, BP: gl.constexpr, XB: gl.constexpr,
           KXB: gl.constexpr, RG: gl.constexpr, CK: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr,
           WAIT_NS: gl.constexpr, NORM: gl.constexpr, AL: gl.constexpr):
    """fp32 [BP, RG] (layout AL): row group sums ``sum_k x[b, k] W[row, k]`` for every batch row b, the
    group's nkb chunks consumed from the ring (chunk counter i). Rows b < XB read their activation from xbuf,
    the others from global memory (``xs`` = (x, norm weight, K, rstd): _xrow).

    A chunk [RG, CK] is read as [RG, CK/256, 32, 8]: lane l holds columns rep*256 + 8l .. +8 of its rows, so
    the per-chunk product sums stay inside the thread (no shuffles): per row and lane, 8 then CK/256 in-thread
    adds, accumulated in k order; one 32-lane reduction per row at the end of the group. The same operations
    for every b and every B (batch invariance)."""
    NREP: gl.constexpr = CK // 256
    L4: gl.constexpr = gl.BlockedLayout([1, NREP, 1, 8], [1, 1, 32, 1], [4, 1, 1, 1], [3, 2, 1, 0])
    X3: gl.constexpr = gl.SliceLayout(0, L4)                                   # x chunk [NREP, 32, 8]
    A3: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 1, 32], [1, 4, 1], [2, 1, 0])   # [BP, RG, 32]
    CHUNK_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])
    ROW_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])        # xbuf rows, indexed to a chunk
    ready0 = smem_addr(BARS)
    empty0 = smem_addr(BARS + 8 * SLOTS)
    bidx = gl.arange(0, BP, layout=gl.SliceLayout(1, gl.SliceLayout(2, A3)))[:, None, None]
    acc = gl.zeros([BP, RG, 32], gl.float32, A3)
    for kb in range(nkb):
        slot = i % SLOTS
        ok = wait_bounded(ok, ready0 + 8 * slot, (i // SLOTS) & 1, err, 2, t, i, slot, WAIT_NS)
        w = view(ring.index(slot), ring.dtype, [RG, NREP, 32, 8], CHUNK_SL).load(L4).to(gl.float32)
        warp_release(empty0 + 8 * slot, ok)
        i += 1
        for b in range(B):
            if XB >= B:  # every row in xbuf (compile-time)
                xk = view(xbuf.index(b), xbuf.dtype, [KXB, NREP, 32, 8], ROW_SL).index(kb).load(X3)
            elif b < XB:
                xk = view(xbuf.index(b), xbuf.dtype, [KXB, NREP, 32, 8], ROW_SL).index(kb).load(X3)
            else:
                xk = _xrow(xs[0], xs[1], xs[2], xs[3], b, kb, BP, CK, NORM, X3)
            part = gl.sum(gl.sum(w * xk.to(gl.float32)[None, :, :, :], axis=3), axis=1)
            part = gl.convert_layout(part, gl.SliceLayout(0, A3))
            acc = gl.where(bidx == b, acc + part[None, :, :], acc)
    return gl.convert_layout(gl.sum(acc, axis=2), AL), ok, i


@gluon.jit
def gemv_fma(kind, rec, a, base_t, base_f, base_i, ring, bars, xbuf, ok, i, err,
          B: gl.constexpr, BP: gl.constexpr, XB: gl.constexpr, KXB: gl.constexpr, RG: gl.constexpr,
          CK: gl.constexpr,
          SLOTS: gl.constexpr, BARS: gl.constexpr, WAIT_NS: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
          HD: gl.constexpr, S: gl.constexpr, NT: gl.constexpr, EPS: gl.constexpr, AL: gl.constexpr,
          pdelta=None, PUSH: gl.constexpr = False, NR: gl.constexpr = 1):
    """One GEMV task: units [u0, u0 + nu) of op rows (exec.stream_plan: RESID/LMHEAD unit = RG rows, GATEUP =
    RG gate rows + the same RG up rows, QKV = RG/2 rotation pairs of one head). PUSH (tensor parallel): a
    residual task whose signal a peer waits on (F_SYS) also stores its outputs into every peer's pool
    (stream_base.push_rows over ``pdelta``)."""
    dt: gl.constexpr = base_t.dtype.element_ty
    t, u0, nu, K, nkb, N, x, nw = gemv_task(rec, a, base_t, False)
    if (kind == K_GATEUP) | (kind == K_QKV) | (kind == K_LMHEAD):
        rstd = _fill_x(xbuf, x, nw, K, B, BP, XB, KXB, CK, True, EPS)
    else:
        rstd = _fill_x(xbuf, x, x, K, B, BP, XB, KXB, CK, False, EPS)
    xs = (x, nw, K, rstd)
    bidx = gl.arange(0, BP, layout=gl.SliceLayout(1, AL))
    r = gl.arange(0, RG, layout=gl.SliceLayout(0, AL))
    bm = bidx[:, None] < B
    b64 = bidx.to(gl.int64)[:, None]
    if kind == K_RESID:
        res = base_t + gl.load(a + 1) * 8
        out = base_t + gl.load(a + 2) * 8
        for u in range(u0, u0 + nu):
            offs = b64 * N + (u * RG + r)[None, :]
            m = bm & ((u * RG + r) < N)[None, :]
            rv = gl.load(res + offs, mask=m, other=0.0, cache_modifier=".cg")  # in flight during the chunks
            acc, ok, i = _group(ring, bars, xbuf, xs, nkb, ok, i, err, t, B, BP, XB, KXB, RG, CK, SLOTS, BARS,
                                WAIT_NS, False, AL)
            if PUSH:
                y = (rv.to(gl.float32) + rnd(acc, dt)).to(dt)
                gl.store(out + offs, y, mask=m)
                if gl.load(rec + F_SYS) != 0:
                    push_rows(out + offs, y, m, pdelta, NR)
            else:
                gl.store(out + offs, (rv.to(gl.float32) + rnd(acc, dt)).to(dt), mask=m)
    elif kind == K_GATEUP:
        out = base_t + gl.load(a + 2) * 8
        for u in range(u0, u0 + nu):
            ag, ok, i = _group(ring, bars, xbuf, xs, nkb, ok, i, err, t, B, BP, XB, KXB, RG, CK, SLOTS, BARS,
                                WAIT_NS, True, AL)
            au, ok, i = _group(ring, bars, xbuf, xs, nkb, ok, i, err, t, B, BP, XB, KXB, RG, CK, SLOTS, BARS,
                                WAIT_NS, True, AL)
            gateup_out(ag, au, u, r, b64, bm, N, out, RG)
    elif kind == K_QKV:
        # unit u: head h = u // (HD / RG), pair chunk c (qkv_out)
        CH: gl.constexpr = HD // RG
        q, kc, vc, pos, inv_freq = qkv_buffers(a, base_t, base_f, base_i, bidx, B)
        for u in range(u0, u0 + nu):
            h = u // CH
            c = u % CH
            # cos / sin of the unit's pairs before its chunks (they do not depend on the GEMV)
            cs, sn = rope_angles(pos, inv_freq, c, r, dt, RG)
            acc, ok, i = _group(ring, bars, xbuf, xs, nkb, ok, i, err, t, B, BP, XB, KXB, RG, CK, SLOTS, BARS,
                                WAIT_NS, True, AL)
            qkv_out(acc, cs, sn, h, c, r, bm, b64, pos, q, kc, vc, HQ, HKV, HD, S, RG, BP, AL)
    else:  # K_LMHEAD: fp32 logits, per-task max / smallest argmax per batch row
        logits = base_f + gl.load(a + 2) * 4
        pmax = base_f + gl.load(a + 3) * 4
        pidx = base_i + gl.load(a + 4) * 4
        idx = gl.load(rec + F_IDX)
        best = gl.full([BP], float("-inf"), gl.float32, gl.SliceLayout(1, AL))
        barg = gl.zeros([BP], gl.int32, gl.SliceLayout(1, AL))
        for u in range(u0, u0 + nu):
            acc, ok, i = _group(ring, bars, xbuf, xs, nkb, ok, i, err, t, B, BP, XB, KXB, RG, CK, SLOTS, BARS,
                                WAIT_NS, True, AL)
            best, barg = lm_out(acc, u, r, b64, bm, N, logits, best, barg, dt, RG)
        gl.store(pmax + bidx * NT + idx, best, mask=bidx < B)
        gl.store(pidx + bidx * NT + idx, barg, mask=bidx < B)
    return ok, i
