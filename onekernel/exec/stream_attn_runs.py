"""Which tiles of an attention run hold live positions, and which split each tile computes (the streaming
megakernel's split-KV attention, both bodies: ``exec.stream_attn`` on the CUDA cores, ``exec.stream_attn_tc`` on the
tensor cores).

A run is the consecutive tiles u0 .. u0 + nu - 1 of the plan (``exec.stream_plan``), tile u = (b * Hkv + g) * NSPLIT
+ i. Split s of sequence b covers the cache positions [s * SPLIT, (s + 1) * SPLIT); it holds a live position this
step iff s * SPLIT <= seq_lens[b] (the position this step writes), so a sequence's live splits are the prefix
s <= seq_lens[b] // SPLIT and every other split's partial is (O = 0, lse = -inf), which adds exactly nothing to the
flash-decoding merge (Dao et al., 2023; ops/attention.py).

With ``SKIP`` (``skip_dead``: the measurement switch ``STREAM_ATTN_SKIP``, default on, the folded merge, runs of at
most 64 tiles):

* a run walks only its live tiles, in run order (``live_bits`` once before the dependency wait, ``nth_live`` per
  block), and writes no partial for a dead one; the last arrival's merge reads only the live splits' partials and
  takes (0, -inf) for the others (``stream_attn._merge_group``): the values the dead tiles stored before, so the
  merged rows keep their bits;
* where NSPLIT is a power of two, tile i of a group computes split bitrev(i) (``split_of``), so that every run of
  consecutive tiles holds splits spread over the whole cache and the live prefix is spread evenly over the runs: at a
  cache of 4096 positions with 512 filled, a run of 4 tiles holds splits {0, 32, 16, 48} and at most one or two live
  ones, where it held splits 0..3, all live, beside runs with none.

Neither changes a tile's operations or their order, nor which tiles are live (a sequence's own position decides), so
a sequence's bits depend neither on its batch nor on the run its tiles fall into (bitwise batch invariance).
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

SKIP = gl.constexpr(os.environ.get("STREAM_ATTN_SKIP", "1") == "1")
MAX_SKIP_RUN = 64  # live bits: two 32-bit words


@gluon.constexpr_function
def skip_dead(fold, nta):
    """Whether the run skips its dead tiles: the switch on, the merge folded into the attention tasks (merge tasks,
    FOLD off, read every split's partial) and at most MAX_SKIP_RUN tiles per run (NTA)."""
    return bool(SKIP) and bool(fold) and int(nta) <= MAX_SKIP_RUN


@gluon.constexpr_function
def split_bits(nsplit, skip):
    """log2(NSPLIT) where the splits are permuted (skip on, NSPLIT a power of two > 1), else 0 (identity)."""
    n = int(nsplit)
    return n.bit_length() - 1 if skip and n > 1 and n & (n - 1) == 0 else 0


@gluon.jit
def split_of(i, SB: gl.constexpr):
    """The split computed by a group's tile i: bitrev(i) over SB bits (SB = split_bits), i itself when SB is 0."""
    if SB == 0:
        return i
    else:
        r = gl.inline_asm_elementwise("brev.b32 $0, $1;", "=r,r", [i], dtype=gl.int32, is_pure=True, pack=1)
        return (r >> (32 - SB)) & ((1 << SB) - 1)


@gluon.jit
def tile_coords(tile, HKV: gl.constexpr, NSPLIT: gl.constexpr, SB: gl.constexpr):
    """(b, g, s) of attention tile (b * HKV + g) * NSPLIT + i: s = split_of(i)."""
    return tile // (HKV * NSPLIT), (tile // NSPLIT) % HKV, split_of(tile % NSPLIT, SB)


@gluon.jit
def live_bits(u0, nu, jv, posv, HKV: gl.constexpr, NSPLIT: gl.constexpr, SPLIT: gl.constexpr, SB: gl.constexpr):
    """(lo, hi, nl): bit j of lo (hi: j - 32) set iff the run's tile j < nu holds a live position (its split starts
    at or before the position its sequence writes, posv[j]); nl live tiles. jv, posv: int32 [NTA] (attn_args)."""
    s = split_of((u0 + jv) % NSPLIT, SB)
    lv = (jv < nu) & (s * SPLIT <= posv)
    lo = gl.sum(gl.where(lv & (jv < 32), 1 << (jv & 31), 0), axis=0)
    hi = gl.sum(gl.where(lv & (jv >= 32), 1 << (jv & 31), 0), axis=0)
    return lo, hi, gl.sum(lv.to(gl.int32), axis=0)


@gluon.jit
def nth_live(k, lo, hi):
    """The run index of the run's k-th live tile (k from 0; ``fns``: the position of the (k + 1)-th set bit of lo,
    else of the (k + 1 - popc(lo))-th of hi, plus 32). Meaningless for k >= nl (the callers mask those blocks)."""
    return gl.inline_asm_elementwise(
        "{ .reg .u32 c, x, y; .reg .s32 o; .reg .pred p; popc.b32 c, $2; setp.lt.u32 p, $1, c; add.s32 o, $1, 1; "
        "fns.b32 x, $2, 0, o; sub.s32 o, o, c; fns.b32 y, $3, 0, o; add.u32 y, y, 32; selp.b32 $0, x, y, p; }",
        "=r,r,r,r", [k, lo, hi], dtype=gl.int32, is_pure=True, pack=1)
