"""The streaming megakernel's GEMV epilogues and task operands (Gluon), shared by its CUDA-core body
(``exec.stream_fma.gemv_fma``) and its tensor-core body (``exec.stream_mma.gemv_mma``): one row group's (or
gate_up unit's) outputs from its fp32 sums [BP, RG] (residual add, SiLU(gate) * up, RoPE + q / KV-cache rows,
fp32 logits + per-task argmax partials), rounded where HF rounds (``rnd``, ``silu``: the ops' own functions)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.extra.cuda import libdevice

from onekernel.exec.stream_base import (F_K, F_N, F_NKB, F_NU, F_TASK, F_U0, K_LMHEAD, K_QKV, SS_ARG, SS_ARG_LM,
                                        SS_ARG_QKV)
from onekernel.ops.gemv_rows import rnd, silu


# ----------------------------------------------------------------------------------------------- epilogues
# One row group's (or gate_up unit's) outputs from its fp32 sums acc [BP, RG] (layout AL); shared by the
# CUDA-core (gemv_fma) and tensor-core (gemv_mma) bodies.
@gluon.jit
def gateup_out(ag, au, u, r, b64, bm, N, out, RG: gl.constexpr):
    dt: gl.constexpr = out.dtype.element_ty
    g = rnd(ag, dt)
    s = rnd(silu(g), dt)
    gl.store(out + b64 * N + (u * RG + r)[None, :], (s * rnd(au, dt)).to(dt), mask=bm & ((u * RG + r) < N)[None, :])


@gluon.jit
def rope_angles(pos, inv_freq, c, r, dt: gl.constexpr, RG: gl.constexpr):
    """cos / sin (rounded to dt, as HF's cached tables) of unit pair chunk c's rows at each row's position."""
    P: gl.constexpr = RG // 2
    ang = pos.to(gl.float32)[:, None] * gl.load(inv_freq + c * P + (r % P))[None, :]
    return rnd(libdevice.cos(ang), dt), rnd(libdevice.sin(ang), dt)


@gluon.jit
def rope_cos_sin(pos, f, dt: gl.constexpr):
    """rope_angles from the rows' inverse frequencies f [RG] (fp32) loaded earlier: positions pos [BP] (int32)
    -> cos, sin [BP, RG] (rope_angles keeps its own copy of these two lines: calling this from it changed the
    CUDA-core kernel's register allocation, SmolLM2 batch 3 spilling 28 B instead of 8)."""
    ang = pos.to(gl.float32)[:, None] * f[None, :]
    return rnd(libdevice.cos(ang), dt), rnd(libdevice.sin(ang), dt)


@gluon.jit
def qkv_out(acc, cs, sn, h, c, r, bm, b64, pos, q, kc, vc, HQ: gl.constexpr, HKV: gl.constexpr,
             HD: gl.constexpr, S: gl.constexpr, RG: gl.constexpr, BP: gl.constexpr, AL: gl.constexpr,
             ROPE: gl.constexpr = True):
    """Unit (head h, pair chunk c): tile row j < P is head row c*P + j, j >= P is head row HD/2 + c*P + (j - P)
    (P = RG / 2); RoPE for q and k heads (unless not ROPE: Qwen3's q/k RMSNorm comes first, qk_norm_head), then
    q / the KV cache row at pos."""
    dt: gl.constexpr = q.dtype.element_ty
    P: gl.constexpr = RG // 2
    y = rnd(acc, dt)
    hr = (r // P) * (HD // 2) + c * P + (r % P)
    if ROPE:
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


@gluon.jit
def qk_norm_head(h, q, kc, qn, kn, seq_lens, inv_freq, B: gl.constexpr, BP: gl.constexpr, HQ: gl.constexpr,
                 HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr, EPS: gl.constexpr):
    """Qwen3's per-head RMSNorm, then RoPE, of q or k head h (h < HQ + HKV) in place: its rows [B, HD] as the qkv
    epilogue stored them (``rnd(acc)``, no RoPE; read back after a CTA barrier, ``.cg``) in q [B, HQ, HD] or the KV
    cache row at each sequence's position. HF Qwen3RMSNorm then apply_rotary_pos_emb, rounded where HF rounds:
    ``rnd(rnd(y * rstd) * w)``, then ``rnd(y * cos) + rnd(rotate_half(y) * sin)`` (ops/qkv.py, the Triton body's
    math). Each row's sum of squares runs over one warp's lanes in a layout that does not depend on B (batch
    invariance)."""
    dt: gl.constexpr = q.dtype.element_ty
    L: gl.constexpr = gl.BlockedLayout([1, HD // 32], [1, 32], [4, 1], [1, 0])
    r = gl.arange(0, HD, layout=gl.SliceLayout(0, L))
    b = gl.arange(0, BP, layout=gl.SliceLayout(1, L))
    pos = gl.load(seq_lens + b, mask=b < B, other=0, cache_modifier=".cg")
    b64 = b.to(gl.int64)[:, None]
    m = ((b < B) & (pos >= 0) & (pos < S))[:, None]  # rows below B at a position inside the cache (the runtime's
    if h < HQ:                                         # only positions; a q row elsewhere would keep its raw values)
        p = q + b64 * (HQ * HD) + h * HD + r[None, :]
        g = gl.load(qn + r).to(gl.float32)
    else:
        p = kc + ((b64 * HKV + (h - HQ)) * S + pos.to(gl.int64)[:, None]) * HD + r[None, :]
        g = gl.load(kn + r).to(gl.float32)
    y = gl.load(p, mask=m, other=0.0, cache_modifier=".cg").to(gl.float32)
    rb = gl.rsqrt(gl.sum(y * y, axis=1) / HD + EPS)
    y = rnd(rnd(y * rb[:, None], dt) * g[None, :], dt)
    yp = gl.gather(y, gl.zeros([BP, HD], gl.int32, L) + ((r + HD // 2) % HD)[None, :], 1)
    rot = gl.where((r < HD // 2)[None, :], -yp, yp)
    ang = pos.to(gl.float32)[:, None] * gl.load(inv_freq + (r % (HD // 2)))[None, :]
    y = rnd(y * rnd(libdevice.cos(ang), dt), dt) + rnd(rot * rnd(libdevice.sin(ang), dt), dt)
    gl.store(p, y.to(dt), mask=m)


@gluon.jit
def lm_out(acc, u, r, b64, bm, N, logits, best, barg, dt: gl.constexpr, RG: gl.constexpr):
    """fp32 logits of unit u's rows (rounded to dt as HF's bf16 lm_head output), and the running per-row max /
    smallest argmax."""
    lg = rnd(acc, dt)
    rows = u * RG + r
    gl.store(logits + b64 * N + rows[None, :], lg, mask=bm & (rows < N)[None, :])  # V % RG: padding rows
    v = gl.where((rows < N)[None, :], lg, float("-inf"))
    gm = gl.max(v, axis=1)
    gi = gl.min(gl.where(v == gm[:, None], rows[None, :], 2147483647), axis=1)
    upd = gm > best
    return gl.where(upd, gm, best), gl.where(upd, gi, barg)


@gluon.jit
def gemv_task(rec, a, base_t, ALIGN8: gl.constexpr):
    """A GEMV task's record fields and operands: (task, first unit, units, K, k-chunks, N, x, norm weight).
    ALIGN8 (the tensor-core body): K is known to be a multiple of 8 (stream_support.unsupported), so the activation
    loads masked by k < K are 16-byte vectors."""
    t = gl.load(rec + F_TASK)
    u0 = gl.load(rec + F_U0)
    nu = gl.load(rec + F_NU)
    K = gl.load(rec + F_K)
    if ALIGN8:
        K = gl.multiple_of(K, 8)
    nkb = gl.load(rec + F_NKB)
    N = gl.load(rec + F_N)
    return t, u0, nu, K, nkb, N, base_t + gl.load(a) * 8, base_t + gl.load(a + 1) * 8


@gluon.jit
def qkv_buffers(a, base_t, base_f, base_i, bidx, B: gl.constexpr, live=True):
    """A qkv_rope task's outputs and RoPE inputs: (q, k cache, v cache, each row's position [BP], inv_freq);
    the positions are loaded only where ``live`` (a caller that has not branched on the task's kind yet)."""
    return (base_t + gl.load(a + 2) * 8, base_t + gl.load(a + 3) * 8, base_t + gl.load(a + 4) * 8,
            gl.load(base_i + gl.load(a + 5) * 4 + bidx, mask=(bidx < B) & live, other=0, cache_modifier=".cg"),
            base_f + gl.load(a + 6) * 4)


@gluon.jit
def ss_buffer(kind, a, base_f):
    """A GEMV op's RMSNorm partials buffer fp32 [B, NSS] (argument slot stream_base.SS_ARG* of its kind)."""
    return base_f + gl.load(a + gl.where(kind == K_QKV, SS_ARG_QKV, gl.where(kind == K_LMHEAD, SS_ARG_LM, SS_ARG))) * 4
