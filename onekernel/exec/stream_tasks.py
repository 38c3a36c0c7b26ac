"""The streaming megakernel's task bodies that read no streamed weights: the embedding gather, split-KV
attention partials (loading the old KV rows before they wait), the log-sum-exp merge, the argmax over the
LM head's per-task partials and (tensor parallel) the all-reduce of the ranks' partial rows. Math and tiles as
ops/embed.py, ops/attention.py, ops/lm_head.py and ops/allreduce.py.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.exec.stream_base import F_NU, F_RES, F_TILE, F_U0, SUBVIEW_REINTERPRET, barrier, now, wait_deps
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
def _tile_coords(tile, HKV: gl.constexpr, NSPLIT: gl.constexpr):
    """(b, g, s) of attention tile (b * HKV + g) * NSPLIT + s."""
    return tile // (HKV * NSPLIT), (tile // NSPLIT) % HKV, tile % NSPLIT


@gluon.jit
def _pick(vec, idx, j):
    """vec[j] of a small int32 vector (registers only)."""
    return gl.sum(gl.where(idx == j, vec, 0), axis=0)


@gluon.jit
def attn_task(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, scr, PROFILE: gl.constexpr,
          WAIT_NS: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
          SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr, BN: gl.constexpr, SM_SCALE: gl.constexpr,
          NTA: gl.constexpr, FOLD: gl.constexpr, NSP2: gl.constexpr, NGP: gl.constexpr, sub=None):
    """Split-KV partials of the run of tiles [u0, u0 + nu) (record F_U0 / F_NU; at most NTA), tile (b, kv head g,
    split s) for the R = Hq/Hkv query heads of g (ops/attention.py: O_s = sum_j exp(x_j - lse_s) v_j,
    lse_s = log sum_j exp(x_j), x_j = scale q.k_j; empty split: 0, -inf).

    Warp w of the 4 takes the quarter [w*SPLIT/4, (w+1)*SPLIT/4) of every tile's positions, in BN-blocks, for
    all R query heads (each K/V row is read by one warp, once) and keeps its own online softmax (m, l, acc);
    at a tile's end the 4 warps' states meet in shared memory ``scr`` (fp32 [>= 8, RP, HD], free between GEMV
    tasks) and are merged in a fixed order (w0..w3), as flash-decoding merges splits (Dao et al. 2023).
    One software-pipelined loop over the run's (tile, block) pairs: block i + 1's K/V (and, at a tile's first
    block, its q) are loaded while block i computes. The first block is loaded before the dependency wait
    (every position but the one this step writes, seq_lens[b], was written by earlier steps) and that row is
    patched after it; blocks loaded after the wait need no patch. fp32 CUDA-core products over [4, RP, BN, HD],
    online softmax in exp2: per tile the same operations in the same order as one tile alone, so a tile's bits
    do not depend on its run or the batch.

    FOLD (stream_plan.make_plan): after the run, its tiles arrive on their (b, g) groups' counters and the last
    of a group's NSPLIT tiles merges the group's R rows (``_arrive_and_merge``): no merge tasks.

    PROFILE: ``sub`` (int64 [4], the task's row of the runner's ``prof_sub``) = ns from the dependencies'
    satisfaction to the loop (the patch and q loads), ns in the block loop without the warp merges, ns in the warp
    merges (_attn_merge_warps), ns arriving and merging (FOLD) + blocks << 32."""
    R: gl.constexpr = HQ // HKV
    SW: gl.constexpr = SPLIT // 4           # positions per warp and tile
    NB: gl.constexpr = SW // BN             # BN-blocks per warp and tile
    TD: gl.constexpr = 32 if HD >= 256 else HD // 8
    L4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 1, 32 // TD, TD], [4, 1, 1, 1], [3, 2, 1, 0])
    KL: gl.constexpr = gl.SliceLayout(1, L4)   # [4, BN, HD]: K / V blocks
    QL: gl.constexpr = gl.SliceLayout(2, L4)   # [4, RP, HD]: q, acc
    XL: gl.constexpr = gl.SliceLayout(3, L4)   # [4, RP, BN]: scores
    V1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    u0 = gl.load(rec + F_U0)
    nu = gl.load(rec + F_NU)
    q = base_t + gl.load(a) * 8
    kc = base_t + gl.load(a + 1) * 8
    vc = base_t + gl.load(a + 2) * 8
    seq = base_i + gl.load(a + 3) * 4
    o_part = base_f + gl.load(a + 4) * 4
    lse_part = base_f + gl.load(a + 5) * 4
    # the position each tile's sequence writes this step (seq_lens is the step's input: read before the wait)
    jv = gl.arange(0, NTA, layout=V1)
    posv = gl.load(seq + (u0 + jv) // (HKV * NSPLIT), mask=jv < nu, other=0, cache_modifier=".cg")
    wk = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, KL)))[:, None, None] * SW
    nk = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, KL)))[None, :, None]
    dk = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, KL)))[None, None, :]
    wx = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, XL)))[:, None, None] * SW
    nx = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(1, XL)))[None, None, :]
    # q is the same for every warp: a zero warp index gives its loads the [4, RP, HD] shape of QL
    wq = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, QL)))[:, None, None] * 0
    rq = gl.arange(0, RP, layout=gl.SliceLayout(0, gl.SliceLayout(2, QL)))[None, :, None]
    dq = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, QL)))[None, None, :]
    cw = (kc, vc, q, posv, jv, wk, nk, dk, wx, nx, wq, rq, dq)
    if nu >= 2:
        # two streams of the run's tiles, [u0, u0 + hA) and [u0 + hA, u0 + nu), one block of each per iteration:
        # their chains are independent, so each hides the other's latency (one warp per scheduler). A tile's
        # operations are the single stream's, so its bits do not depend on the stream or the run.
        hA = (nu + 1) // 2
        ta = hA * NB
        tb = (nu - hA) * NB
        fa = _attn_first(u0, 0, cw, HKV, HD, S, SPLIT, NSPLIT)
        fb = _attn_first(u0, hA, cw, HKV, HD, S, SPLIT, NSPLIT)
        wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
        if PROFILE:
            t_r = now()
        sa = _attn_start(u0, 0, fa, cw, HQ, HKV, HD, S, SPLIT, NSPLIT, RP)
        sb = _attn_start(u0, hA, fb, cw, HQ, HKV, HD, S, SPLIT, NSPLIT, RP)
        if PROFILE:
            t_l = now()
            gl.store(sub, t_l - t_r)
            t_mw = t_l * 0
        for i in range(ta):
            sa = _attn_block(u0, 0, i, ta, sa, cw, SM_SCALE, HQ, HKV, HD, S, SPLIT, NSPLIT, BN, NB)
            sb = _attn_block(u0, hA, i, tb, sb, cw, SM_SCALE, HQ, HKV, HD, S, SPLIT, NSPLIT, BN, NB)
            if i % NB == NB - 1:  # both streams' tiles end: merge each tile's 4 warp states, store its partial
                if PROFILE:
                    t_w = now()
                b, g, s = _tile_coords(u0 + i // NB, HKV, NSPLIT)
                _attn_merge_warps(scr, sa[0], sa[1], sa[2], o_part, lse_part, b * HQ + g * R, s, R, RP, HD, NSPLIT)
                if i < tb:
                    b, g, s = _tile_coords(u0 + hA + i // NB, HKV, NSPLIT)
                    _attn_merge_warps(scr, sb[0], sb[1], sb[2], o_part, lse_part, b * HQ + g * R, s, R, RP, HD,
                                      NSPLIT)
                if PROFILE:
                    t_mw = t_mw + (now() - t_w)
    else:
        total = nu * NB
        fa = _attn_first(u0, 0, cw, HKV, HD, S, SPLIT, NSPLIT)
        wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
        if PROFILE:
            t_r = now()
        sa = _attn_start(u0, 0, fa, cw, HQ, HKV, HD, S, SPLIT, NSPLIT, RP)
        if PROFILE:
            t_l = now()
            gl.store(sub, t_l - t_r)
            t_mw = t_l * 0
        for i in range(total):
            sa = _attn_block(u0, 0, i, total, sa, cw, SM_SCALE, HQ, HKV, HD, S, SPLIT, NSPLIT, BN, NB)
            if i % NB == NB - 1:  # the tile's last block: merge the 4 warps' states, store the partial
                if PROFILE:
                    t_w = now()
                b, g, s = _tile_coords(u0 + i // NB, HKV, NSPLIT)
                _attn_merge_warps(scr, sa[0], sa[1], sa[2], o_part, lse_part, b * HQ + g * R, s, R, RP, HD, NSPLIT)
                if PROFILE:
                    t_mw = t_mw + (now() - t_w)
    if PROFILE:
        t_a = now()
        gl.store(sub + 1, t_a - t_l - t_mw)
        gl.store(sub + 2, t_mw)
    if FOLD:
        _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, R, HD, NSPLIT, NSP2, RP, NGP)
    if PROFILE:
        gl.store(sub + 3, (now() - t_a) + ((nu * NB).to(gl.int64) << 32))


@gluon.jit
def _attn_first(u0, jo, cw, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
                NSPLIT: gl.constexpr):
    """Before the dependency wait: block 0 of tile u0 + jo, its old rows only (K, V [4, BN, HD]; the row
    seq_lens[b] is written by this step's qkv task: 0 here, patched by _attn_start)."""
    kc, vc, q, posv, jv, wk, nk, dk, wx, nx, wq, rq, dq = cw
    b, g, s = _tile_coords(u0 + jo, HKV, NSPLIT)
    pos = _pick(posv, jv, jo)
    end = gl.minimum(gl.minimum(pos + 1, s * SPLIT + SPLIT), S)
    kv_off = (b * HKV + g).to(gl.int64) * (S * HD)
    rows = s * SPLIT + wk + nk
    old = (rows < end) & (rows != pos)
    return (gl.load(kc + kv_off + rows * HD + dk, mask=old, other=0.0, cache_modifier=".cg"),
            gl.load(vc + kv_off + rows * HD + dk, mask=old, other=0.0, cache_modifier=".cg"))


@gluon.jit
def _attn_start(u0, jo, first, cw, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
                SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr):
    """After the wait: the stream's state before its first block (m, l, acc, K, V of block 0 with the row this
    step wrote patched in, q of tile u0 + jo twice: current and prefetched)."""
    R: gl.constexpr = HQ // HKV
    kc, vc, q, posv, jv, wk, nk, dk, wx, nx, wq, rq, dq = cw
    k_c, v_c = first
    b, g, s = _tile_coords(u0 + jo, HKV, NSPLIT)
    pos = _pick(posv, jv, jo)
    end = gl.minimum(gl.minimum(pos + 1, s * SPLIT + SPLIT), S)
    kv_off = (b * HKV + g).to(gl.int64) * (S * HD)
    rows = s * SPLIT + wk + nk
    ptr = rows * HD + dk
    cur = (rows == pos) & (rows < end)
    k_c = gl.where(cur, gl.load(kc + kv_off + ptr, mask=cur, other=0.0, cache_modifier=".cg"), k_c)
    v_c = gl.where(cur, gl.load(vc + kv_off + ptr, mask=cur, other=0.0, cache_modifier=".cg"), v_c)
    q_c = gl.load(q + (b * HQ + g * R + rq + wq) * HD + dq, mask=rq < R, other=0.0, cache_modifier=".cg")
    QL: gl.constexpr = q_c.type.layout
    ML: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, QL.parent))
    m = gl.full([4, RP], float("-inf"), gl.float32, ML)
    l = gl.zeros([4, RP], gl.float32, ML)
    acc = gl.zeros([4, RP, HD], gl.float32, QL)
    return m, l, acc, k_c, v_c, q_c, q_c


