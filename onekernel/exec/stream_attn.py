"""The streaming megakernel's split-KV attention on the CUDA cores (Gluon, sm_90): the partials of a run of tiles
(loading the old KV rows before they wait), the merge of the 4 warps' softmax states per tile, the last arrival's
merge of a (sequence, KV head) group's splits (FOLD), and the merge task (FOLD off). Math and tiles as
ops/attention.py (flash-decoding: Dao et al., 2023); docs/DESIGN.md, "Attention: the warps split the positions"
and "Attention merges its own splits". The worker loop that calls it: ``exec.stream_device``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.exec.stream_attn_runs import block_tile, drop_first, run_start, skip_dead, split_bits, tile_coords
from onekernel.exec.stream_base import F_NU, F_U0, SUBVIEW_REINTERPRET, barrier, now, wait_deps


@gluon.jit
def _pick(vec, idx, j):
    """vec[j] of a small int32 vector (registers only)."""
    return gl.sum(gl.where(idx == j, vec, 0), axis=0)


@gluon.jit
def attn_args(rec, a, base_t, base_f, base_i, HKV: gl.constexpr, NSPLIT: gl.constexpr, NTA: gl.constexpr):
    """An attention task's operands: (u0, nu: its run of tiles (record F_U0 / F_NU); q, k_cache, v_cache, o_part,
    lse_part: pointers from the argument table; jv, posv: int32 [NTA] index and the position each tile's sequence
    writes this step (seq_lens is the step's input: read before the wait))."""
    V1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    u0 = gl.load(rec + F_U0)
    nu = gl.load(rec + F_NU)
    q = base_t + gl.load(a) * 8
    kc = base_t + gl.load(a + 1) * 8
    vc = base_t + gl.load(a + 2) * 8
    seq = base_i + gl.load(a + 3) * 4
    o_part = base_f + gl.load(a + 4) * 4
    lse_part = base_f + gl.load(a + 5) * 4
    jv = gl.arange(0, NTA, layout=V1)
    posv = gl.load(seq + (u0 + jv) // (HKV * NSPLIT), mask=jv < nu, other=0, cache_modifier=".cg")
    return u0, nu, q, kc, vc, o_part, lse_part, jv, posv


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
    ML: gl.constexpr = gl.SliceLayout(2, XL)   # [4, RP]: m, l
    u0, nu, q, kc, vc, o_part, lse_part, jv, posv = attn_args(rec, a, base_t, base_f, base_i, HKV, NSPLIT, NTA)
    SKIP: gl.constexpr = skip_dead(FOLD, NTA, NSPLIT)  # only the run's live tiles (stream_attn_runs)
    SB: gl.constexpr = split_bits(NSPLIT, SKIP)
    rem, nl, j0 = run_start(u0, nu, jv, posv, HKV, NSPLIT, SPLIT, SB, SKIP)  # rem: the live tiles not yet finished
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
    # block 0 of the run's first tile (its first live one) before the wait: the old rows only
    b, g, s = tile_coords(u0 + j0, HKV, NSPLIT, SB)
    pos = _pick(posv, jv, j0)
    end = gl.minimum(gl.minimum(pos + 1, s * SPLIT + SPLIT), S)
    kv_off = (b * HKV + g).to(gl.int64) * (S * HD)
    rows = s * SPLIT + wk + nk
    ptr = rows * HD + dk
    old = (rows < end) & (rows != pos)
    k_c = gl.load(kc + kv_off + ptr, mask=old, other=0.0, cache_modifier=".cg")
    v_c = gl.load(vc + kv_off + ptr, mask=old, other=0.0, cache_modifier=".cg")
    wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
    if PROFILE:
        t_r = now()
    cur = (rows == pos) & (rows < end)
    k_c = gl.where(cur, gl.load(kc + kv_off + ptr, mask=cur, other=0.0, cache_modifier=".cg"), k_c)
    v_c = gl.where(cur, gl.load(vc + kv_off + ptr, mask=cur, other=0.0, cache_modifier=".cg"), v_c)
    q_c = gl.load(q + (b * HQ + g * R + rq + wq) * HD + dq, mask=rq < R, other=0.0,
                  cache_modifier=".cg")
    q_n = q_c
    total = nl * NB
    m = gl.full([4, RP], float("-inf"), gl.float32, ML)
    l = gl.zeros([4, RP], gl.float32, ML)
    acc = gl.zeros([4, RP, HD], gl.float32, QL)
    if PROFILE:
        t_l = now()
        gl.store(sub, t_l - t_r)
        t_mw = t_l * 0
    for i in range(total):
        j = block_tile(rem, i, i, NB, SKIP)
        blk = i % NB
        b, g, s = tile_coords(u0 + j, HKV, NSPLIT, SB)
        end = gl.minimum(gl.minimum(_pick(posv, jv, j) + 1, s * SPLIT + SPLIT), S)
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
        j1 = block_tile(rem, i, i + 1, NB, SKIP)  # block i + 1's tile: this one or the next (live) one
        k_n, v_n = _kv_block(kc, vc, u0, i + 1, total, posv, jv, j1, wk, nk, dk, HKV, HD, S, SPLIT, NSPLIT, BN, NB,
                             SB)
        b1, g1, s1 = tile_coords(u0 + j1, HKV, NSPLIT, SB)
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
        k_c = k_n
        v_c = v_n
        if blk == NB - 1:  # the tile's last block: merge the 4 warps' states, store the partial
            if PROFILE:
                t_w = now()
            _attn_merge_warps(scr, m, l, acc, o_part, lse_part, b * HQ + g * R, s, R, RP, HD, NSPLIT)
            if PROFILE:
                t_mw = t_mw + (now() - t_w)
        if SKIP:  # the tile done: the next live one becomes rem's first
            rem = gl.where(blk == NB - 1, drop_first(rem), rem)
    if PROFILE:
        t_a = now()
        gl.store(sub + 1, t_a - t_l - t_mw)
        gl.store(sub + 2, t_mw)
    if FOLD:
        _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, jv, posv, R, HD, NSPLIT, NSP2, RP, NGP, SPLIT,
                          SKIP)
    if PROFILE:
        gl.store(sub + 3, (now() - t_a) + (total.to(gl.int64) << 32))


@gluon.jit
def _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, jv, posv, R: gl.constexpr, HD: gl.constexpr,
                      NSPLIT: gl.constexpr, NSP2: gl.constexpr, RP: gl.constexpr, NGP: gl.constexpr,
                      SPLIT: gl.constexpr, SKIP: gl.constexpr):
    """The run's tiles [u0, u0 + nu) arrive on their groups' counters (argtab role 7 "arrive", int32 [B * Hkv]; group
    b * Hkv + g, at most NGP groups per run): one ``atom.add.acq_rel.gpu`` per group adds the run's tiles of it, all
    groups at once; the run that brings a group to NSPLIT resets its counter to 0 for the next step and merges the
    group's R rows into out (role 6) with ``_merge_group`` (the splits' partials: stored by other workers before
    their releases, read after this acquire and a CTA barrier, from L2). The others only arrive. With SKIP the merge
    reads only the group's live splits (s <= its sequence's position // SPLIT: posv[j] of the run's first tile j
    of the group; jv, posv: attn_args; stream_attn_runs), the runs having written no partial for the others."""
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
            if SKIP:  # the group's live splits (a negative position: none)
                pg = _pick(posv, jv, gl.maximum(u0, (g0 + jg) * NSPLIT) - u0)
                nls = gl.where(pg >= 0, gl.minimum(pg // SPLIT + 1, NSPLIT), 0)
            else:
                nls = NSPLIT
            _merge_group(o_part, lse_part, out, (g0 + jg) * R, R, HD, NSPLIT, NSP2, RP, nls)


@gluon.jit
def _merge_group(o_part, lse_part, out, row0, R: gl.constexpr, HD: gl.constexpr, NSPLIT: gl.constexpr,
                 NSP2: gl.constexpr, RP: gl.constexpr, nls):
    """out[row] = sum_s exp(lse_s - LSE) O_s for the R rows row0.. (ops/attention.py's merge; rows b*Hq + h of
    o_part fp32 [B*Hq, NSPLIT, hd], lse_part fp32 [B*Hq, NSPLIT]) with all of them in flight at once: splits in
    chunks of CS (RP * CS * hd <= 4096 values: 32 per thread), one L2 round trip per chunk. Only the splits s < nls
    (<= NSPLIT; the live ones where the runs skip dead tiles) are read; the others count as (O = 0, lse = -inf), what
    a dead tile stores (merge_warp_states), so the sums are the same numbers in the same order."""
    dt: gl.constexpr = out.dtype.element_ty
    TD: gl.constexpr = 32 if HD >= 128 else HD // 4
    CS: gl.constexpr = NSP2 if RP * NSP2 * HD <= 4096 else max(1, 4096 // (RP * HD))
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32 // TD, TD], [4, 1, 1], [2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    r2 = gl.arange(0, RP, layout=gl.SliceLayout(1, L2))[:, None]
    s2 = gl.arange(0, NSP2, layout=gl.SliceLayout(0, L2))[None, :]
    lse = gl.load(lse_part + (row0 + r2) * NSPLIT + s2, mask=(r2 < R) & (s2 < nls), other=float("-inf"),
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
        lc = gl.load(lse_part + (row0 + r2) * NSPLIT + c + c2, mask=(r2 < R) & (c + c2 < nls),
                     other=float("-inf"), cache_modifier=".cg")
        oc = gl.load(o_part + ((row0 + r3) * NSPLIT + c + c3) * HD + d3, mask=(r3 < R) & (c + c3 < nls),
                     other=0.0, cache_modifier=".cg")
        acc += gl.sum(oc * gl.exp(lc - mx[:, None])[:, :, None], axis=1)
    tsafe = gl.where(tot > 0.0, tot, 1.0)
    o = acc / gl.convert_layout(tsafe, gl.SliceLayout(1, gl.SliceLayout(1, L3)))[:, None]
    ro = gl.arange(0, RP, layout=gl.SliceLayout(1, gl.SliceLayout(1, L3)))[:, None]
    do = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, :]
    gl.store(out + (row0 + ro) * HD + do, o.to(dt), mask=ro < R)


@gluon.jit
def _kv_block(kc, vc, u0, idx, total, posv, jv, j, wk, nk, dk, HKV: gl.constexpr, HD: gl.constexpr,
              S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr, BN: gl.constexpr, NB: gl.constexpr,
              SB: gl.constexpr):
    """K, V [4, BN, HD] of block ``idx`` of the run (warp w: its BN positions of the block of the run's tile j),
    rows past the tile's end (or idx >= total) 0."""
    b, g, s = tile_coords(u0 + j, HKV, NSPLIT, SB)
    end = gl.minimum(gl.minimum(_pick(posv, jv, j) + 1, s * SPLIT + SPLIT), S)
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
    merge_warp_states(m4, l4, s_acc.load(P3), o_part, lse_part, row0, s, R, RP, HD, NSPLIT)


@gluon.jit
def merge_warp_states(m4, l4, a4, o_part, lse_part, row0, s, R: gl.constexpr, RP: gl.constexpr, HD: gl.constexpr,
                      NSPLIT: gl.constexpr):
    """Tile split s's partial of rows row0 + [0, R) from the 4 warps' states as loaded from shared memory (m4, l4
    fp32 [4, RP] in SliceLayout(2, P3), a4 fp32 [4, RP, HD] in P3 = BlockedLayout([4, 1, 1], [1, 1, 32], [1, 4, 1]),
    log2 units): M = max_w m_w, L = sum_w l_w 2^(m_w - M), O = sum_w acc_w 2^(m_w - M) / L, lse = (M + log2 L) ln 2
    (empty: 0, -inf), summed over w in order 0..3 inside each thread."""
    P3: gl.constexpr = gl.BlockedLayout([4, 1, 1], [1, 1, 32], [1, 4, 1], [2, 1, 0])
    P2: gl.constexpr = gl.SliceLayout(2, P3)
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
