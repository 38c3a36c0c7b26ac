"""The streaming megakernel's task bodies that read no streamed weights: the embedding gather, split-KV
attention partials (loading the old KV rows before they wait), the log-sum-exp merge, the argmax over the
LM head's per-task partials and (tensor parallel) the all-reduce of the ranks' partial rows. Math and tiles as
ops/embed.py, ops/attention.py, ops/lm_head.py and ops/allreduce.py.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from onekernel.exec.stream_base import F_NU, F_RES, F_TILE, F_U0, SUBVIEW_REINTERPRET, barrier, view, wait_deps
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
def _tile_coords(tile, HKV: gl.constexpr, NSPLIT: gl.constexpr, PERM: gl.constexpr = False):
    """(b, g, s) of the attention tile at position (b * HKV + g) * NSPLIT + p of the plan's order: s = p, or with
    PERM the bit reversal of p (stream_fold.split_order)."""
    s = tile % NSPLIT
    if PERM:
        s = _bitrev(s, NSPLIT)
    return tile // (HKV * NSPLIT), (tile // NSPLIT) % HKV, s


@gluon.constexpr_function
def _log2(n):
    return int(n).bit_length() - 1


@gluon.jit
def _bitrev(x, N: gl.constexpr):
    """x's low log2(N) bits reversed (N a power of two): stream_fold.split_order."""
    LOG: gl.constexpr = _log2(N)
    r = x * 0
    for k in gl.static_range(LOG):
        r = r | (((x >> k) & 1) << (LOG - 1 - k))
    return r


@gluon.jit
def _pick(vec, idx, j):
    """vec[j] of a small int32 vector (registers only)."""
    return gl.sum(gl.where(idx == j, vec, 0), axis=0)