@gluon.jit
def _attn_block(u0, jo, i, total, st, cw, SM_SCALE: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
                HD: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, BN: gl.constexpr,
                NB: gl.constexpr):
    """Block i of the stream of tiles u0 + jo, u0 + jo + 1, ... (``total`` blocks; i >= total: masked, no
    loads): warp w's BN positions n0 + w*SW + [0, BN) of the tile, online softmax in exp2 (fp32 CUDA-core
    products over [4, RP, BN, HD]); block i + 1's K/V (and, at a tile's last block, the next tile's q) are loaded
    while it computes. A new tile (its block 0) starts from q_n and a fresh state."""
    R: gl.constexpr = HQ // HKV
    kc, vc, q, posv, jv, wk, nk, dk, wx, nx, wq, rq, dq = cw
    m, l, acc, k_c, v_c, q_c, q_n = st
    QL: gl.constexpr = q_c.type.layout
    j = i // NB
    blk = i % NB
    b, g, s = _tile_coords(u0 + jo + j, HKV, NSPLIT)
    end = gl.minimum(gl.minimum(_pick(posv, jv, jo + j) + 1, s * SPLIT + SPLIT), S)
    n0 = s * SPLIT + blk * BN
    # a new tile (blk == 0): its q (prefetched with the previous block), fresh softmax state. Selects, not an
    # `if`: Triton 3.6 drops a loop-carried value used only inside an scf.if of the next iteration (q_n was
    # replaced by its initial value: every tile of a run took the first tile's q; 7e172aa, run 9 call 52)
    first = blk == 0
    q_c = gl.where(first & (i > 0), q_n, q_c)
    m = gl.where(first, float("-inf"), m)
    l = gl.where(first, 0.0, l)
    acc = gl.where(first, 0.0, acc)
    # prefetch block i + 1 (the next block of this tile, or the first of the next tile): rows < its end only
    k_n, v_n = _kv_block(kc, vc, u0 + jo, jo, i + 1, total, posv, jv, wk, nk, dk, HKV, HD, S, SPLIT, NSPLIT, BN, NB)
    b1, g1, s1 = _tile_coords(u0 + jo + (i + 1) // NB, HKV, NSPLIT)
    nq = ((i + 1) % NB == 0) & (i + 1 < total)
    q_n = gl.load(q + (b1 * HQ + g1 * R + rq + wq) * HD + dq, mask=(rq < R) & nq, other=0.0,
                  cache_modifier=".cg")
    # block i: warp w's BN positions n0 + w*SW + [0, BN)
    q4 = gl.expand_dims(q_c.to(gl.float32) * (SM_SCALE * 1.4426950408889634), 2)
    x = gl.sum(q4 * gl.expand_dims(k_c.to(gl.float32), 1), axis=3)
    x = gl.where((n0 + wx + nx) < end, x, float("-inf"))
    m_new = gl.maximum(m, gl.max(x, axis=2))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)   # a block with no live row yet: no NaN
    alpha = gl.exp2(m - m_use)
    p = gl.exp2(x - m_use[:, :, None])
    l = l * alpha + gl.sum(p, axis=2)
    pv = gl.sum(gl.expand_dims(p, 3) * gl.expand_dims(v_c.to(gl.float32), 1), axis=2)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(2, QL))[:, :, None] + pv
    return m_new, l, acc, k_n, v_n, q_c, q_n


