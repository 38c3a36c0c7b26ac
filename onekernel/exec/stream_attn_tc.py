"""The streaming megakernel's split-KV attention partials on the tensor cores, the warps splitting the positions
(Gluon, sm_90; ``gemv="mma"`` steps where ``stream_smem.attn_tc_bufs`` fits, constexpr ATTN_TC = its K/V buffers).
The same tiles, runs, partials and merge as the CUDA-core body ``exec.stream_attn.attn_task`` (ops/attention.py's
math: O_s = sum_j exp(x_j - lse_s) v_j, lse_s = log sum_j exp(x_j), x_j = scale q.k_j; empty split: 0, -inf), and
the same division of work: warp w takes the quarter [w SPLIT/4, (w+1) SPLIT/4) of every tile's positions, in blocks
of 16, for all R query heads of the tile's KV head, keeps its own online softmax, and the 4 warps' states are merged
per tile (``stream_attn.merge_warp_states``; flash-decoding, Dao et al., 2023). Per warp and block, as
FlashAttention-2 computes one block (Dao, 2023, algorithm 1):

* S [16, 16] = Q [16, HD] @ K^T [HD, 16] and O [16, HD] += P [16, 16] @ V [16, HD], ``mma.sync`` m16n8k16 (bf16 /
  fp16 operands, fp32 accumulators) on the MMA layout [4 warps, 16, N], warps as the batch dimension; Q's rows 0..R-1
  are the group's query heads (the same in every warp), rows R..15 zero; P is rounded to the operand dtype;
* the warp's K and V rows are copied by cp.async into its own region of the staged-activation tile ``xbuf`` (free
  between GEMV tasks): NBUF buffers per warp, block i + NBUF issued once block i's operands are read (``ldmatrix``,
  V transposed), so only ``cp.async.wait_group`` and ``bar.warp.sync``, no CTA barrier, stand between blocks; the
  run's first block is copied the same way, every row but the one this step writes before the dependency wait and
  that row after it (the CUDA-core body loads it into registers and patches the row);
* at a tile's end the states' rows 0..7 (a register half of the MMA layout) go to the partial-sum buffer ``accbuf``
  as fp32 [4, 8, HD] with m and l beside them, then two CTA barriers and the fixed-order merge.

A tile's operations and their order depend only on its (sequence, head group, split), never on its run or the
batch: bitwise batch invariance, as the CUDA-core body (whose bits it does not reproduce: other product order,
P rounded). docs/DESIGN.md, "Attention on the tensor cores, the warps splitting the positions".
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from onekernel.exec.stream_attn import _arrive_and_merge, _pick, attn_args, merge_warp_states
from onekernel.exec.stream_attn_runs import block_tile, drop_first, run_start, skip_dead, split_bits, tile_coords
from onekernel.exec.stream_base import barrier, now, smem_addr, view, wait_deps
from onekernel.exec.stream_stage import stage_layout

BLK = gl.constexpr(16)  # positions per warp and block: one MMA k-step of P @ V


@gluon.constexpr_function
def kv_layout(HD):
    """A K or V view's layout, [4 warps, 16 positions, HD]: offset bits 0..log2(HD)-1 are the head dim, positions
    1, 2 and 4 also flipping the 16-byte unit's bits (an ``ldmatrix`` phase, 8 positions at one unit, hits 8 units:
    no bank conflicts), then the position's bit 3, then the warp. _issue's shared offsets are its inverse: (w*16 +
    n)*HD + (d ^ ((n & 7) << 3))."""
    def v(d, x):
        c = [0, 0, 0]
        c[d] = x
        return c
    bases = [v(2, 1 << j) for j in range(HD.bit_length() - 1)]
    for j in range(4):
        c = v(1, 1 << j)
        if j < 3:
            c[2] = 8 << j
        bases.append(c)
    return gl.SharedLinearLayout(bases + [v(0, 1), v(0, 2)])


@gluon.constexpr_function
def _copy_layout(HD):
    """[4 warps, 16, HD/8] 16-byte units: warp w copies its own block."""
    TD = min(32, HD // 8)
    return gl.BlockedLayout([1, 1, 1], [1, 32 // TD, TD], [4, 1, 1], [2, 1, 0])


@gluon.jit
def _warp_sync(x):
    """``bar.warp.sync``: the warp's shared-memory accesses before it are ordered before those after it (its lanes
    read and write only the warp's own K/V region). Returns 0 (x: any int32 scalar, ties the asm to the program)."""
    return gl.inline_asm_elementwise("bar.warp.sync -1; mov.b32 $0, 0;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _wait_copies(x, N: gl.constexpr):
    """``cp.async.wait_group N`` then ``bar.warp.sync``: this thread's copies but the last N groups have landed, and
    every lane of the warp sees its lanes' (Triton's own wait would make the compiler add a CTA barrier)."""
    if N == 0:
        return gl.inline_asm_elementwise("cp.async.wait_group 0; bar.warp.sync -1; mov.b32 $0, 0;", "=r,r", [x],
                                         dtype=gl.int32, is_pure=False, pack=1)
    else:
        return gl.inline_asm_elementwise("cp.async.wait_group 1; bar.warp.sync -1; mov.b32 $0, 0;", "=r,r", [x],
                                         dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _tile_end(u0, j, posv, jv, HKV: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr, NSPLIT: gl.constexpr,
              SB: gl.constexpr):
    """(b, g, s, end) of the run's tile j: end = the first position past its live rows (s: stream_attn_runs)."""
    b, g, s = tile_coords(u0 + j, HKV, NSPLIT, SB)
    return b, g, s, gl.minimum(gl.minimum(_pick(posv, jv, j) + 1, s * SPLIT + SPLIT), S)


@gluon.jit
def _issue(kv0, kc, vc, u0, idx, total, posv, jv, rem, i, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
           SPLIT: gl.constexpr, NSPLIT: gl.constexpr, NB: gl.constexpr, NBUF: gl.constexpr, SKIP: gl.constexpr,
           SB: gl.constexpr, PART: gl.constexpr = 0):
    """Block idx of the run (warp w: its 16 positions of the block's tile, stream_attn_runs.block_tile with the loop
    at block i, block idx % NB) copied into buffer idx % NBUF (shared address kv0: the K/V views' base, kv_layout) by ``cp.async.cg`` 16 bytes at a
    time, K and V, dead rows and blocks past the run zero-filled (src-size 0), one commit group. Inline PTX: the compiler sees no
    shared-memory write here, so it adds no CTA barriers around the warp-private copies (_warp_sync orders them).
    PART: 0 = the whole block; for the run's first block 1 = every row but the one this step writes (issued before
    the dependency wait; that row is not written) and 2 = only that row (after the wait): two commit groups, disjoint
    bytes (the dead rows, past the tile's end, are never this step's row)."""
    CV: gl.constexpr = _copy_layout(HD)
    j = block_tile(rem, i, idx, NB, SKIP)
    b, g, s, end = _tile_end(u0, j, posv, jv, HKV, S, SPLIT, NSPLIT, SB)
    w = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, CV)))[:, None, None]
    n = gl.arange(0, BLK, layout=gl.SliceLayout(0, gl.SliceLayout(2, CV)))[None, :, None]
    u = gl.arange(0, HD // 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, CV)))[None, None, :]
    rows = s * SPLIT + w * (SPLIT // 4) + (idx % NB) * BLK + n
    goff = (b * HKV + g).to(gl.int64) * (S * HD) + rows * HD + u * 8
    src = gl.where((rows < end) & (idx < total), 16, 0)
    soff = kv0 + (idx % NBUF) * (2 * 4 * BLK * HD * 2) + ((w * BLK + n) * HD + (u ^ (n & 7)) * 8) * 2
    if PART == 0:
        gl.inline_asm_elementwise(
            "cp.async.cg.shared.global [$1], [$2], 16, $5; cp.async.cg.shared.global [$3], [$4], 16, $5; "
            "mov.b32 $0, 0;", "=r,r,l,r,l,r", [soff, kc + goff, soff + 4 * BLK * HD * 2, vc + goff, src],
            dtype=gl.int32, is_pure=False, pack=1)
    else:
        cur = rows == _pick(posv, jv, j)
        if PART == 1:
            go = gl.where(cur, 0, 1)
        else:
            go = gl.where(cur & (src > 0), 1, 0)
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $6, 0; @p cp.async.cg.shared.global [$1], [$2], 16, $5;"
            " @p cp.async.cg.shared.global [$3], [$4], 16, $5; } mov.b32 $0, 0;", "=r,r,l,r,l,r,r",
            [soff, kc + goff, soff + 4 * BLK * HD * 2, vc + goff, src, go], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise("cp.async.commit_group; mov.b32 $0, 0;", "=r,r", [idx], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _q_operand(q, u0, j, ok, wq, rq, dq, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr,
               NSPLIT: gl.constexpr):
    """Q [4, 16, HD] of the run's tile j as operand A, the same in every warp: row r < R = query head g*R + r of the
    tile's group (rows >= R, or all unless ok: 0)."""
    R: gl.constexpr = HQ // HKV
    b, g, s = tile_coords(u0 + j, HKV, NSPLIT, 0)
    return gl.load(q + (b * HQ + g * R + rq + wq) * HD + dq, mask=(rq < R) & ok & (dq < HD), other=0.0,
                   cache_modifier=".cg")


@gluon.jit
def _top8(x):
    """Rows 0..7 of x [4, 16, N] in the MMA layout as [4, 8, N] (row bit 3 is a register bit: no data moves)."""
    N: gl.constexpr = x.shape[2]
    lo, hi = gl.split(gl.permute(gl.reshape(x, [4, 2, 8, N]), [0, 2, 3, 1]))
    return lo


@gluon.jit
def _row_xor4(x):
    """x [4, 16] fp32 (a row slice of the MMA layout) with row r holding x[r ^ 4]: lane bit 4 is the row's bit 2
    (``shfl.sync.bfly`` 16)."""
    y = gl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 16, 31, -1;", "=r,r", [x.to(gl.int32, bitcast=True)],
                                  dtype=gl.int32, is_pure=False, pack=1)
    return y.to(gl.float32, bitcast=True)


@gluon.jit
def _merge_tile(scr, m, l, acc, o_part, lse_part, row0, s, R: gl.constexpr, RP: gl.constexpr, HD: gl.constexpr,
                NSPLIT: gl.constexpr):
    """The tile's partial from the 4 warps' states (m, l [4, 16], acc [4, 16, HD] in the MMA layout; rows >= R <= 4
    are padding): rows 0..7 of each warp go to ``scr`` fp32 [>= 4, 8, HD] in one store, m and l of rows 0..3 in
    columns 0 and 1 of the padding rows 4..7 (one store: two would get a CTA barrier between them), then
    merge_warp_states on rows 0..RP-1."""
    MMA: gl.constexpr = acc.type.layout
    P3: gl.constexpr = gl.BlockedLayout([4, 1, 1], [1, 1, 32], [1, 4, 1], [2, 1, 0])
    rr = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))[None, :, None]
    cc = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))[None, None, :]
    pad = (rr >= 4) & (rr < 8)
    st = gl.where(pad & (cc == 0), _row_xor4(m)[:, :, None], gl.where(pad & (cc == 1), _row_xor4(l)[:, :, None], acc))
    s_acc = scr.slice(0, 4)
    barrier()  # the previous tile's reads of scr are done
    s_acc.store(_top8(st))
    barrier()
    s_ml = s_acc.slice(4, RP, dim=1)
    m4 = gl.max(s_ml.slice(0, 1, dim=2).load(P3), axis=2)  # [4, RP, 1] -> [4, RP]
    l4 = gl.sum(s_ml.slice(1, 1, dim=2).load(P3), axis=2)
    merge_warp_states(m4, l4, s_acc.slice(0, RP, dim=1).load(P3), o_part, lse_part, row0, s, R, RP, HD, NSPLIT)


