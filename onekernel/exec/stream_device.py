"""The streaming megakernel's device code (Gluon, sm_90): warp-specialised workers with a weight ring.

One CTA per SM. Two partitions (``gl.warp_specialize``):
* **loader** (1 warp): walks the worker's packed weight stream (every GEMV chunk of every task in its queue,
  in queue order; ``exec.stream_plan``) with one TMA copy per 16 KB chunk into a ring of SLOTS shared-memory
  slots (mbarriers ``ready``/``empty`` per slot). It never looks at a dependency: weights are ready before
  the step, so the ring stays full across task boundaries and while the consumer waits.
* **consumer** (4 warps): per queue position, spins (``ld.acquire.gpu``, bounded) on the task's events, runs
  the task, CTA-barrier, one release atomic add on the task's event. GEMV tasks read their activation once
  per task into shared memory (RMSNorm applied once there), then per chunk: wait ``ready``, chunk -> registers,
  arrive ``empty`` (the loader refills the slot while we compute), per batch row one [RG] reduction added to
  an fp32 accumulator in k order; epilogue per row group (residual / RoPE + KV append / logits + argmax
  partials) or per unit (gate/up + SiLU). Attention, merge, embedding and argmax tasks use plain loads.

Numerics follow ops/ (HF rounding points, ``rnd``); a row's reductions never depend on the batch size
(batch invariance). The math is the same as the interpreter-tested Triton tile functions, not the same
instructions: the GPU check compares both paths (scripts/gpu_suite.py, tests marked gpu).
Every wait is bounded; the first failure is recorded in err[0:5] = (code, task, a, b, c) (ERRORS).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.extra.cuda import libdevice

# Triton 3.6 -> 3.8/3.9 renames: the CTA-wide barrier (gl.thread_barrier -> gl.barrier), the TMA load
# (tma.async_copy_global_to_shared -> tma.async_load, same leading arguments) and a shared-memory view of
# another shape (_reinterpret -> reinterpret).
barrier = getattr(gl, "thread_barrier", None) or gl.barrier
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def view(desc, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return desc.reinterpret(dtype, shape, layout)
else:
    @gluon.jit
    def view(desc, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return desc._reinterpret(dtype, shape, layout)

_c = gl.constexpr
# Task kinds (record field F_KIND).
K_EMBED, K_RESID, K_GATEUP, K_QKV, K_LMHEAD, K_ATTN, K_MERGE, K_ARGMAX = (_c(i) for i in range(8))
# Record fields (int32 [n_positions + 1, REC]); the per-op buffer offsets are in argtab (16-byte units).
(F_KIND, F_OP, F_TASK, F_SIGNAL, F_WB, F_WE, F_EV0, F_EX0, F_TILE, F_U0, F_NU, F_K, F_NKB, F_N,
 F_IDX) = (_c(i) for i in range(15))
REC = _c(16)
ERRORS = {1: ("dependency wait", "event", "seen", "want"), 2: ("consumer ring wait", "chunk", "slot", "phase"),
          3: ("loader ring wait", "chunk", "slot", "phase"), 4: ("chunk count", "consumed", "streamed", "-")}


# ----------------------------------------------------------------------------------------------- primitives
@gluon.jit
def _ld_acquire(p):
    return gl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [p], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _smem_addr(offset):
    """Shared address of byte ``offset`` of the dynamic shared memory: Gluon has no non-blocking mbarrier wait,
    so the bounded waits address the mbarriers at the offset Triton allocates them (stream_plan checks it)."""
    return gl.inline_asm_elementwise("{ .reg .u32 b; mov.u32 b, global_smem; add.u32 $0, b, $1; }", "=r,r",
                                     [offset], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _record(err, code, t, a, b, c):
    """The first failure claims err[0] and writes err[0:5] = (code, task, a, b, c); per thread, barrier-free."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 z; mov.b32 z, 0; atom.global.relaxed.gpu.cas.b32 $0, [$1], z, $2;"
        " setp.eq.b32 p, $0, 0; @p st.global.b32 [$1+4], $3; @p st.global.b32 [$1+8], $4;"
        " @p st.global.b32 [$1+12], $5; @p st.global.b32 [$1+16], $6; }",
        "=r,l,r,r,r,r,r", [err, code, t, a, b, c], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _try_wait(addr, parity):
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.b32 $0, 1, 0, p; }",
        "=r,r,r", [addr, parity], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _wait(ok, addr, parity, err, code, t, i, slot, WAIT_NS: gl.constexpr):
    """Bounded mbarrier wait (skipped unless ok); 0 after recording a timeout (then the caller skips the rest)."""
    if ok != 0:
        ok = _try_wait(addr, parity)
        if ok == 0:
            t0 = _now()
            tn = t0
            while (ok == 0) & (tn - t0 < WAIT_NS):
                ok = _try_wait(addr, parity)
                tn = _now()
            if ok == 0:
                _record(err, code, t, i, slot, parity)
    return ok