@gluon.jit
def _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, R: gl.constexpr, HD: gl.constexpr,
                      NSPLIT: gl.constexpr, NSP2: gl.constexpr, RP: gl.constexpr, NGP: gl.constexpr):
    """The run's tiles [u0, u0 + nu) arrive on their groups' counters (argtab role 7 "arrive", int32 [B * Hkv]; group
    b * Hkv + g, at most NGP groups per run): one ``atom.add.acq_rel.gpu`` per group adds the run's tiles of it, all
    groups at once; the run that brings a group to NSPLIT resets its counter to 0 for the next step and merges the
    group's R rows into out (role 6) with ``_merge_group`` (the splits' partials: stored by other workers before
    their releases, read after this acquire and a CTA barrier, from L2). The others only arrive."""
    V1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    out = base_t + gl.load(a + 6) * 8
    arrive = base_i + gl.load(a + 7) * 4
    barrier()  # every thread's partial stores issued before the release
    j = gl.arange(0, 128, layout=V1)  # one element per thread: no replicated atomics
    g0 = u0 // NSPLIT
    grp = g0 + j
    cnt = gl.minimum(u0 + nu, grp * NSPLIT + NSPLIT) - gl.maximum(u0, grp * NSPLIT)
    live = (j < NGP) & (cnt > 0)
    old = gl.atomic_add(arrive + grp, cnt, mask=live, sem="acq_rel", scope="gpu")
    last = live & (old + cnt == NSPLIT)
    gl.store(arrive + grp, gl.zeros_like(old), mask=last)
    bits = gl.sum(gl.where(last, 1 << (j & 31), 0), axis=0)  # a CTA reduction: every thread after the acquire
    for jg in range(NGP):
        if (bits >> jg) & 1:
            _merge_group(o_part, lse_part, out, (g0 + jg) * R, R, HD, NSPLIT, NSP2, RP)


