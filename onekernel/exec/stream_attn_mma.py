"""The streaming megakernel's split-KV attention partials on the tensor cores (Gluon, sm_90; ``gemv="mma"`` steps,
``consts["ATTN_CP"] > 0``): the same tiles, runs, partials and merge as ``exec.stream_tasks.attn_task`` (ops/attention.py's
math: O_s = sum_j exp(x_j - lse_s) v_j, lse_s = log sum_j exp(x_j), x_j = scale q.k_j; empty split: 0, -inf), computed
as flash-attention computes a block (Dao, "FlashAttention-2", 2023, algorithm 1, for one query row per head):

* the tile's K and V rows go to shared memory in chunks of CP positions, double-buffered in the free staged-activation
  tile ``xbuf`` (cp.async; the first chunk through registers, loaded before the dependency wait with the row this step
  writes patched in after it);
* S [64, CP] = Q [64, HD] @ K^T and O [64, HD] += P [64, CP] @ V with ``mma.sync`` m16n8k16 (bf16 / fp16 operands,
  fp32 accumulators), K^T and V read by ``ldmatrix`` (V transposed); row 16 w + i of warp w is query head w + 4 i of
  the group (R <= 64 heads; the other rows are zero padding), so every warp reads the whole chunk and each head's
  online softmax (exp2, fp32) lives in one warp: no merge across warps, one CTA barrier per chunk;
* P is rounded to the operand dtype for the second product (as FlashAttention does), the rest stays fp32.

A tile's operations and their order depend only on its (sequence, head group, split), never on its run or the
batch: bitwise batch invariance as the CUDA-core body. docs/DESIGN.md, "Attention on the tensor cores".
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from onekernel.exec.stream_base import F_NU, F_U0, barrier, now, view, wait_deps
from onekernel.exec.stream_mma import stage_layout
from onekernel.exec.stream_tasks import _arrive_and_merge, _pick, _tile_coords


NBUF = gl.constexpr(4)  # K/V chunks in the ring: NBUF - 1 in flight while one is computed
# STREAM_ATTN_MMA=0 keeps the CUDA-core attention (stream_tasks.attn_task) on tensor-core steps, for a measurement
ATTN_MMA = os.environ.get("STREAM_ATTN_MMA", "1") == "1"


def attn_chunk(ck: int, hd: int, split: int, hq: int, hkv: int, mma: bool) -> int:
    """CP: K/V positions per shared-memory chunk of the tensor-core attention (two chunks of K and V fill the staged
    activation tile, 32 * CK bytes: CP = 4 CK / HD), or 0 where it does not apply (the CUDA-core attention runs): a
    CUDA-core GEMV step, a head dim that is not a multiple of 16, more than 64 query heads per KV head, or a chunk
    below 16 positions (one MMA k-step), above the split or not dividing it."""
    cp = 4 * ck // max(hd, 1) // (int(NBUF) // 2)  # NBUF chunks of K and V fill the tile
    if not mma or hd % 16 or hq // max(hkv, 1) > 64 or cp < 16 or cp > split or split % cp:
        return 0
    return cp


def attn_cp(consts: dict) -> int:
    """The kernel constant ATTN_CP of a plan's constants (attn_chunk; 0 with STREAM_ATTN_MMA=0)."""
    if not ATTN_MMA:
        return 0
    return attn_chunk(consts["CK"], consts["HD"], consts["SPLIT"], consts["HQ"], consts["HKV"], bool(consts.get("MMA")))