@gluon.jit
def attn_task(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, scr, PROFILE: gl.constexpr,
          WAIT_NS: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
          SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr, BN: gl.constexpr, SM_SCALE: gl.constexpr,
          NTA: gl.constexpr, FOLD: gl.constexpr, NSP2: gl.constexpr, NGP: gl.constexpr, xbuf=None, rbuf=None,
          KVS: gl.constexpr = 0, B: gl.constexpr = 1, SKIP: gl.constexpr = False, PERM: gl.constexpr = False):
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

    KVS > 0 (stream_smem.attn_kv_stages: the MMA path's two activation buffers xbuf and rbuf are free during
    attention): blocks 1.. come through a ring of KVS K/V blocks in shared memory (even blocks in xbuf, odd in
    rbuf), filled by cp.async KVS - 1 blocks ahead, so KVS - 1 blocks' loads are in flight while one computes
    instead of one. Each thread reads back only the elements its own copies wrote (the same distributed layout):
    ``cp.async.wait_group`` orders them, no CTA barrier. A slot is refilled only after the block read from it
    was consumed. At the end xbuf's rows >= B are zeroed again (operand A's padding rows, stream_mma._store_a).

    PERM (stream_fold.split_order): the run's positions map to splits by bit reversal within each group, so that
    the live splits of a partly filled cache spread evenly over the runs.

    SKIP (with FOLD; stream_fold.SKIP_DEAD): the loop runs over the run's live tiles only, a tile (b, g, s) being
    dead when its split starts past seq_lens[b] (s * SPLIT > pos: no position to attend to, its partial would
    be 0 with lse -inf); dead tiles write nothing and the merge reads only live splits (_merge_group), which
    adds the same values as before (a dead split's weight is exactly 0): the same bits, and the cost follows the
    live context, not the cache length.

    FOLD (stream_plan.make_plan): after the run, its tiles arrive on their (b, g) groups' counters and the last
    of a group's NSPLIT tiles merges the group's R rows (``_arrive_and_merge``): no merge tasks."""
    R: gl.constexpr = HQ // HKV
    SW: gl.constexpr = SPLIT // 4           # positions per warp and tile
    NB: gl.constexpr = SW // BN             # BN-blocks per warp and tile
    TD: gl.constexpr = 32 if HD >= 256 else HD // 8
    L4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 1, 32 // TD, TD], [4, 1, 1, 1], [3, 2, 1, 0])
    KL: gl.constexpr = gl.SliceLayout(1, L4)   # [4, BN, HD]: K / V blocks
    QL: gl.constexpr = gl.SliceLayout(2, L4)   # [4, RP, HD]: q, acc
    XL: gl.constexpr = gl.SliceLayout(3, L4)   # [4, RP, BN]: scores
    ML: gl.constexpr = gl.SliceLayout(2, XL)   # [4, RP]: m, l
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
    # the run's tiles the loop visits, in order: tilev[k] = the run index of the k-th, posl[k] = its position
    if SKIP:
        tilev, posl, nlive = _live_tiles(posv, jv, u0, nu, SPLIT, NSPLIT, NTA, PERM)
    else:
        tilev, posl, nlive = jv, posv, nu
    wk = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, KL)))[:, None, None] * SW
    nk = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, KL)))[None, :, None]
    dk = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, KL)))[None, None, :]
    wx = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, XL)))[:, None, None] * SW
    nx = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(1, XL)))[None, None, :]
    # q is the same for every warp: a zero warp index gives its loads the [4, RP, HD] shape of QL
    wq = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, QL)))[:, None, None] * 0
    rq = gl.arange(0, RP, layout=gl.SliceLayout(0, gl.SliceLayout(2, QL)))[None, :, None]
    dq = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, QL)))[None, None, :]
    qk_scale = SM_SCALE * 1.4426950408889634
    # block 0 of the first tile before the wait: the old rows only
    b, g, s = _tile_coords(u0 + _pick(tilev, jv, 0), HKV, NSPLIT, PERM)
    pos = _pick(posl, jv, 0)
    end = gl.minimum(gl.minimum(pos + 1, s * SPLIT + SPLIT), S)
    kv_off = (b * HKV + g).to(gl.int64) * (S * HD)
    rows = s * SPLIT + wk + nk
    ptr = rows * HD + dk
    old = (rows < end) & (rows != pos) & (nlive > 0)
    k_c = gl.load(kc + kv_off + ptr, mask=old, other=0.0, cache_modifier=".cg")
    v_c = gl.load(vc + kv_off + ptr, mask=old, other=0.0, cache_modifier=".cg")
    wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
    cur = (rows == pos) & (rows < end) & (nlive > 0)
    k_c = gl.where(cur, gl.load(kc + kv_off + ptr, mask=cur, other=0.0, cache_modifier=".cg"), k_c)
    v_c = gl.where(cur, gl.load(vc + kv_off + ptr, mask=cur, other=0.0, cache_modifier=".cg"), v_c)
    q_c = gl.load(q + (b * HQ + g * R + rq + wq) * HD + dq, mask=(rq < R) & (nlive > 0), other=0.0,
                  cache_modifier=".cg")
    q_n = q_c
    total = nlive * NB
    if KVS > 0:  # block 0 (registers) into slot 0 of xbuf; blocks 1 .. KVS-1 copied now, each its own group
        KH: gl.constexpr = KVS // 2
        KS4: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])  # the leading dim: the slot
        xv = view(xbuf, k_c.dtype, [2 * KH, 4, BN, HD], KS4)
        rv = view(rbuf, k_c.dtype, [2 * KH, 4, BN, HD], KS4)
        xv.index(0).store(k_c)
        xv.index(1).store(v_c)
        for pb in gl.static_range(1, KVS):
            _kv_issue(xv, rv, kc, vc, u0, pb, total, tilev, posl, jv, wk, nk, dk, HKV, HD, S, SPLIT, NSPLIT, BN, NB,
                      KH, PERM)
    m = gl.full([4, RP], float("-inf"), gl.float32, ML)
    l = gl.zeros([4, RP], gl.float32, ML)
    acc = gl.zeros([4, RP, HD], gl.float32, QL)
    for i in range(total):
        jl = i // NB
        blk = i % NB
        b, g, s = _tile_coords(u0 + _pick(tilev, jv, jl), HKV, NSPLIT, PERM)
        end = gl.minimum(gl.minimum(_pick(posl, jv, jl) + 1, s * SPLIT + SPLIT), S)
        n0 = s * SPLIT + blk * BN
        # a new tile (blk == 0): its q (prefetched with the previous block), fresh softmax state. Selects, not an
        # `if`: Triton 3.6 drops a loop-carried value used only inside an scf.if of the next iteration (q_n was
        # replaced by its initial value: every tile of a run took the first tile's q; 7e172aa, run 9 call 52)
        first = blk == 0
        q_c = gl.where(first & (i > 0), q_n, q_c)
        m = gl.where(first, float("-inf"), m)
        l = gl.where(first, 0.0, l)
        acc = gl.where(first, 0.0, acc)
        if KVS > 0:  # block i from its slot (copies of blocks <= i landed: KVS - 1 groups may be pending)
            async_copy.wait_group(KVS - 1)
            k_c, v_c = _kv_read(xv, rv, i, KH, KL)
        else:  # prefetch block i + 1 (the next block of this tile, or the first of the next tile): rows < its end
            k_n, v_n = _kv_block(kc, vc, u0, i + 1, total, tilev, posl, jv, wk, nk, dk, HKV, HD, S, SPLIT, NSPLIT,
                                 BN, NB, PERM)
        b1, g1, s1 = _tile_coords(u0 + _pick(tilev, jv, (i + 1) // NB), HKV, NSPLIT, PERM)
        nq = ((i + 1) % NB == 0) & (i + 1 < total)
        q_n = gl.load(q + (b1 * HQ + g1 * R + rq + wq) * HD + dq, mask=(rq < R) & nq, other=0.0,
                      cache_modifier=".cg")
        # block i: warp w's BN positions n0 + w*SW + [0, BN)
        q4 = gl.expand_dims(q_c.to(gl.float32) * qk_scale, 2)
        x = gl.sum(q4 * gl.expand_dims(k_c.to(gl.float32), 1), axis=3)
        x = gl.where((n0 + wx + nx) < end, x, float("-inf"))
        m_new = gl.maximum(m, gl.max(x, axis=2))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)   # a block with no live row yet: no NaN
        alpha = gl.exp2(m - m_use)
        p = gl.exp2(x - m_use[:, :, None])
        l = l * alpha + gl.sum(p, axis=2)
        pv = gl.sum(gl.expand_dims(p, 3) * gl.expand_dims(v_c.to(gl.float32), 1), axis=2)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(2, QL))[:, :, None] + pv
        m = m_new
        if KVS > 0:  # block i consumed: its slot takes block i + KVS (an empty group past the run's end)
            _kv_issue(xv, rv, kc, vc, u0, i + KVS, total, tilev, posl, jv, wk, nk, dk, HKV, HD, S, SPLIT, NSPLIT,
                      BN, NB, KH, PERM)
        else:
            k_c = k_n
            v_c = v_n
        if blk == NB - 1:  # the tile's last block: merge the 4 warps' states, store the partial
            _attn_merge_warps(scr, m, l, acc, o_part, lse_part, b * HQ + g * R, s, R, RP, HD, NSPLIT)
    if KVS > 0:  # every copy landed (the empty ones too), then xbuf's padding rows are zeros again
        async_copy.wait_group(0)
        barrier()
        ZL: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [4, 1, 1], [2, 1, 0])
        XK: gl.constexpr = xbuf.shape[2]
        for q4 in gl.static_range((B + 3) // 4, 4):
            xbuf.slice(q4 * 4, 4, dim=1).store(gl.zeros([4, 4, XK], xbuf.dtype, ZL))
    if FOLD:
        _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, seq, R, HD, NSPLIT, NSP2, RP, NGP, HKV,
                          SPLIT, SKIP)


@gluon.jit
def _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, seq, R: gl.constexpr, HD: gl.constexpr,
                      NSPLIT: gl.constexpr, NSP2: gl.constexpr, RP: gl.constexpr, NGP: gl.constexpr,
                      HKV: gl.constexpr, SPLIT: gl.constexpr, SKIP: gl.constexpr):
    """The run's tiles [u0, u0 + nu) arrive on their groups' counters (argtab role 7 "arrive", int32 [B * Hkv]; group
    b * Hkv + g, at most NGP groups per run): one ``atom.add.acq_rel.gpu`` per group adds the run's tiles of it, all
    groups at once; the run that brings a group to NSPLIT resets its counter to 0 for the next step and merges the
    group's R rows into out (role 6) with ``_merge_group`` (the splits' partials: stored by other workers before
    their releases, read after this acquire and a CTA barrier, from L2). The others only arrive. SKIP: the
    merge reads the splits that start at or before the sequence's position (seq_lens[b]) only."""
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
            nsl = NSPLIT
            if SKIP:  # live splits of the group's sequence b = (g0 + jg) // HKV
                nsl = gl.load(seq + (g0 + jg) // HKV, cache_modifier=".cg") // SPLIT + 1
            _merge_group(o_part, lse_part, out, (g0 + jg) * R, nsl, R, HD, NSPLIT, NSP2, RP)


@gluon.jit
def _merge_group(o_part, lse_part, out, row0, nsl, R: gl.constexpr, HD: gl.constexpr, NSPLIT: gl.constexpr,
                 NSP2: gl.constexpr, RP: gl.constexpr):
    """out[row] = sum_s exp(lse_s - LSE) O_s for the R rows row0.. (ops/attention.py's merge; rows b*Hq + h of
    o_part fp32 [B*Hq, NSPLIT, hd], lse_part fp32 [B*Hq, NSPLIT]) with all of them in flight at once: splits in
    chunks of CS (RP * CS * hd <= 4096 values: 32 per thread), one L2 round trip per chunk. Splits s >= nsl are
    read as empty (0, -inf) without a load."""
    dt: gl.constexpr = out.dtype.element_ty
    TD: gl.constexpr = 32 if HD >= 128 else HD // 4
    CS: gl.constexpr = NSP2 if RP * NSP2 * HD <= 4096 else max(1, 4096 // (RP * HD))
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32 // TD, TD], [4, 1, 1], [2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    r2 = gl.arange(0, RP, layout=gl.SliceLayout(1, L2))[:, None]
    s2 = gl.arange(0, NSP2, layout=gl.SliceLayout(0, L2))[None, :]
    lse = gl.load(lse_part + (row0 + r2) * NSPLIT + s2, mask=(r2 < R) & (s2 < nsl), other=float("-inf"),
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
        lc = gl.load(lse_part + (row0 + r2) * NSPLIT + c + c2, mask=(r2 < R) & (c + c2 < nsl),
                     other=float("-inf"), cache_modifier=".cg")
        oc = gl.load(o_part + ((row0 + r3) * NSPLIT + c + c3) * HD + d3, mask=(r3 < R) & (c + c3 < nsl),
                     other=0.0, cache_modifier=".cg")
        acc += gl.sum(oc * gl.exp(lc - mx[:, None])[:, :, None], axis=1)
    tsafe = gl.where(tot > 0.0, tot, 1.0)
    o = acc / gl.convert_layout(tsafe, gl.SliceLayout(1, gl.SliceLayout(1, L3)))[:, None]
    ro = gl.arange(0, RP, layout=gl.SliceLayout(1, gl.SliceLayout(1, L3)))[:, None]
    do = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, :]
    gl.store(out + (row0 + ro) * HD + do, o.to(dt), mask=ro < R)


@gluon.jit
def _kv_block(kc, vc, u0, idx, total, tilev, posl, jv, wk, nk, dk, HKV: gl.constexpr, HD: gl.constexpr,
              S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, BN: gl.constexpr, NB: gl.constexpr,
              PERM: gl.constexpr):
    """K, V [4, BN, HD] of block ``idx`` of the run's visited tiles (tilev, posl: attn_task; warp w: its BN
    positions of the block), rows past the tile's end (or idx >= total) 0."""
    b, g, s = _tile_coords(u0 + _pick(tilev, jv, idx // NB), HKV, NSPLIT, PERM)
    end = gl.minimum(gl.minimum(_pick(posl, jv, idx // NB) + 1, s * SPLIT + SPLIT), S)
    rows = s * SPLIT + (idx % NB) * BN + wk + nk
    live = (rows < end) & (idx < total)
    off = (b * HKV + g).to(gl.int64) * (S * HD)
    return (gl.load(kc + off + rows * HD + dk, mask=live, other=0.0, cache_modifier=".cg"),
            gl.load(vc + off + rows * HD + dk, mask=live, other=0.0, cache_modifier=".cg"))


@gluon.jit
def _live_tiles(posv, jv, u0, nu, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, NTA: gl.constexpr,
                PERM: gl.constexpr):
    """(tilev, posl, n): the run's live tiles in order (attn_task, SKIP): tilev[k] = the run index j of the k-th
    tile whose split starts at or before its sequence's position (s * SPLIT <= posv[j]), posl[k] = posv[j], n of
    them (entries k >= n: 0). Two [NTA, NTA] reductions, no scan."""
    V1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    M2: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    s = (u0 + jv) % NSPLIT
    if PERM:
        s = _bitrev(s, NSPLIT)
    live = (jv < nu) & (s * SPLIT <= posv)
    rk = gl.arange(0, NTA, layout=gl.SliceLayout(1, M2))[:, None]
    cj = gl.arange(0, NTA, layout=gl.SliceLayout(0, M2))[None, :]
    livec = gl.convert_layout(live, gl.SliceLayout(0, M2))[None, :]
    before = gl.sum(gl.where(livec & (cj < rk), 1, 0), axis=1)       # live tiles before run index rk
    sel = livec & (gl.convert_layout(before, gl.SliceLayout(0, M2))[None, :] == rk)   # [k, j]: j is the k-th
    tilev = gl.convert_layout(gl.sum(gl.where(sel, cj, 0), axis=1), V1)
    posl = gl.convert_layout(gl.sum(gl.where(sel, gl.convert_layout(posv, gl.SliceLayout(0, M2))[None, :], 0),
                                    axis=1), V1)
    return tilev, posl, gl.sum(live.to(gl.int32), axis=0)


@gluon.jit
def _kv_issue(xv, rv, kc, vc, u0, idx, total, tilev, posl, jv, wk, nk, dk, HKV: gl.constexpr, HD: gl.constexpr,
              S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, BN: gl.constexpr, NB: gl.constexpr,
              KH: gl.constexpr, PERM: gl.constexpr):
    """cp.async copies of block ``idx`` of the run (as _kv_block: rows past the tile's end, or idx >= total, 0)
    into its ring slot: xbuf for even idx, rbuf for odd, slot (idx // 2) % KH, K at 2 * slot and V at 2 * slot + 1;
    one commit group."""
    b, g, s = _tile_coords(u0 + _pick(tilev, jv, idx // NB), HKV, NSPLIT, PERM)
    end = gl.minimum(gl.minimum(_pick(posl, jv, idx // NB) + 1, s * SPLIT + SPLIT), S)
    rows = s * SPLIT + (idx % NB) * BN + wk + nk
    live = (rows < end) & (idx < total)
    off = (b * HKV + g).to(gl.int64) * (S * HD) + rows * HD + dk
    sl = (idx // 2) % KH
    if idx % 2 == 0:
        async_copy.async_copy_global_to_shared(xv.index(2 * sl), kc + off, mask=live, cache_modifier=".cg")
        async_copy.async_copy_global_to_shared(xv.index(2 * sl + 1), vc + off, mask=live, cache_modifier=".cg")
    else:
        async_copy.async_copy_global_to_shared(rv.index(2 * sl), kc + off, mask=live, cache_modifier=".cg")
        async_copy.async_copy_global_to_shared(rv.index(2 * sl + 1), vc + off, mask=live, cache_modifier=".cg")
    async_copy.commit_group()


@gluon.jit
def _kv_read(xv, rv, idx, KH: gl.constexpr, KL: gl.constexpr):
    """K, V [4, BN, HD] of block ``idx`` from its ring slot (_kv_issue; slot 0 of xbuf: block 0)."""
    sl = (idx // 2) % KH
    if idx % 2 == 0:
        k = xv.index(2 * sl).load(KL)
        v = xv.index(2 * sl + 1).load(KL)
    else:
        k = rv.index(2 * sl).load(KL)
        v = rv.index(2 * sl + 1).load(KL)
    return k, v


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