@gluon.jit
def _merge_group(o_part, lse_part, out, row0, R: gl.constexpr, HD: gl.constexpr, NSPLIT: gl.constexpr,
                 NSP2: gl.constexpr, RP: gl.constexpr):
    """out[row] = sum_s exp(lse_s - LSE) O_s for the R rows row0.. (ops/attention.py's merge; rows b*Hq + h of
    o_part fp32 [B*Hq, NSPLIT, hd], lse_part fp32 [B*Hq, NSPLIT]) with all of them in flight at once: splits in
    chunks of CS (RP * CS * hd <= 4096 values: 32 per thread), one L2 round trip per chunk."""
    dt: gl.constexpr = out.dtype.element_ty
    TD: gl.constexpr = 32 if HD >= 128 else HD // 4
    CS: gl.constexpr = NSP2 if RP * NSP2 * HD <= 4096 else max(1, 4096 // (RP * HD))
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32 // TD, TD], [4, 1, 1], [2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    r2 = gl.arange(0, RP, layout=gl.SliceLayout(1, L2))[:, None]
    s2 = gl.arange(0, NSP2, layout=gl.SliceLayout(0, L2))[None, :]
    lse = gl.load(lse_part + (row0 + r2) * NSPLIT + s2, mask=(r2 < R) & (s2 < NSPLIT), other=float("-inf"),
                  cache_modifier=".cg")
    mx = gl.max(lse, axis=1)
    mx = gl.where(mx == float("-inf"), 0.0, mx)
    tot = gl.sum(gl.exp(lse - mx[:, None]), axis=1)
    r3 = gl.arange(0, RP, layout=gl.SliceLayout(1, L2))[:, None, None]
    c3 = gl.arange(0, CS, layout=gl.SliceLayout(0, L2))[None, :, None]
    d3 = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    c2 = gl.arange(0, CS, layout=gl.SliceLayout(0, L2))[None, :]
    acc = gl.zeros([RP, HD], gl.float32, gl.SliceLayout(1, L3))
    for c in range(0, NSP2, CS):
        lc = gl.load(lse_part + (row0 + r2) * NSPLIT + c + c2, mask=(r2 < R) & (c + c2 < NSPLIT),
                     other=float("-inf"), cache_modifier=".cg")
        oc = gl.load(o_part + ((row0 + r3) * NSPLIT + c + c3) * HD + d3, mask=(r3 < R) & (c + c3 < NSPLIT),
                     other=0.0, cache_modifier=".cg")
        acc += gl.sum(oc * gl.exp(lc - mx[:, None])[:, :, None], axis=1)
    tsafe = gl.where(tot > 0.0, tot, 1.0)
    o = acc / gl.convert_layout(tsafe, gl.SliceLayout(1, gl.SliceLayout(1, L3)))[:, None]
    ro = gl.arange(0, RP, layout=gl.SliceLayout(1, gl.SliceLayout(1, L3)))[:, None]
    do = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, :]
    gl.store(out + (row0 + ro) * HD + do, o.to(dt), mask=ro < R)