@gluon.jit
def attn_task_tc(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, xbuf, accbuf, PROFILE: gl.constexpr,
                 WAIT_NS: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
                 SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr, SM_SCALE: gl.constexpr,
                 NTA: gl.constexpr, FOLD: gl.constexpr, NSP2: gl.constexpr, NGP: gl.constexpr, NBUF: gl.constexpr,
                 B: gl.constexpr, XOFF: gl.constexpr, sub=None):
    """Split-KV partials of the run of tiles [u0, u0 + nu) (record F_U0 / F_NU; at most NTA) on the tensor cores
    (module doc), then, with FOLD, the run's arrival and the last arrival's merge (stream_attn._arrive_and_merge).
    ``xbuf``: the staged activation tile [4, 16, CK/4] (32 * CK bytes), viewed as K/V [2 NBUF, 4, 16, HD], zeroed
    again at the end where the batch pads operand A (B < 16); ``accbuf``: the partial-sum buffer, the warp merge's
    scratch. PROFILE: ``sub`` as attn_task's (ns to the loop, ns in the loop without the warp merges, ns in them, ns
    arriving and merging + blocks << 32), and above bit 32 of the second and third: ns waiting on the K/V copies, ns
    from each wait's end to P (operand loads, the next copies' issue, S, softmax: issue times, not completion)."""
    R: gl.constexpr = HQ // HKV
    NB: gl.constexpr = SPLIT // 4 // BLK
    dt: gl.constexpr = xbuf.dtype
    XK: gl.constexpr = xbuf.shape[2]
    NV: gl.constexpr = XK // HD  # [4, 16, HD] views in xbuf
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])
    DA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    DB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    FL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    KVL: gl.constexpr = kv_layout(HD)
    kvv = view(xbuf, dt, [NV, 4 * BLK, HD], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))  # K/V views, each kv_layout
    kv0 = smem_addr(XOFF)  # xbuf's shared address (the ring's bytes come first: stream_runner.fit_kernel checks)
    AR: gl.constexpr = accbuf.shape[0] * accbuf.shape[1] * accbuf.shape[2] * accbuf.shape[3] // (8 * HD)
    scr = view(accbuf, gl.float32, [AR, 8, HD], FL)
    u0, nu, q, kc, vc, o_part, lse_part, jv, posv = attn_args(rec, a, base_t, base_f, base_i, HKV, NSPLIT, NTA)
    SKIP: gl.constexpr = skip_dead(FOLD, NTA, NSPLIT)  # only the run's live tiles (stream_attn_runs)
    SB: gl.constexpr = split_bits(NSPLIT, SKIP)
    rem, nl, j0 = run_start(u0, nu, jv, posv, HKV, NSPLIT, SPLIT, SB, SKIP)  # rem: the live tiles not yet finished
    total = nl * NB
    wq = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, DA)))[:, None, None] * 0
    rq = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, DA)))[None, :, None]
    dq = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, DA)))[None, None, :]
    ws = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))[:, None, None] * (SPLIT // 4)
    cs = gl.arange(0, BLK, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))[None, None, :]
    qk_scale = SM_SCALE * 1.4426950408889634
    # block 0 by cp.async into buffer 0 (xbuf is free: the worker loop's barrier after the last task): every row but
    # seq_lens[b] (which this step's qkv task writes) before the wait, that row after it. No load into registers is in
    # flight during the spin, whose acquire returned only after them (session 21)
    _issue(kv0, kc, vc, u0, 0, total, posv, jv, rem, 0, HKV, HD, S, SPLIT, NSPLIT, NB, NBUF, SKIP, SB, 1)
    wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
    if PROFILE:
        t_r = now()
    _issue(kv0, kc, vc, u0, 0, total, posv, jv, rem, 0, HKV, HD, S, SPLIT, NSPLIT, NB, NBUF, SKIP, SB, 2)
    q_c = _q_operand(q, u0, j0, nl > 0, wq, rq, dq, HQ, HKV, HD, NSPLIT)
    q_n = q_c
    barrier()  # here, not before each ldmatrix of the loop (where the compiler would put it)
    for p in gl.static_range(1, NBUF):
        _issue(kv0, kc, vc, u0, p, total, posv, jv, rem, 0, HKV, HD, S, SPLIT, NSPLIT, NB, NBUF, SKIP, SB)
    jl = j0  # the previous block's tile
    m = gl.full([4, 16], float("-inf"), gl.float32, gl.SliceLayout(2, MMA))
    l = gl.zeros([4, 16], gl.float32, gl.SliceLayout(2, MMA))
    acc = gl.zeros([4, 16, HD], gl.float32, MMA)
    if PROFILE:
        t_l = now()
        gl.store(sub, t_l - t_r)
        t_mw = t_l * 0
        t_cw = t_l * 0
        t_s = t_l * 0
    for i in range(total):
        j = block_tile(rem, i, i, NB, SKIP)  # the run's tile j
        blk = i % NB
        b, g, s, end = _tile_end(u0, j, posv, jv, HKV, S, SPLIT, NSPLIT, SB)
        # a new tile: its q (loaded during the previous block) and a fresh state (selects: stream_attn.attn_task)
        first = blk == 0
        if SKIP:
            q_c = gl.where(first & (i > 0) & ((u0 + j) // NSPLIT != (u0 + jl) // NSPLIT), q_n, q_c)
        else:
            q_c = gl.where(first & (i > 0) & ((u0 + j) // NSPLIT != (u0 + j - 1) // NSPLIT), q_n, q_c)
        m = gl.where(first, float("-inf"), m)
        l = gl.where(first, 0.0, l)
        acc = gl.where(first, 0.0, acc)
        # the next tile's q where its (sequence, head group) differs from this tile's (a run's tiles are mostly
        # splits of one group, which share q)
        if SKIP:
            jn = block_tile(rem, i, i + NB, NB, SKIP)
            q_n = _q_operand(q, u0, jn, (blk == NB - 1) & (i // NB + 1 < nl) & ((u0 + jn) // NSPLIT != (u0 + j) // NSPLIT),
                             wq, rq, dq, HQ, HKV, HD, NSPLIT)
            jl = j
        else:
            q_n = _q_operand(q, u0, j + 1, (blk == NB - 1) & (j + 1 < nu) & ((u0 + j + 1) // NSPLIT != (u0 + j) // NSPLIT),
                             wq, rq, dq, HQ, HKV, HD, NSPLIT)
        # block i in this warp's region of buffer i % NBUF: this thread's copies landed, the warp's lanes see them
        if PROFILE:
            t0 = now()
        _wait_copies(i, NBUF - 1)
        if PROFILE:
            t1 = now()
            t_cw = t_cw + (t1 - t0)
        buf = i % NBUF
        kt = view(kvv.index(2 * buf), dt, [4, BLK, HD], KVL).permute([0, 2, 1]).load(DB)   # K^T [4, HD, 16]
        vb = view(kvv.index(2 * buf + 1), dt, [4, BLK, HD], KVL).load(DB)                  # V [4, 16, HD]
        # the warp is done reading buffer i % NBUF (its operands are in registers): block i + NBUF goes there
        _warp_sync(i)
        _issue(kv0, kc, vc, u0, i + NBUF, total, posv, jv, rem, i, HKV, HD, S, SPLIT, NSPLIT, NB, NBUF, SKIP, SB)
        x = mma_v2(q_c, kt, gl.zeros([4, 16, BLK], gl.float32, MMA)) * qk_scale
        x = gl.where((s * SPLIT + ws + blk * BLK + cs) < end, x, float("-inf"))
        m_new = gl.maximum(m, gl.max(x, axis=2))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)   # no live position yet: no NaN
        alpha = gl.exp2(m - m_use)
        pr = gl.exp2(x - m_use[:, :, None])
        l = l * alpha + gl.sum(pr, axis=2)
        if PROFILE:
            t_s = t_s + (now() - t1)
        acc = mma_v2(gl.convert_layout(pr.to(dt), DA), vb, acc * alpha[:, :, None])
        m = m_new
        if blk == NB - 1:  # the tile's last block: merge the 4 warps' states, store the partial
            if PROFILE:
                t_w = now()
            _merge_tile(scr, m, l, acc, o_part, lse_part, b * HQ + g * R, s, R, RP, HD, NSPLIT)
            if PROFILE:
                t_mw = t_mw + (now() - t_w)
        if SKIP:  # the tile done: the next live one becomes rem's first
            rem = gl.where(blk == NB - 1, drop_first(rem), rem)
    _wait_copies(total, 0)  # the zero-filled copies past the run's end
    if B < 16:  # operand A's padding rows (>= B) of the GEMV tasks' staged tile are zeros again
        barrier()
        xbuf.store(gl.zeros([4, 16, XK], dt, stage_layout(4 * XK)))
    if PROFILE:
        t_a = now()
        gl.store(sub + 1, (t_a - t_l - t_mw) + (t_cw << 32))  # above bit 32: ns in the copy waits
        gl.store(sub + 2, t_mw + (t_s << 32))  # above bit 32: ns from a wait's end to P (loads, S, softmax), issued
    if FOLD:
        _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, jv, posv, R, HD, NSPLIT, NSP2, RP, NGP, SPLIT,
                          SKIP)
    if PROFILE:
        gl.store(sub + 3, (now() - t_a) + (total.to(gl.int64) << 32))
