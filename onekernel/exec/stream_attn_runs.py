"""Which tiles of an attention run hold live positions, and which split each tile computes (the streaming
megakernel's split-KV attention, both bodies: ``exec.stream_attn`` on the CUDA cores, ``exec.stream_attn_tc`` on the
tensor cores).

A run is the consecutive tiles u0 .. u0 + nu - 1 of the plan (``exec.stream_plan``), tile u = (b * Hkv + g) * NSPLIT
+ i. Split s of sequence b covers the cache positions [s * SPLIT, (s + 1) * SPLIT); it holds a live position this
step iff s * SPLIT <= seq_lens[b] (the position this step writes), so a sequence's live splits are the prefix
s <= seq_lens[b] // SPLIT and every other split's partial is (O = 0, lse = -inf), which adds exactly nothing to the
flash-decoding merge (Dao et al., 2023; ops/attention.py).

Where the cache holds at least SKIP_MIN_SPLITS splits per KV head (``skip_dead``: 1024 positions at SPLIT 64, 512
at the SPLIT 32 of groups of more than 4 heads; the folded merge; runs of at most 64 tiles; ``STREAM_ATTN_SKIP=1`` at
any cache length, ``=0`` never):

* a run walks only its live tiles, in run order (``live_mask`` once before the dependency wait; the loop carries the
  mask of the tiles it has not finished, whose lowest bit, ``first_live``, is the current tile), and writes no
  partial for a dead one; the last arrival's merge reads only the live splits' partials and
  takes (0, -inf) for the others (``stream_attn._merge_group``): the values the dead tiles stored before, so the
  merged rows keep their bits;
* where NSPLIT is a power of two, tile i of a group computes split bitrev(i) (``split_of``), so that every run of
  consecutive tiles holds splits spread over the whole cache and the live prefix is spread evenly over the runs: at
  64 splits per KV head with the first 8 live (512 of 4096 positions at SPLIT 64), a run of 4 tiles holds splits
  {0, 32, 16, 48} and at most one or two live ones, where it held splits 0..3, all live, beside runs with none.

Neither changes a tile's operations or their order, nor which tiles are live (a sequence's own position decides), so
a sequence's bits depend neither on its batch nor on the run its tiles fall into (bitwise batch invariance), and they
equal the bits of the walk over every tile (H200, run 31 call 313: logits, tokens and KV rows at caches of 2048).

Why a cache length: the walk costs a little where nothing is dead and saves much where most is (run 31 call 313,
Llama-3.2-1B megakernel, ms at batch 1 / 8 / 16): a cache of 512 positions, all filled (8 splits, the benchmark
tables' case), 0.818 / 0.970 / 1.107 walking every tile against 0.819 / 0.998 / 1.151 skipping; a cache of 4096 with
512 filled (a serving cache), 0.968 / 1.542 / 2.258 against 0.870 / 1.048 / 1.246 (SmolLM2-135M, the CUDA-core body:
0.842 / 1.481 / 2.228 against 0.644 / 0.863 / 1.066). docs/DESIGN.md, "Dead split-KV tiles".
"""
from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from onekernel.errors import InputError

SKIP = gl.constexpr(os.environ.get("STREAM_ATTN_SKIP", "auto"))  # "auto" | "1" | "0"
if SKIP.value not in ("auto", "1", "0"):
    raise InputError(f"STREAM_ATTN_SKIP must be auto, 1 or 0, got {SKIP.value!r}; unset it for the default (auto)")
MAX_SKIP_RUN = 64  # live bits: one int64
SKIP_MIN_SPLITS = 16  # "auto": caches of at least this many splits per KV head


@gluon.constexpr_function
def skip_dead(fold, nta, nsplit):
    """Whether the run skips its dead tiles: the merge folded into the attention tasks (merge tasks, FOLD off, read
    every split's partial), at most MAX_SKIP_RUN tiles per run (NTA), and NSPLIT >= SKIP_MIN_SPLITS ("auto", the
    default) or STREAM_ATTN_SKIP=1; never with STREAM_ATTN_SKIP=0."""
    mode = SKIP.value
    on = mode == "1" or (mode == "auto" and int(nsplit) >= SKIP_MIN_SPLITS)
    return on and bool(fold) and int(nta) <= MAX_SKIP_RUN


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
def live_mask(u0, nu, jv, posv, HKV: gl.constexpr, NSPLIT: gl.constexpr, SPLIT: gl.constexpr, SB: gl.constexpr):
    """(m, nl): bit j of the int64 m set iff the run's tile j < nu holds a live position (its split starts at or
    before the position its sequence writes, posv[j]); nl live tiles. jv, posv: int32 [NTA <= 64] (attn_args)."""
    s = split_of((u0 + jv) % NSPLIT, SB)
    lv = (jv < nu) & (s * SPLIT <= posv)
    one = gl.full(jv.shape, 1, gl.int64, jv.type.layout)
    return gl.sum(gl.where(lv, one << jv.to(gl.int64), 0), axis=0), gl.sum(lv.to(gl.int32), axis=0)


@gluon.jit
def first_live(m):
    """The run index of m's lowest set bit (64 when m is 0): ``brev`` then ``clz``, two instructions."""
    return gl.inline_asm_elementwise("{ .reg .b64 t; brev.b64 t, $1; clz.b64 $0, t; }", "=r,l", [m], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def drop_first(m):
    """m without its lowest set bit: the live tiles after the first."""
    return m & (m - 1)


@gluon.jit
def run_start(u0, nu, jv, posv, HKV: gl.constexpr, NSPLIT: gl.constexpr, SPLIT: gl.constexpr, SB: gl.constexpr,
              SKIP: gl.constexpr):
    """(rem, nl, j0) of a run before its loop: the int64 mask of the live tiles it has yet to compute (live_mask;
    unused without SKIP), how many, and the run index of the first (tile 0 without SKIP or without a live tile: its
    loads are masked off, its split being dead)."""
    if SKIP:
        rem, nl = live_mask(u0, nu, jv, posv, HKV, NSPLIT, SPLIT, SB)
        return rem, nl, gl.where(nl > 0, first_live(rem), 0)
    else:
        return u0.to(gl.int64) * 0, nu, 0


@gluon.jit
def block_tile(rem, i, idx, NB: gl.constexpr, SKIP: gl.constexpr):
    """The run index of the tile of the run's block idx (NB blocks a tile) while the loop is at block i <= idx, at
    most two tiles ahead: idx // NB without SKIP; with SKIP the (idx // NB - i // NB)-th live tile of rem (the tiles
    from block i's on)."""
    if SKIP:
        d = idx // NB - i // NB
        r1 = drop_first(rem)
        return first_live(gl.where(d == 0, rem, gl.where(d == 1, r1, drop_first(r1))))
    else:
        return idx // NB