@gluon.jit
def _kv_block(kc, vc, u0, jo, idx, total, posv, jv, wk, nk, dk, HKV: gl.constexpr, HD: gl.constexpr,
              S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, BN: gl.constexpr, NB: gl.constexpr):
    """K, V [4, BN, HD] of block ``idx`` of the stream of tiles u0, u0 + 1, ... (posv[jo + j]: tile u0 + j's
    position; warp w: its BN positions of the block), rows past the tile's end (or idx >= total) 0."""
    j = idx // NB
    b, g, s = _tile_coords(u0 + j, HKV, NSPLIT)
    end = gl.minimum(gl.minimum(_pick(posv, jv, jo + j) + 1, s * SPLIT + SPLIT), S)
    rows = s * SPLIT + (idx % NB) * BN + wk + nk
    live = (rows < end) & (idx < total)
    off = (b * HKV + g).to(gl.int64) * (S * HD)
    return (gl.load(kc + off + rows * HD + dk, mask=live, other=0.0, cache_modifier=".cg"),
            gl.load(vc + off + rows * HD + dk, mask=live, other=0.0, cache_modifier=".cg"))


@gluon.jit
def _merge_views(scr, RP: gl.constexpr, HD: gl.constexpr):
    """(acc [4, RP, HD], m, l) views of attention's scratch. Triton 3.6 (SUBVIEW_REINTERPRET; the views run 12
    measured): scr is fp32 [8*RP, HD], acc its first 4*RP rows, m and l [4, RP] in rows 4*RP and 4*RP + 1 (4*RP <=
    HD). Triton 3.8: scr is fp32 [rows >= 8, RP, HD], acc its rows 0..3, m and l [4, RP, 1] in columns 0 and 1 of
    rows 4..7."""
    if SUBVIEW_REINTERPRET:
        FL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        FL2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        return (scr.slice(0, 4 * RP)._reinterpret(gl.float32, [4, RP, HD], FL),
                scr.slice(4 * RP, 1)._reinterpret(gl.float32, [4, RP], FL2),
                scr.slice(4 * RP + 1, 1)._reinterpret(gl.float32, [4, RP], FL2))
    else:
        return scr.slice(0, 4), scr.slice(4, 4).slice(0, 1, dim=2), scr.slice(4, 4).slice(1, 1, dim=2)