@gluon.jit
def _spin(cnt, want, err, t, ev, WAIT_NS: gl.constexpr):
    """Spin until cnt[0] >= want (every thread, ``ld.acquire.gpu``), for at most WAIT_NS and not once another
    failure is recorded (err[0] polled every 256 polls)."""
    seen = _ld_acquire(cnt)
    if seen < want:
        t0 = _now()
        tn = t0
        n = 0
        bad = 0
        while (seen < want) & (bad == 0) & (tn - t0 < WAIT_NS):
            seen = _ld_acquire(cnt)
            tn = _now()
            n += 1
            if n % 256 == 0:
                bad = gl.load(err, volatile=True)
        if (seen < want) & (bad == 0):
            _record(err, 1, t, ev, seen, want)


@gluon.jit
def rnd(x, dt: gl.constexpr):
    """fp32 x rounded to dtype dt (bf16 / fp16, ties to even), as fp32 (ops.gemv.rnd, in Gluon)."""
    if dt == gl.bfloat16:
        u = x.to(gl.int32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & -65536
        return u.to(gl.float32, bitcast=True)
    else:
        u = x.to(gl.int32, bitcast=True)
        u = (u + 0xFFF + ((u >> 13) & 1)) & -8192
        y = u.to(gl.float32, bitcast=True)
        y = gl.where(gl.abs(x) < 6.103515625e-05, (x + 0.75) - 0.75, y)
        return gl.where(gl.abs(y) > 65504.0, x * float("inf"), y)


# ----------------------------------------------------------------------------------------------- loader
@gluon.jit
def _loader(w_desc, ring, bars, err, c0, n_chunks, SLOTS: gl.constexpr, BARS: gl.constexpr,
            WAIT_NS: gl.constexpr):
    """1 warp: TMA chunk c0 + i of the packed stream into slot i % SLOTS, for i in [0, n_chunks). Its waits get
    twice the consumer's bound, so the first recorded failure is the cause."""
    rows: gl.constexpr = w_desc.block_type.shape[0]
    empty0 = _smem_addr(BARS + 8 * SLOTS)
    ok = 1
    for i in range(n_chunks):
        slot = i % SLOTS
        ok = _wait(ok, empty0 + 8 * slot, ((i // SLOTS) & 1) ^ 1, err, 3, -1, i, slot, 2 * WAIT_NS)
        mbarrier.expect(bars.index(slot), w_desc.block_type.nbytes, pred=ok != 0)
        tma_load(w_desc, [(c0 + i) * rows, 0], bars.index(slot), ring.index(slot),
                                        pred=ok != 0)


# ----------------------------------------------------------------------------------------------- GEMV
@gluon.jit
def _warp_release(addr, ok):
    """Every lane: ``fence.proxy.async`` (its generic-proxy reads of the slot before the TMA's next write),
    ``bar.warp.sync``, then lane 0 arrives on the mbarrier at shared address ``addr`` (count: one per consumer
    warp), unless ok == 0. No CTA-wide barrier per chunk."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 l; fence.proxy.async.shared::cta; bar.warp.sync -1; mov.u32 l, %laneid;"
        " setp.eq.u32 p, l, 0; setp.ne.and.b32 p, $2, 0, p; @p mbarrier.arrive.shared::cta.b64 _, [$1];"
        " mov.b32 $0, 0; }", "=r,r,r", [addr, ok], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _fill_x(xbuf, x, nw, K, B: gl.constexpr, KXB: gl.constexpr, CK: gl.constexpr, NORM: gl.constexpr,
            EPS: gl.constexpr):
    """xbuf[b, j, :] = (RMSNorm?)x[b, j*CK:(j+1)*CK] (model dtype, 0 past K) for every batch row b: the
    activation read once per task (RMSNorm computed once per task). RMSNorm as HF: ``w * (x.float() *
    rstd).to(dt)`` rounded to dt. The norm weight is loaded with x (one memory round trip); each thread reads
    back only the elements it stored, so the two passes need no barrier between them."""
    BL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    XR: gl.constexpr = 4 if KXB >= 4 else KXB
    dt: gl.constexpr = x.dtype.element_ty
    offs = gl.arange(0, XR, layout=gl.SliceLayout(1, BL))[:, None] * CK + \
        gl.arange(0, CK, layout=gl.SliceLayout(0, BL))[None, :]
    for b in range(B):
        xb = x + b * K
        ss = gl.zeros([XR, CK], gl.float32, BL)
        gs = ()
        for j in gl.static_range(0, KXB, XR):
            o = offs + j * CK
            v = gl.load(xb + o, mask=o < K, other=0.0, cache_modifier=".cg")
            if NORM:
                gs = gs + (gl.load(nw + o, mask=o < K, other=0.0),)
                f = v.to(gl.float32)
                ss += f * f
            xbuf.index(b).slice(j, XR).store(v)
        if NORM:
            rstd = gl.rsqrt(gl.sum(gl.sum(ss, axis=1), axis=0) / K + EPS)
            for j in gl.static_range(0, KXB, XR):
                v = xbuf.index(b).slice(j, XR).load(BL).to(gl.float32)
                h = rnd(rnd(v * rstd, dt) * gs[j // XR].to(gl.float32), dt)
                xbuf.index(b).slice(j, XR).store(h.to(dt))
    barrier()


@gluon.jit
def _group(ring, bars, xbuf, nkb, ok, i, err, t, B: gl.constexpr, BP: gl.constexpr, KXB: gl.constexpr,
           RG: gl.constexpr, CK: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr, WAIT_NS: gl.constexpr,
           AL: gl.constexpr):
    """fp32 [BP, RG] (layout AL): row group sums ``sum_k x[b, k] W[row, k]`` for every batch row b, the
    group's nkb chunks consumed from the ring (chunk counter i).

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
    ready0 = _smem_addr(BARS)
    empty0 = _smem_addr(BARS + 8 * SLOTS)
    bidx = gl.arange(0, BP, layout=gl.SliceLayout(1, gl.SliceLayout(2, A3)))[:, None, None]
    acc = gl.zeros([BP, RG, 32], gl.float32, A3)
    for kb in range(nkb):
        slot = i % SLOTS
        ok = _wait(ok, ready0 + 8 * slot, (i // SLOTS) & 1, err, 2, t, i, slot, WAIT_NS)
        w = view(ring.index(slot), ring.dtype, [RG, NREP, 32, 8], CHUNK_SL).load(L4).to(gl.float32)
        _warp_release(empty0 + 8 * slot, ok)
        i += 1
        for b in range(B):
            xk = view(xbuf.index(b), xbuf.dtype, [KXB, NREP, 32, 8], ROW_SL).index(kb).load(X3)
            part = gl.sum(gl.sum(w * xk.to(gl.float32)[None, :, :, :], axis=3), axis=1)
            part = gl.convert_layout(part, gl.SliceLayout(0, A3))
            acc = gl.where(bidx == b, acc + part[None, :, :], acc)
    return gl.convert_layout(gl.sum(acc, axis=2), AL), ok, i


@gluon.jit
def _gemv(kind, rec, a, base_t, base_f, base_i, ring, bars, xbuf, ok, i, err,
          B: gl.constexpr, BP: gl.constexpr, KXB: gl.constexpr, RG: gl.constexpr, CK: gl.constexpr,
          SLOTS: gl.constexpr, BARS: gl.constexpr, WAIT_NS: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
          HD: gl.constexpr, S: gl.constexpr, NT: gl.constexpr, EPS: gl.constexpr, AL: gl.constexpr):
    """One GEMV task: units [u0, u0 + nu) of op rows (exec.stream_plan: RESID/LMHEAD unit = RG rows, GATEUP =
    RG gate rows + the same RG up rows, QKV = RG/2 rotation pairs of one head)."""
    dt: gl.constexpr = base_t.dtype.element_ty
    t = gl.load(rec + F_TASK)
    u0 = gl.load(rec + F_U0)
    nu = gl.load(rec + F_NU)
    K = gl.load(rec + F_K)
    nkb = gl.load(rec + F_NKB)
    N = gl.load(rec + F_N)
    x = base_t + gl.load(a) * 8
    if (kind == K_GATEUP) | (kind == K_QKV) | (kind == K_LMHEAD):
        _fill_x(xbuf, x, base_t + gl.load(a + 1) * 8, K, B, KXB, CK, True, EPS)
    else:
        _fill_x(xbuf, x, x, K, B, KXB, CK, False, EPS)
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
            acc, ok, i = _group(ring, bars, xbuf, nkb, ok, i, err, t, B, BP, KXB, RG, CK, SLOTS, BARS, WAIT_NS,
                                AL)
            gl.store(out + offs, (rv.to(gl.float32) + rnd(acc, dt)).to(dt), mask=m)
    elif kind == K_GATEUP:
        out = base_t + gl.load(a + 2) * 8
        for u in range(u0, u0 + nu):
            ag, ok, i = _group(ring, bars, xbuf, nkb, ok, i, err, t, B, BP, KXB, RG, CK, SLOTS, BARS, WAIT_NS,
                               AL)
            au, ok, i = _group(ring, bars, xbuf, nkb, ok, i, err, t, B, BP, KXB, RG, CK, SLOTS, BARS, WAIT_NS,
                               AL)
            g = rnd(ag, dt)
            s = rnd(gl.div_rn(g, 1.0 + libdevice.exp(-g)), dt)
            gl.store(out + b64 * N + (u * RG + r)[None, :], (s * rnd(au, dt)).to(dt),
                     mask=bm & ((u * RG + r) < N)[None, :])
    elif kind == K_QKV:
        # unit u: head h = u // (HD / RG), pair chunk c; tile row j < P is head row c*P + j, j >= P is
        # head row HD/2 + c*P + (j - P)   (P = RG / 2)
        P: gl.constexpr = RG // 2
        CH: gl.constexpr = HD // RG
        q = base_t + gl.load(a + 2) * 8
        kc = base_t + gl.load(a + 3) * 8
        vc = base_t + gl.load(a + 4) * 8
        pos = gl.load(base_i + gl.load(a + 5) * 4 + bidx, mask=bidx < B, other=0, cache_modifier=".cg")
        inv_freq = base_f + gl.load(a + 6) * 4
        for u in range(u0, u0 + nu):
            h = u // CH
            c = u % CH
            # cos / sin of the unit's pairs before its chunks (they do not depend on the GEMV)
            ang = pos.to(gl.float32)[:, None] * gl.load(inv_freq + c * P + (r % P))[None, :]
            cs = rnd(libdevice.cos(ang), dt)
            sn = rnd(libdevice.sin(ang), dt)
            acc, ok, i = _group(ring, bars, xbuf, nkb, ok, i, err, t, B, BP, KXB, RG, CK, SLOTS, BARS, WAIT_NS,
                                AL)
            y = rnd(acc, dt)
            hr = (r // P) * (HD // 2) + c * P + (r % P)
            if h < HQ + HKV:  # RoPE (rotate_half form): the partner of tile row j is row (j + P) % RG
                yp = gl.gather(y, gl.zeros([BP, RG], gl.int32, AL) + ((r + P) % RG)[None, :], 1)
                rot = gl.where((r < P)[None, :], -yp, yp)
                y = rnd(y * cs, dt) + rnd(rot * sn, dt)
            pm = bm & ((pos >= 0) & (pos < S))[:, None]
            if h < HQ:
                gl.store(q + b64 * (HQ * HD) + h * HD + hr[None, :], y.to(dt), mask=bm)
            elif h < HQ + HKV:
                gl.store(kc + ((b64 * HKV + (h - HQ)) * S + pos.to(gl.int64)[:, None]) * HD + hr[None, :], y.to(dt),
                         mask=pm)
            else:
                gl.store(vc + ((b64 * HKV + (h - HQ - HKV)) * S + pos.to(gl.int64)[:, None]) * HD + hr[None, :],
                         y.to(dt), mask=pm)
    else:  # K_LMHEAD: fp32 logits, per-task max / smallest argmax per batch row
        logits = base_f + gl.load(a + 2) * 4
        pmax = base_f + gl.load(a + 3) * 4
        pidx = base_i + gl.load(a + 4) * 4
        idx = gl.load(rec + F_IDX)
        best = gl.full([BP], float("-inf"), gl.float32, gl.SliceLayout(1, AL))
        barg = gl.zeros([BP], gl.int32, gl.SliceLayout(1, AL))
        for u in range(u0, u0 + nu):
            acc, ok, i = _group(ring, bars, xbuf, nkb, ok, i, err, t, B, BP, KXB, RG, CK, SLOTS, BARS, WAIT_NS,
                                AL)
            lg = rnd(acc, dt)
            rows = u * RG + r
            gl.store(logits + b64 * N + rows[None, :], lg, mask=bm & (rows < N)[None, :])  # V % RG: padding rows
            v = gl.where((rows < N)[None, :], lg, float("-inf"))
            gm = gl.max(v, axis=1)
            gi = gl.min(gl.where(v == gm[:, None], rows[None, :], 2147483647), axis=1)
            upd = gm > best
            best = gl.where(upd, gm, best)
            barg = gl.where(upd, gi, barg)
        gl.store(pmax + bidx * NT + idx, best, mask=bidx < B)
        gl.store(pidx + bidx * NT + idx, barg, mask=bidx < B)
    return ok, i


# ----------------------------------------------------------------------------------------------- other tasks
@gluon.jit
def _embed(rec, a, base_t, base_i, B: gl.constexpr, V: gl.constexpr, D: gl.constexpr, BD: gl.constexpr):
    """out[b, cols] = table[tokens[b], cols] for the tile's BD columns (a token outside [0, V) gives zeros)."""
    L1: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
    tokens = base_i + gl.load(a) * 4
    table = base_t + gl.load(a + 1) * 8
    out = base_t + gl.load(a + 2) * 8
    cols = gl.load(rec + F_TILE) * BD + gl.arange(0, BD, layout=L1)
    for b in range(B):
        tok = gl.load(tokens + b, cache_modifier=".cg")
        okt = (tok >= 0) & (tok < V)
        v = gl.load(table + tok.to(gl.int64) * D + cols, mask=(cols < D) & okt, other=0.0)
        gl.store(out + b * D + cols, v, mask=cols < D)


@gluon.jit
def _wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE: gl.constexpr, WAIT_NS: gl.constexpr):
    """Spin on every event the task at ``rec`` waits for (the first from the record, the rest from ``wl``);
    with PROFILE, stamp the time the last one was satisfied."""
    wb = gl.load(rec + F_WB)
    we = gl.load(rec + F_WE)
    if we > wb:
        e0 = gl.load(rec + F_EV0)
        _spin(ev_cnt + e0, gl.load(rec + F_EX0) * epoch, err, t, e0, WAIT_NS)
        for j in range(wb + 1, we):
            e = gl.load(wl + 2 * j)
            _spin(ev_cnt + e, gl.load(wl + 2 * j + 1) * epoch, err, t, e, WAIT_NS)
    if PROFILE:
        gl.store(prof + t * 4 + 1, _now())


@gluon.jit
def _attn(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, PROFILE: gl.constexpr,
          WAIT_NS: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
          SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr, BN: gl.constexpr, SM_SCALE: gl.constexpr):
    """Split-KV partial of tile (b, kv head g, split s) for the R = Hq/Hkv query heads of g (ops/attention.py:
    O_s = sum_j exp(x_j - lse_s) v_j, lse_s = log sum_j exp(x_j), x_j = scale q.k_j; empty split: 0, -inf).

    The first BN positions of the split are loaded before the dependency wait (every position but the one
    this step writes, seq_lens[b], was written by earlier steps); that row is patched in after the wait. Warps
    split the query heads, so every reduction stays inside a warp (no CTA barrier). fp32 CUDA-core products
    over [RP, BN, HD], online softmax in exp2."""
    R: gl.constexpr = HQ // HKV
    TD: gl.constexpr = 32 if HD >= 256 else HD // 8
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32 // TD, TD], [4, 1, 1], [2, 1, 0])
    S2: gl.constexpr = gl.SliceLayout(2, L3)  # [RP, BN]
    S1: gl.constexpr = gl.SliceLayout(1, L3)  # [RP, HD]
    S0: gl.constexpr = gl.SliceLayout(0, L3)  # [BN, HD]
    tile = gl.load(rec + F_TILE)
    b = tile // (HKV * NSPLIT)
    g = (tile // NSPLIT) % HKV
    s = tile % NSPLIT
    q = base_t + gl.load(a) * 8
    kc = base_t + gl.load(a + 1) * 8
    vc = base_t + gl.load(a + 2) * 8
    pos = gl.load(base_i + gl.load(a + 3) * 4 + b, cache_modifier=".cg")  # the row this step writes
    o_part = base_f + gl.load(a + 4) * 4
    lse_part = base_f + gl.load(a + 5) * 4
    end = gl.minimum(gl.minimum(pos + 1, s * SPLIT + SPLIT), S)
    nk = gl.arange(0, BN, layout=gl.SliceLayout(1, S0))
    dk = gl.arange(0, HD, layout=gl.SliceLayout(0, S0))
    kv_off = (b * HKV + g).to(gl.int64) * (S * HD)
    n0 = s * SPLIT
    ptr = (n0 + nk)[:, None] * HD + dk[None, :]
    old = ((n0 + nk) < end) & ((n0 + nk) != pos)
    k_pre = gl.load(kc + kv_off + ptr, mask=old[:, None], other=0.0, cache_modifier=".cg")
    v_pre = gl.load(vc + kv_off + ptr, mask=old[:, None], other=0.0, cache_modifier=".cg")
    _wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
    cur = ((n0 + nk) == pos) & ((n0 + nk) < end)
    k_pre = gl.where(cur[:, None], gl.load(kc + kv_off + ptr, mask=cur[:, None], other=0.0, cache_modifier=".cg"),
                     k_pre)
    v_pre = gl.where(cur[:, None], gl.load(vc + kv_off + ptr, mask=cur[:, None], other=0.0, cache_modifier=".cg"),
                     v_pre)
    rq = gl.arange(0, RP, layout=gl.SliceLayout(1, S1))
    dq = gl.arange(0, HD, layout=gl.SliceLayout(0, S1))
    heads = g * R + rq
    qk_scale = SM_SCALE * 1.4426950408889634
    qv = gl.load(q + (b * HQ + heads)[:, None] * HD + dq[None, :], mask=(rq < R)[:, None], other=0.0,
                 cache_modifier=".cg").to(gl.float32) * qk_scale
    q3 = gl.expand_dims(qv, 1)
    nx = gl.arange(0, BN, layout=gl.SliceLayout(0, S2))
    m = gl.full([RP], float("-inf"), gl.float32, gl.SliceLayout(1, S2))
    l = gl.zeros([RP], gl.float32, gl.SliceLayout(1, S2))
    acc = gl.zeros([RP, HD], gl.float32, S1)
    k = k_pre.to(gl.float32)
    v = v_pre.to(gl.float32)
    for n0 in range(s * SPLIT, end, BN):
        if n0 > s * SPLIT:
            ptr = (n0 + nk)[:, None] * HD + dk[None, :]
            msk = ((n0 + nk) < end)[:, None]
            k = gl.load(kc + kv_off + ptr, mask=msk, other=0.0, cache_modifier=".cg").to(gl.float32)
            v = gl.load(vc + kv_off + ptr, mask=msk, other=0.0, cache_modifier=".cg").to(gl.float32)
        x = gl.sum(q3 * gl.expand_dims(k, 0), axis=2)
        x = gl.where(((n0 + nx) < end)[None, :], x, float("-inf"))
        m_new = gl.maximum(m, gl.max(x, axis=1))
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(x - m_new[:, None])
        l = l * alpha + gl.sum(p, axis=1)
        pv = gl.sum(gl.expand_dims(p, 2) * gl.expand_dims(v, 0), axis=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, S1))[:, None] + pv
        m = m_new
    nonempty = l > 0.0
    lsafe = gl.where(nonempty, l, 1.0)
    o = acc / gl.convert_layout(lsafe, gl.SliceLayout(1, S1))[:, None]
    lse = gl.where(nonempty, (m + gl.log2(lsafe)) * 0.6931471805599453, float("-inf"))
    slot = (b * HQ + heads) * NSPLIT + s
    gl.store(o_part + slot[:, None] * HD + dq[None, :], o, mask=(rq < R)[:, None])
    rl = gl.arange(0, RP, layout=gl.SliceLayout(1, S2))
    gl.store(lse_part + (b * HQ + g * R + rl) * NSPLIT + s, lse, mask=rl < R)


@gluon.jit
def _merge(rec, a, base_t, base_f, HQ: gl.constexpr, HD: gl.constexpr, NSPLIT: gl.constexpr,
           NSP2: gl.constexpr, CHM: gl.constexpr, LM: gl.constexpr):
    """attn[b, h] = sum_s exp(lse_s - LSE) O_s, LSE = log sum_s exp(lse_s) (ops/attention.py), tile b*Hq + h."""
    dt: gl.constexpr = base_t.dtype.element_ty
    row = gl.load(rec + F_TILE)
    o_part = base_f + gl.load(a) * 4
    lse_part = base_f + gl.load(a + 1) * 4
    out = base_t + gl.load(a + 2) * 8
    SL: gl.constexpr = gl.SliceLayout(1, LM)
    sp = gl.arange(0, NSP2, layout=SL)
    lse = gl.load(lse_part + row * NSPLIT + sp, mask=sp < NSPLIT, other=float("-inf"), cache_modifier=".cg")
    mx = gl.max(lse, axis=0)
    mx = gl.where(mx == float("-inf"), 0.0, mx)
    tot = gl.sum(gl.exp(lse - mx), axis=0)
    d = gl.arange(0, HD, layout=gl.SliceLayout(0, LM))
    acc = gl.zeros([HD], gl.float32, gl.SliceLayout(0, LM))
    for c in range(0, NSPLIT, CHM):
        idx = c + gl.arange(0, CHM, layout=SL)
        lc = gl.load(lse_part + row * NSPLIT + idx, mask=idx < NSPLIT, other=float("-inf"), cache_modifier=".cg")
        live = lc > float("-inf")
        oc = gl.load(o_part + (row * NSPLIT + idx)[:, None] * HD + d[None, :], mask=live[:, None], other=0.0,
                     cache_modifier=".cg")
        acc += gl.sum(oc * gl.exp(lc - mx)[:, None], axis=0)
    gl.store(out + row * HD + d, (acc / gl.where(tot > 0.0, tot, 1.0)).to(dt))


@gluon.jit
def _argmax(a, base_f, base_i, B: gl.constexpr, NT: gl.constexpr):
    """next_tokens[b] = pidx[b, t*], t* the smallest t maximising pmax[b, t] (= torch.argmax of the logits)."""
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    CT: gl.constexpr = 1024
    pmax = base_f + gl.load(a) * 4
    pidx = base_i + gl.load(a + 1) * 4
    out = base_i + gl.load(a + 2) * 4
    for b in range(B):
        best = float("-inf")
        bi = 0
        for t0 in range(0, NT, CT):
            ot = t0 + gl.arange(0, CT, layout=L1)
            v = gl.load(pmax + b * NT + ot, mask=ot < NT, other=float("-inf"), cache_modifier=".cg")
            cm = gl.max(v, axis=0)
            ci = gl.min(gl.where(v == cm, ot, 2147483647), axis=0)
            gi = gl.load(pidx + b * NT + ci, cache_modifier=".cg")
            if cm > best:
                best = cm
                bi = gi
        gl.store(out + b, bi)


# ----------------------------------------------------------------------------------------------- worker
@gluon.jit
def _consumer(ring, bars, xbuf, qrec, qoff, wl, argtab, ev_cnt, err, prof, base_t, base_f, base_i, wid, epoch,
              n_chunks, PROFILE: gl.constexpr, B: gl.constexpr, BP: gl.constexpr, KXB: gl.constexpr, RG: gl.constexpr,
              CK: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr, WAIT_NS: gl.constexpr,
              MAXA: gl.constexpr, V: gl.constexpr, D: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
              HD: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr,
              BN: gl.constexpr, NSP2: gl.constexpr, CHM: gl.constexpr, BD: gl.constexpr, NT: gl.constexpr,
              EPS: gl.constexpr, SM_SCALE: gl.constexpr):
    """4 warps: the worker's queue positions qoff[wid]:qoff[wid+1] in order (module doc)."""
    # GEMV results [BP, RG]: batch rows in registers, RG rows over the warps (as _group reduces them)
    AL: gl.constexpr = gl.SliceLayout(2, gl.BlockedLayout([1, 1, 1], [1, 1, 32], [1, 4, 1], [2, 1, 0]))
    TM: gl.constexpr = 32 if HD >= 128 else HD // 4
    LM: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TM, TM], [4, 1], [1, 0])
    q0 = gl.load(qoff + wid)
    q1 = gl.load(qoff + wid + 1)
    ok = 1
    i = 0
    for pos in range(q0, q1):
        rec = qrec + pos * REC
        kind = gl.load(rec + F_KIND)
        t = gl.load(rec + F_TASK)
        if PROFILE:
            gl.store(prof + t * 4, _now())
        a = argtab + gl.load(rec + F_OP) * MAXA
        if kind == K_ATTN:  # it loads the old KV rows before it waits
            _attn(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS, HQ, HKV, HD, S,
                  SPLIT, NSPLIT, RP, BN, SM_SCALE)
        else:
            _wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
        if kind == K_EMBED:
            _embed(rec, a, base_t, base_i, B, V, D, BD)
        elif kind == K_MERGE:
            _merge(rec, a, base_t, base_f, HQ, HD, NSPLIT, NSP2, CHM, LM)
        elif kind == K_ARGMAX:
            _argmax(a, base_f, base_i, B, NT)
        elif kind != K_ATTN:
            ok, i = _gemv(kind, rec, a, base_t, base_f, base_i, ring, bars, xbuf, ok, i, err, B, BP, KXB,
                          RG, CK, SLOTS, BARS, WAIT_NS, HQ, HKV, HD, S, NT, EPS, AL)
        barrier()  # every store of the task issued (and xbuf free for the next one)
        sig = gl.load(rec + F_SIGNAL)
        if sig >= 0:
            gl.atomic_add(ev_cnt + sig, 1, sem="release", scope="gpu")
        if PROFILE:
            gl.store(prof + t * 4 + 2, _now())
            gl.store(prof + t * 4 + 3, wid.to(gl.int64))
    if i != n_chunks:
        _record(err, 4, -1, i, n_chunks, 0)


@gluon.jit
def stream_megakernel(w_desc, qrec, qoff, wl, argtab, chunk_off, ev_cnt, epoch_ptr, done_ptr, err, prof,
                      base_t, base_f, base_i, PROFILE: gl.constexpr, B: gl.constexpr, BP: gl.constexpr, KXB: gl.constexpr,
                      RG: gl.constexpr, CK: gl.constexpr, SLOTS: gl.constexpr, BARS: gl.constexpr,
                      WAIT_NS: gl.constexpr, MAXA: gl.constexpr, V: gl.constexpr, D: gl.constexpr,
                      HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
                      SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr, BN: gl.constexpr,
                      NSP2: gl.constexpr, CHM: gl.constexpr, BD: gl.constexpr, NT: gl.constexpr,
                      EPS: gl.constexpr, SM_SCALE: gl.constexpr):
    """Grid (n_workers,), one CTA per SM, all co-resident. w_desc: TMA descriptor of the packed weight stream
    [chunks * 32, 256] (box [32, 256] = one 16 KB chunk); worker w streams chunks chunk_off[w]:chunk_off[w+1].
    qrec int32 [positions + 1, REC], qoff int32 [W + 1], wl int32 [n, 2] (event, expected), argtab int64
    [ops, MAXA] (buffer offsets in 16-byte units from base_t / base_f / base_i), ev_cnt int32 (monotonic
    counters), epoch / done int32 [1], err int32 [5], prof int64 [tasks, 4] (PROFILE: start, dependencies
    satisfied, end in ns of %globaltimer, worker). Shared memory: the ring (SLOTS x 16 KB), xbuf
    [B, KXB, CK] (the activation of a GEMV task), 2 SLOTS mbarriers at byte BARS."""
    wid = gl.program_id(0)
    n_workers = gl.num_programs(0)
    epoch = gl.load(epoch_ptr, volatile=True)
    ring = gl.allocate_shared_memory(w_desc.dtype, [SLOTS] + w_desc.block_type.shape, w_desc.layout)
    xbuf = gl.allocate_shared_memory(w_desc.dtype, [B, KXB, CK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    bars = gl.allocate_shared_memory(gl.int64, [2 * SLOTS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(SLOTS):
        mbarrier.init(bars.index(j), count=1)          # ready: the loader's expect + the TMA bytes
    for j in gl.static_range(SLOTS, 2 * SLOTS):
        mbarrier.init(bars.index(j), count=4)          # empty: one arrive per consumer warp
    c0 = gl.load(chunk_off + wid)
    n_chunks = gl.load(chunk_off + wid + 1) - c0
    gl.warp_specialize([
        (_consumer, (ring, bars, xbuf, qrec, qoff, wl, argtab, ev_cnt, err, prof, base_t, base_f, base_i, wid,
                     epoch, n_chunks, PROFILE, B, BP, KXB, RG, CK, SLOTS, BARS, WAIT_NS, MAXA, V, D, HQ, HKV, HD, S,
                     SPLIT, NSPLIT, RP, BN, NSP2, CHM, BD, NT, EPS, SM_SCALE)),
        (_loader, (w_desc, ring, bars, err, c0, n_chunks, SLOTS, BARS, WAIT_NS)),
    ], [1], [24])
    done = gl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if done == n_workers * epoch - 1:
        gl.atomic_add(epoch_ptr, 1, sem="release", scope="gpu")