@gluon.constexpr_function
def _copy_layout(HD):
    """[CP, HD] copy layout: 8 consecutive head-dim elements (16 bytes) per thread, rows over lanes and warps."""
    TD = min(32, HD // 8)
    return gl.BlockedLayout([1, 8], [32 // TD, TD], [4, 1], [1, 0])


@gluon.jit
def _chunk_rows(u0, c, nch, posv, jv, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
                NSPLIT: gl.constexpr, CP: gl.constexpr, NC: gl.constexpr):
    """(offsets [CP, HD] of chunk c's K/V rows in the cache, live mask, this step's row mask) of the run's chunk c:
    tile u0 + c // NC, positions s*SPLIT + (c % NC)*CP + [0, CP), live below the tile's end (none for c >= nch)."""
    CL: gl.constexpr = _copy_layout(HD)
    j = c // NC
    b, g, s = _tile_coords(u0 + j, HKV, NSPLIT)
    pos = _pick(posv, jv, j)
    end = gl.minimum(gl.minimum(pos + 1, s * SPLIT + SPLIT), S)
    rows = s * SPLIT + (c % NC) * CP + gl.arange(0, CP, layout=gl.SliceLayout(1, CL))[:, None]
    d = gl.arange(0, HD, layout=gl.SliceLayout(0, CL))[None, :]
    off = (b * HKV + g).to(gl.int64) * (S * HD) + rows * HD + d
    live = (rows < end) & (c < nch) & (d < HD)
    return off, live, rows == pos


@gluon.jit
def _issue(kv, kc, vc, u0, c, nch, posv, jv, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
           SPLIT: gl.constexpr, NSPLIT: gl.constexpr, CP: gl.constexpr, NC: gl.constexpr, NB: gl.constexpr):
    """cp.async copies of chunk c's K and V rows into buffer c % 2 of ``kv`` [4, CP, HD] (K at 2 (c % 2), V after it;
    dead rows: zero-filled),
    one commit group (empty past the run's end)."""
    off, live, _ = _chunk_rows(u0, c, nch, posv, jv, HKV, HD, S, SPLIT, NSPLIT, CP, NC)
    async_copy.async_copy_global_to_shared(kv.index(2 * (c % NB)), kc + off, mask=live, cache_modifier=".cg")
    async_copy.async_copy_global_to_shared(kv.index(2 * (c % NB) + 1), vc + off, mask=live, cache_modifier=".cg")
    async_copy.commit_group()


@gluon.jit
def _prefetch_l2(p, nbytes, pred):
    """``cp.async.bulk.prefetch.L2`` of nbytes (a multiple of 16) at p where pred (elementwise; a hint)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [p, nbytes, pred.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _q_operand(q, u0, j, ok, rq, dq, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, NSPLIT: gl.constexpr):
    """Q [64, HD] of the run's tile j as operand A: row 16 w + i = query head w + 4 i of the tile's group (0 for
    heads >= R, or unless ok)."""
    R: gl.constexpr = HQ // HKV
    b, g, s = _tile_coords(u0 + j, HKV, NSPLIT)
    h = rq // 16 + 4 * (rq % 16)
    return gl.load(q + (b * HQ + g * R + h) * HD + dq, mask=(h < R) & ok & (dq < HD), other=0.0,
                   cache_modifier=".cg")


@gluon.jit
def attn_task_mma(rec, a, base_t, base_f, base_i, wl, ev_cnt, err, prof, epoch, t, xbuf, PROFILE: gl.constexpr,
                  WAIT_NS: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr, HD: gl.constexpr, S: gl.constexpr,
                  SPLIT: gl.constexpr, NSPLIT: gl.constexpr, RP: gl.constexpr, SM_SCALE: gl.constexpr,
                  NTA: gl.constexpr, FOLD: gl.constexpr, NSP2: gl.constexpr, NGP: gl.constexpr, CP: gl.constexpr,
                  B: gl.constexpr, sub=None):
    """Split-KV partials of the run of tiles [u0, u0 + nu) (record F_U0 / F_NU) on the tensor cores (module doc),
    then, with FOLD, the run's arrival and the last arrival's merge (stream_tasks._arrive_and_merge). ``xbuf``: the
    staged activation tile [4, 16, CK/4] (32 * CK bytes), free between GEMV tasks, viewed as K/V [4, CP, HD] (two buffers);
    zeroed again at the end where the batch pads operand A (B < 16). PROFILE: ``sub`` as attn_task's (ns to the
    loop, ns in the loop, 0, ns arriving and merging + chunks << 32)."""
    R: gl.constexpr = HQ // HKV
    NC: gl.constexpr = SPLIT // CP
    dt: gl.constexpr = xbuf.dtype
    XK: gl.constexpr = xbuf.shape[2]
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    DA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    DB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    CL: gl.constexpr = _copy_layout(HD)
    KVL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
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
    nch = nu * NC
    NB: gl.constexpr = NBUF
    kv = view(xbuf, dt, [2 * NB, CP, HD], KVL)  # K, V of buffer 0, then of buffer 1, ...
    # every live K/V row of the run into L2 at once (one bulk prefetch per tile and tensor), so the ring's copies
    # wait on L2, not HBM
    jt = gl.arange(0, 128, layout=V1)
    bt, gt, st = _tile_coords(u0 + jt, HKV, NSPLIT)
    et = gl.minimum(gl.minimum(gl.load(seq + (u0 + jt) // (HKV * NSPLIT), mask=jt < nu, other=0,
                                       cache_modifier=".cg") + 1, st * SPLIT + SPLIT), S)
    nbytes = gl.maximum(et - st * SPLIT, 0) * (HD * 2)
    toff = ((bt * HKV + gt).to(gl.int64) * S + st * SPLIT) * HD
    pl = (jt < nu) & (nbytes > 0)
    _prefetch_l2(kc + toff, nbytes, pl)
    _prefetch_l2(vc + toff, nbytes, pl)
    rq = gl.arange(0, 64, layout=gl.SliceLayout(1, DA))[:, None]
    dq = gl.arange(0, HD, layout=gl.SliceLayout(0, DA))[None, :]
    rs = gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
    cs = gl.arange(0, CP, layout=gl.SliceLayout(0, MMA))[None, :]
    ds = gl.arange(0, HD, layout=gl.SliceLayout(0, MMA))[None, :]
    hs = rs // 16 + 4 * (rs % 16)
    # chunk 0 before the wait: its old rows (every row but seq_lens[b], which this step's qkv task writes)
    off, live, cur = _chunk_rows(u0, 0, nch, posv, jv, HKV, HD, S, SPLIT, NSPLIT, CP, NC)
    k0 = gl.load(kc + off, mask=live & (cur == 0), other=0.0, cache_modifier=".cg")
    v0 = gl.load(vc + off, mask=live & (cur == 0), other=0.0, cache_modifier=".cg")
    wait_deps(rec, wl, ev_cnt, err, prof, epoch, t, PROFILE, WAIT_NS)
    if PROFILE:
        t_r = now()
    k0 = gl.where(cur, gl.load(kc + off, mask=live & cur, other=0.0, cache_modifier=".cg"), k0)
    v0 = gl.where(cur, gl.load(vc + off, mask=live & cur, other=0.0, cache_modifier=".cg"), v0)
    q_c = _q_operand(q, u0, 0, nu > 0, rq, dq, HQ, HKV, HD, NSPLIT)
    q_n = q_c
    barrier()  # xbuf: the previous task's reads are done
    kv.index(0).store(k0)
    kv.index(1).store(v0)
    for c1 in gl.static_range(1, NB):
        _issue(kv, kc, vc, u0, c1, nch, posv, jv, HKV, HD, S, SPLIT, NSPLIT, CP, NC, NB)
    barrier()  # chunk 0 visible to every warp
    m = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, MMA))
    l = gl.zeros([64], gl.float32, gl.SliceLayout(1, MMA))
    acc = gl.zeros([64, HD], gl.float32, MMA)
    qk_scale = SM_SCALE * 1.4426950408889634
    if PROFILE:
        t_l = now()
        gl.store(sub, t_l - t_r)
    for c in range(nch):
        j = c // NC
        sc = c % NC
        b, g, s = _tile_coords(u0 + j, HKV, NSPLIT)
        end = gl.minimum(gl.minimum(_pick(posv, jv, j) + 1, s * SPLIT + SPLIT), S)
        # a new tile: its q (loaded during the previous chunk) and a fresh state (selects: stream_tasks.attn_task)
        first = sc == 0
        q_c = gl.where(first & (c > 0), q_n, q_c)
        m = gl.where(first, float("-inf"), m)
        l = gl.where(first, 0.0, l)
        acc = gl.where(first, 0.0, acc)
        q_n = _q_operand(q, u0, j + 1, (sc == NC - 1) & (j + 1 < nu), rq, dq, HQ, HKV, HD, NSPLIT)
        kt = kv.index(2 * (c % NB)).permute([1, 0]).load(DB)   # K^T [HD, CP]
        x = mma_v2(q_c, kt, gl.zeros([64, CP], gl.float32, MMA)) * qk_scale
        x = gl.where((s * SPLIT + sc * CP + cs) < end, x, float("-inf"))
        m_new = gl.maximum(m, gl.max(x, axis=1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)   # no live position yet: no NaN
        alpha = gl.exp2(m - m_use)
        p = gl.exp2(x - m_use[:, None])
        l = l * alpha + gl.sum(p, axis=1)
        vb = kv.index(2 * (c % NB) + 1).load(DB)               # V [CP, HD]
        acc = mma_v2(gl.convert_layout(p.to(dt), DA), vb, acc * alpha[:, None])
        m = m_new
        if sc == NC - 1:  # the tile's partial: its R heads' rows
            nonempty = l > 0.0
            tsafe = gl.where(nonempty, l, 1.0)
            row = (b * HQ + g * R + hs) * NSPLIT + s
            gl.store(o_part + row[:, None] * HD + ds, acc / tsafe[:, None], mask=(hs < R)[:, None] & (ds < HD))
            gl.store(lse_part + row, gl.where(nonempty, (m + gl.log2(tsafe)) * 0.6931471805599453, float("-inf")),
                     mask=hs < R)
        # chunk c + 1 landed (this thread's copies: NB - 2 later groups may be pending; the barrier: every
        # thread's), and every warp is done with buffer c % NB, which takes chunk c + NB
        async_copy.wait_group(NB - 2)
        barrier()
        _issue(kv, kc, vc, u0, c + NB, nch, posv, jv, HKV, HD, S, SPLIT, NSPLIT, CP, NC, NB)
    async_copy.wait_group(0)
    if B < 16:  # operand A's padding rows (>= B) of the GEMV tasks' staged tile are zeros again
        barrier()
        xbuf.store(gl.zeros([4, 16, XK], dt, stage_layout(4 * XK)))
    if PROFILE:
        t_a = now()
        gl.store(sub + 1, t_a - t_l)
        gl.store(sub + 2, t_a * 0)
    if FOLD:
        _arrive_and_merge(a, base_t, base_i, o_part, lse_part, u0, nu, R, HD, NSPLIT, NSP2, RP, NGP)
    if PROFILE:
        gl.store(sub + 3, (now() - t_a) + (nch.to(gl.int64) << 32))