@gluon.jit
def _attn_merge_warps(scr, m, l, acc, o_part, lse_part, row0, s, R: gl.constexpr, RP: gl.constexpr,
                      HD: gl.constexpr, NSPLIT: gl.constexpr):
    """The tile's partial from its 4 warps' online-softmax states (m, l [4, RP]; acc [4, RP, HD], log2 units):
    M = max_w m_w, L = sum_w l_w 2^(m_w - M), O = sum_w acc_w 2^(m_w - M) / L, lse = (M + log2 L) ln 2, summed
    over w in order 0..3 inside each thread (``scr``: shared memory, _merge_views)."""
    P3: gl.constexpr = gl.BlockedLayout([4, 1, 1], [1, 1, 32], [1, 4, 1], [2, 1, 0])
    P2: gl.constexpr = gl.SliceLayout(2, P3)
    s_acc, s_m, s_l = _merge_views(scr, RP, HD)
    barrier()  # the previous tile's reads of scr are done
    s_acc.store(acc)
    if SUBVIEW_REINTERPRET:
        s_m.store(m)
        s_l.store(l)
    else:
        s_m.store(gl.expand_dims(m, 2))
        s_l.store(gl.expand_dims(l, 2))
    barrier()
    if SUBVIEW_REINTERPRET:
        m4 = s_m.load(P2)
        l4 = s_l.load(P2)
    else:
        m4 = gl.max(s_m.load(P3), axis=2)  # [4, RP, 1] -> [4, RP]: one element per (w, r), the same value
        l4 = gl.sum(s_l.load(P3), axis=2)
    a4 = s_acc.load(P3)
    mx = gl.max(m4, axis=0)
    mx = gl.where(mx == float("-inf"), 0.0, mx)
    wt = gl.exp2(m4 - mx[None, :])
    tot = gl.sum(l4 * wt, axis=0)
    o = gl.sum(a4 * wt[:, :, None], axis=0)
    nonempty = tot > 0.0
    tsafe = gl.where(nonempty, tot, 1.0)
    o = o / gl.convert_layout(tsafe, gl.SliceLayout(1, gl.SliceLayout(0, P3)))[:, None]
    lse = gl.where(nonempty, (mx + gl.log2(tsafe)) * 0.6931471805599453, float("-inf"))
    ro = gl.arange(0, RP, layout=gl.SliceLayout(1, gl.SliceLayout(0, P3)))
    do = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(0, P3)))
    rl = gl.arange(0, RP, layout=gl.SliceLayout(0, P2))
    gl.store(o_part + ((row0 + ro) * NSPLIT + s)[:, None] * HD + do[None, :], o, mask=(ro < R)[:, None])
    gl.store(lse_part + (row0 + rl) * NSPLIT + s, lse, mask=rl < R)


@gluon.jit
def merge_task(rec, a, base_t, base_f, HQ: gl.constexpr, HD: gl.constexpr, NSPLIT: gl.constexpr,
           NSP2: gl.constexpr, CHM: gl.constexpr, LM: gl.constexpr):
    """attn[b, h] = sum_s exp(lse_s - LSE) O_s, LSE = log sum_s exp(lse_s) (ops/attention.py), for the run of
    rows b*Hq + h in [u0, u0 + nu) (record F_U0 / F_NU)."""
    dt: gl.constexpr = base_t.dtype.element_ty
    u0 = gl.load(rec + F_U0)
    nu = gl.load(rec + F_NU)
    o_part = base_f + gl.load(a) * 4
    lse_part = base_f + gl.load(a + 1) * 4
    out = base_t + gl.load(a + 2) * 8
    SL: gl.constexpr = gl.SliceLayout(1, LM)
    sp = gl.arange(0, NSP2, layout=SL)
    d = gl.arange(0, HD, layout=gl.SliceLayout(0, LM))
    for row in range(u0, u0 + nu):
        lse = gl.load(lse_part + row * NSPLIT + sp, mask=sp < NSPLIT, other=float("-inf"), cache_modifier=".cg")
        mx = gl.max(lse, axis=0)
        mx = gl.where(mx == float("-inf"), 0.0, mx)
        tot = gl.sum(gl.exp(lse - mx), axis=0)
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
