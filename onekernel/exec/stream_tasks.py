"""The streaming megakernel's task bodies that read no streamed weights: the embedding gather, split-KV
attention partials (loading the old KV rows before they wait), the log-sum-exp merge, the argmax over the
LM head's per-task partials and (tensor parallel) the all-reduce of the ranks' partial rows. Math and tiles as
ops/embed.py, ops/attention.py, ops/lm_head.py and ops/allreduce.py.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.exec.stream_base import F_RES, F_TILE, wait_deps
from onekernel.ops.gemv_rows import rnd

@gluon.jit
def embed_task(rec, a, base_t, base_i, B: gl.constexpr, V: gl.constexpr, D: gl.constexpr, BD: gl.constexpr):
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
def attn_task(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, PROFILE: gl.constexpr,
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
    wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
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
def merge_task(rec, a, base_t, base_f, HQ: gl.constexpr, HD: gl.constexpr, NSPLIT: gl.constexpr,
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
def argmax_task(a, base_f, base_i, B: gl.constexpr, NT: gl.constexpr):
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




@gluon.jit
def _add_rank(acc, a, base_t, offs, m, NR: gl.constexpr, J: gl.constexpr):
    if J < NR:
        p = base_t + gl.load(a + J) * 8
        acc += gl.load(p + offs, mask=m, other=0.0, volatile=True).to(gl.float32)
    return acc


@gluon.jit
def allreduce_task(rec, a, base_t, B: gl.constexpr, D: gl.constexpr, NR: gl.constexpr, ARD: gl.constexpr):
    """out[b, cols] = round(res[b, cols] + p_0[b, cols] + ... + p_{NR-1}[b, cols]) for the tile's ARD columns of
    every batch row: ops/allreduce.py's ``allreduce_body`` operation for operation (fp32 from zero, the residual
    first when the record's F_RES says so, then the ranks in order 0..NR-1, one RNE rounding), so every rank and
    the Triton megakernel get the same bits. argtab roles: in0..in7 (this rank's own partial and the peers'
    copies, in rank order), res, out. The partials are read with ``ld.volatile.global`` after the remote waits'
    ``ld.acquire.sys`` (stream_base.wait_remote), as ops/allreduce.py's ``.cv`` loads compile in Triton (Gluon
    3.6 drops ``cache_modifier=".cv"``: a plain ``ld.global``, seen in the sm_90a PTX; ``volatile=True`` gives
    the volatile load); the residual with ``.cg``."""
    dt: gl.constexpr = base_t.dtype.element_ty
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    res = base_t + gl.load(a + 8) * 8
    out = base_t + gl.load(a + 9) * 8
    add_res = gl.load(rec + F_RES)
    cols = gl.load(rec + F_TILE) * ARD + gl.arange(0, ARD, layout=L1)
    m = cols < D
    for b in range(B):
        offs = b * D + cols
        acc = gl.zeros([ARD], gl.float32, L1)
        if add_res != 0:
            acc += gl.load(res + offs, mask=m, other=0.0, cache_modifier=".cg").to(gl.float32)
        acc = _add_rank(acc, a, base_t, offs, m, NR, 0)  # rank order 0..NR-1: the same sum on every rank
        acc = _add_rank(acc, a, base_t, offs, m, NR, 1)
        acc = _add_rank(acc, a, base_t, offs, m, NR, 2)
        acc = _add_rank(acc, a, base_t, offs, m, NR, 3)
        acc = _add_rank(acc, a, base_t, offs, m, NR, 4)
        acc = _add_rank(acc, a, base_t, offs, m, NR, 5)
        acc = _add_rank(acc, a, base_t, offs, m, NR, 6)
        acc = _add_rank(acc, a, base_t, offs, m, NR, 7)
        gl.store(out + offs, rnd(acc, dt).to(dt), mask=m)
