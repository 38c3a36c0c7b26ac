"""The streaming megakernel's small task bodies that read no streamed weights: the embedding gather, the argmax
over the LM head's per-task partials and (tensor parallel) the all-reduce of the ranks' partial rows. Math and
tiles as ops/embed.py, ops/lm_head.py and ops/allreduce.py; attention is ``exec.stream_attn``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.exec.stream_base import F_RES, F_SYS, F_TILE, push_rows
from onekernel.ops.gemv_rows import rnd


@gluon.jit
def embed_task(rec, a, base_t, base_i, B: gl.constexpr, V: gl.constexpr, D: gl.constexpr, BD: gl.constexpr,
               pdelta=None, PUSH: gl.constexpr = False, NR: gl.constexpr = 1):
    """out[b, cols] = table[tokens[b], cols] for the tile's BD columns (a token outside [0, V) gives zeros).
    PUSH (tensor parallel): rows a peer's all-reduce reads (the record's F_SYS) also go into every peer's pool
    (stream_base.push_rows)."""
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
        if PUSH:
            if gl.load(rec + F_SYS) != 0:
                push_rows(out + b * D + cols, v, cols < D, pdelta, NR)


@gluon.constexpr_function
def _argmax_cols(bp):
    """Tasks per argmax pass: 1024 at batch 1 (as before), fewer at a padded batch bp (4096 values per pass)."""
    return min(1024, 4096 // bp)


@gluon.jit
def argmax_task(a, base_f, base_i, B: gl.constexpr, BP: gl.constexpr, NT: gl.constexpr):
    """next_tokens[b] = pidx[b, t*], t* the smallest t maximising pmax[b, t] (= torch.argmax of the logits). Every
    batch row at once (one L2 round trip for the maxima, one for the indices; row by row it took 11 us at batch 16),
    each row's maximum and first index over CT tasks at a time as before, so the same selection. BP: B padded to a
    power of two (the plan's constant)."""
    CT: gl.constexpr = _argmax_cols(BP)
    L2: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])
    pmax = base_f + gl.load(a) * 4
    pidx = base_i + gl.load(a + 1) * 4
    out = base_i + gl.load(a + 2) * 4
    b = gl.arange(0, BP, layout=gl.SliceLayout(1, L2))
    best = gl.full([BP], float("-inf"), gl.float32, gl.SliceLayout(1, L2))
    bi = gl.zeros([BP], gl.int32, gl.SliceLayout(1, L2))
    for t0 in range(0, NT, CT):
        ot = t0 + gl.arange(0, CT, layout=gl.SliceLayout(0, L2))[None, :]
        v = gl.load(pmax + b[:, None] * NT + ot, mask=(b[:, None] < B) & (ot < NT), other=float("-inf"),
                    cache_modifier=".cg")
        cm = gl.max(v, axis=1)
        ci = gl.min(gl.where(v == cm[:, None], ot, 2147483647), axis=1)
        gi = gl.load(pidx + b * NT + ci, mask=(b < B) & (ci < NT), other=0, cache_modifier=".cg")
        upd = cm > best
        best = gl.where(upd, cm, best)
        bi = gl.where(upd, gi, bi)
    gl.store(out + b, bi, mask=b < B)


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
    ``ld.acquire.sys`` (stream_base.wait_remote), as ops/allreduce.py's loads (``volatile=True``: Gluon and Triton
    3.6 drop ``cache_modifier=".cv"``, a plain ``ld.global`` in the sm_90a PTX); the residual with ``.cg``."""
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
