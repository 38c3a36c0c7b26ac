"""Prototype: how close can a persistent plain-``triton.language`` kernel get to copy bandwidth when it streams
GEMV weights across task boundaries and dependency waits? (Problem, check, timing: common.py; Gluon counterpart:
gluon_stream.py; background: shared/research/streaming.md.)

Work: row groups of R = common.ROW_GROUP = 8 rows, split per stage into W byte-balanced tiles (common.tile_groups;
some empty when a stage has fewer than W groups); worker w (one CTA) runs tile w of every stage in stage order.
A chunk, a row group's [R, BK] bf16 slice (BK = chunk bytes / 16), is multiplied elementwise into an fp32
accumulator; the rows are reduced once per row group after its last k-chunk (k order fixed: an output depends
only on its row, BK and the layout). Dependencies: one int32 counter per stage, monotonic across launches; a
worker starting stage s > 0 spins (``ld.acquire.gpu`` in every thread, bounded, error flag on timeout) until
counter[s-1] >= W * epoch, then a CTA barrier; after its tile a CTA barrier and one release add on counter[s].
The last worker to finish bumps the epoch (as onekernel/exec/megakernel_src.py does).

Variants:
* ``pertask``: the tile's chunks double-buffered in registers, the first one loaded before the wait; the pipe
  drains at every task boundary.
* ``flat``: ONE ``tl.range(0, n_chunks, num_stages=S)`` loop per worker over all its chunks, packed by the host
  into one contiguous stream (stage, group, k-chunk order; a zero chunk per empty tile), so Triton's pipeliner
  turns the weight load into an (S-1)-deep cp.async ring that runs ahead across task boundaries and waits. The
  task state is loop-carried arithmetic; the wait, x loads, reductions, stores and signal sit in ``scf.if``
  blocks, which the pipeliner leaves alone (x is never read before its wait); x chunks are prefetched by hand in
  a register ring of XAHEAD, within the current task.
* ``nodeps``: ``flat`` without the waits (the streaming ceiling; racy outputs, error for information only).
* ``copy``: the packed bytes summed by the same pipelined loop (sanity ceiling).

Chunk layout. Default: a [R, 1, BK] tensor; Triton gives a warp 256 consecutive columns (32 lanes x 16 bytes)
and spreads each row over all warps, so every row group's reduction crosses warps (shared memory, 2 bar.sync),
as does the store's layout change (2 more): once per chunk where K = BK (Llama-1B at 32 KB). ``--defer``:
a [R, BK/256, 256] tensor, which Triton gives to warps row by row: the reduction stays in the warp (shuffles),
the row's warp stores it with an inline-asm ``st.global`` (no layout change), and every warp reads x itself,
through L1 (``.ca``; fresh: each thread's ld.acquire.gpu invalidates L1 in the SASS).

    python scripts/stream_proto/tl_stream.py --preset llama-1b --variant flat --chunk-kb 32 --defer   # H200
    python scripts/stream_proto/tl_stream.py --sweep --out stream_tl.json     # the SWEEP grid, 1B and 8B
Without a GPU: ``--compile-only [--sweep]`` (sm_90 via scripts/compile_check.py: registers, spills, shared
memory, v4 loads, cp.async and bar.sync counts, pipelined loads; TTGIR/PTX in --dump-dir), and
``TRITON_INTERPRET=1 ... --preset tiny --workers 1 --device cpu --dtype fp32`` (see check_tl_stream.py).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from itertools import accumulate
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (ROW_GROUP, TOL, base_parser, check_stages, copy_bandwidth_gbs, make_weights,  # noqa: E402
                    stages_for, tile_groups, time_launches)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
SPIN_LIMIT = 1 << 16 if INTERPRET else 1 << 26
R = ROW_GROUP
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# ------------------------------------------------------------------------------------------- device helpers
@triton.jit
def _poll(p, ASM: tl.constexpr):
    """One int32 read of a counter: ``ld.acquire.gpu`` (GPU; this thread's later loads are ordered after it, and
    the SASS invalidates L1), or a volatile load (interpreter, no inline asm)."""
    if ASM:
        return tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [p], dtype=tl.int32,
                                         is_pure=False, pack=1)
    else:
        return tl.load(p, volatile=True)


@triton.jit
def _barrier(ASM: tl.constexpr):
    """CTA barrier. ASM (GPU): ``bar.sync 0`` as inline asm, because Triton's loop scheduler refuses to pipeline
    any loop that contains a ``gpu.barrier`` (``tl.debug_barrier``), even one nested in an ``scf.if``."""
    if ASM:
        tl.inline_asm_elementwise("bar.sync 0;\n\tmov.u32 $0, 0;", "=r,r", [0], dtype=tl.int32, is_pure=False,
                                  pack=1)
    else:
        tl.debug_barrier()


@triton.jit
def _wait(cnt_ptr, want, stage, err, spin_limit, ASM: tl.constexpr):
    """Bounded spin until ``*cnt_ptr >= want``, then a CTA barrier. On timeout (or when another worker already
    failed) it gives up and records (1, stage, seen, want) in err[0:4] (best effort). The interpreter's volatile
    polls are followed by one acquire read-modify-write."""
    seen = _poll(cnt_ptr, ASM)
    n = 0
    bad = tl.load(err, volatile=True)
    while (seen < want) & (n < spin_limit) & (bad == 0):
        seen = _poll(cnt_ptr, ASM)
        bad = tl.load(err, volatile=True)
        n += 1
    if not ASM:
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    if (seen < want) & (bad == 0):  # plain scalar stores: warps may disagree about a timeout
        tl.store(err + 1, stage)
        tl.store(err + 2, seen)
        tl.store(err + 3, want)
        tl.store(err, 1)
    _barrier(ASM)


@triton.jit
def _signal(cnt, stage, ASM: tl.constexpr):
    """CTA barrier (every thread's stores of the tile are done), then one release add on counter[stage]."""
    _barrier(ASM)
    tl.atomic_add(cnt + stage, 1, sem="release", scope="gpu")


@triton.jit
def _finish(epoch_ptr, done_ptr, n_workers, epoch):
    """The last worker of this launch bumps the epoch (counters stay monotonic across launches)."""
    done = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if done == n_workers * epoch - 1:
        tl.atomic_add(epoch_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _cols(act, BK: tl.constexpr, DEFER: tl.constexpr):
    """Column of each chunk element, int32 [1, NB, CB] = the BK columns as NB blocks of CB: CB = BK, or with DEFER
    the 512 bytes a warp reads per row (256 bf16, 128 fp32) when BK is wider."""
    EB: tl.constexpr = act.dtype.element_ty.primitive_bitwidth // 8
    CB: tl.constexpr = 512 // EB if DEFER and BK * EB > 512 else BK
    return tl.arange(0, BK // CB)[None, :, None] * CB + tl.arange(0, CB)[None, None, :]


@triton.jit
def _load_x(act, xo, c, cols, ok, R: tl.constexpr, BK: tl.constexpr, DEFER: tl.constexpr):
    """x chunk c of a task, ``act[8 xo + c BK + cols]`` (0 if not ok) in act's dtype; xo counts 8 elements, so
    the loads are known 16-byte aligned (v4). Default: [1, NB, CB] in the weight tile's layout, ``.cg`` (L2, never
    a stale L1 line). DEFER: [R, NB, CB], the same x for every row (each row's warp loads it), ``.ca`` (L1)."""
    p = act + xo * 8 + c * BK + cols
    if DEFER:
        return tl.load(tl.broadcast_to(p, [R, p.shape[1], p.shape[2]]), mask=ok, other=0.0, cache_modifier=".ca")
    else:
        return tl.load(p, mask=ok, other=0.0, cache_modifier=".cg")


@triton.jit
def _store_rows(out, acc, ASM: tl.constexpr, DEFER: tl.constexpr):
    """out[0:R] = row sums of acc ([R, NB, CB] fp32; blocks first, then columns) in out's dtype. DEFER on the GPU:
    every lane of the row's warp stores the same bf16 to the same address (one transaction) by inline asm, as
    ``tl.store`` would first move the sums into a 1-D layout through shared memory."""
    y = tl.sum(tl.sum(acc, axis=1), axis=1).to(out.dtype.element_ty)
    rows = tl.arange(0, acc.shape[0])
    if ASM and DEFER:
        tl.inline_asm_elementwise("st.global.b16 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,h",
                                  [(out + rows).to(tl.int64), y.to(tl.int16, bitcast=True)], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.store(out + rows, y)


@triton.jit
def _flat_task(tasks, wid, s, n_stages):
    """Task (wid, s) as the flat loop runs it: (k-chunks per group, chunks, x offset/8, out offset/8 or -1).
    An empty tile is one dummy chunk (the host packs zeros there) with no store. Zeros when s >= n_stages."""
    ok = s < n_stages
    t = tasks + (wid * n_stages + s) * 5
    ng, nk = tl.load(t, mask=ok, other=0), tl.load(t + 1, mask=ok, other=1)
    xo, oo = tl.load(t + 2, mask=ok, other=0), tl.load(t + 3, mask=ok, other=0)
    empty = ng == 0
    return tl.where(empty, 1, nk), tl.where(empty, 1, ng * nk), xo, tl.where(empty, -1, oo)


# ------------------------------------------------------------------------------------------------- kernels
@triton.jit
def pertask_kernel(wall, tasks, act, cnt, epoch_ptr, done_ptr, err, n_stages, n_workers, spin_limit,
                   R: tl.constexpr, BK: tl.constexpr, DEFER: tl.constexpr, ASM: tl.constexpr):
    """Today's approach. wall: every stage's row-major [N, K] weights; tasks: int32 [W, S, 5] (see Split);
    act: activations (input, then out_0 .. out_{S-1}); cnt: int32 [S]; epoch/done: int32 [1]; err: int32 [4].
    Per task: chunk 0 loaded, wait, then chunk j+1 is loaded before chunk j is used; x re-read per chunk."""
    wid = tl.program_id(0)
    epoch = tl.load(epoch_ptr, volatile=True)
    rows = tl.arange(0, R)[:, None, None]
    cols = _cols(act, BK, DEFER)
    for s in range(n_stages):
        t = tasks + (wid * n_stages + s) * 5
        ng, nk, xo, oo = tl.load(t), tl.load(t + 1), tl.load(t + 2), tl.load(t + 3)
        wt = wall + tl.load(t + 4).to(tl.int64) * 8  # the tile's first row
        K, n = nk * BK, ng * nk
        wv = tl.load(wt + rows * K + cols, mask=n > 0, other=0.0, eviction_policy="evict_first")
        if s > 0:
            _wait(cnt + s - 1, n_workers * epoch, s, err, spin_limit, ASM)
        acc = tl.zeros(wv.shape, tl.float32)
        for j in range(n):
            g = j // nk
            c = j - g * nk
            gn = (j + 1) // nk
            nxt = tl.load(wt + (gn * R + rows) * K + (j + 1 - gn * nk) * BK + cols, mask=j + 1 < n, other=0.0,
                          eviction_policy="evict_first")
            acc += _load_x(act, xo, c, cols, True, R, BK, DEFER).to(tl.float32) * wv.to(tl.float32)
            if c == nk - 1:
                _store_rows(act + (oo + g * (R // 8)) * 8, acc, ASM, DEFER)
                acc = tl.zeros(wv.shape, tl.float32)
            wv = nxt
        _signal(cnt, s, ASM)
    _finish(epoch_ptr, done_ptr, n_workers, epoch)


@triton.jit
def flat_kernel(wstream, woff, tasks, act, cnt, epoch_ptr, done_ptr, err, n_stages, n_workers, spin_limit,
                R: tl.constexpr, BK: tl.constexpr, XAHEAD: tl.constexpr, STAGES: tl.constexpr,
                DEPS: tl.constexpr, DEFER: tl.constexpr, ASM: tl.constexpr):
    """One software-pipelined loop over the worker's chunks. wstream: the packed chunks ([R, BK] row-major each);
    woff: int32 [W+1] first chunk of each worker; other args as ``pertask_kernel``.
    Loop-carried: s (stage), c (k-chunk in the row group), left (chunks left in the task, >= 1), nk, xo/oo (x
    offset, current group's out offset, /8), the next task's (nk, left, xo, oo) read at this task's start, acc
    (fp32, one row group), ring: XAHEAD x chunks (ring[k] = x of chunk i+k, read after this task's wait)."""
    wid = tl.program_id(0)
    epoch = tl.load(epoch_ptr, volatile=True)
    cols = _cols(act, BK, DEFER)
    tile = tl.arange(0, R)[:, None, None] * BK + cols
    XR: tl.constexpr = R if DEFER else 1
    first_chunk = tl.load(woff + wid)
    n = tl.load(woff + wid + 1) - first_chunk
    wbase = wstream + first_chunk.to(tl.int64) * (R * BK)
    nk, left, xo, oo = _flat_task(tasks, wid, 0, n_stages)
    n_nk, n_left, n_xo, n_oo = nk, left, xo, oo
    s, c, first = 0, 0, 1
    acc = tl.zeros(tile.shape, tl.float32)
    ring = ()
    for k in tl.static_range(XAHEAD):
        ring = ring + (tl.zeros([XR, cols.shape[1], cols.shape[2]], act.dtype.element_ty),)
    for i in tl.range(0, n, num_stages=STAGES):
        w = tl.load(wbase + i * (R * BK) + tile, eviction_policy="evict_first")  # the only pipelined load
        if first == 1:
            if DEPS:
                if s > 0:
                    _wait(cnt + s - 1, n_workers * epoch, s, err, spin_limit, ASM)
            ring = ()
            for k in tl.static_range(XAHEAD):
                ring = ring + (_load_x(act, xo, k % nk, cols, k < left, R, BK, DEFER),)
            n_nk, n_left, n_xo, n_oo = _flat_task(tasks, wid, s + 1, n_stages)
        acc += ring[0].to(tl.float32) * w.to(tl.float32)
        if c == nk - 1:
            if oo >= 0:
                _store_rows(act + oo * 8, acc, ASM, DEFER)
            acc = tl.zeros(tile.shape, tl.float32)
            oo += R // 8
        if left == 1:
            _signal(cnt, s, ASM)
            nk, left, xo, oo = n_nk, n_left, n_xo, n_oo
            s, c, first = s + 1, 0, 1
        else:
            ring = ring[1:] + (_load_x(act, xo, (c + XAHEAD) % nk, cols, XAHEAD < left, R, BK, DEFER),)
            c, left, first = (c + 1) % nk, left - 1, 0
    _finish(epoch_ptr, done_ptr, n_workers, epoch)


@triton.jit
def copy_kernel(wstream, woff, out, R: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """Sum of the worker's packed chunks (the same bytes as ``flat``) into out[wid] (fp32), same loop shape."""
    wid = tl.program_id(0)
    first_chunk = tl.load(woff + wid)
    n = tl.load(woff + wid + 1) - first_chunk
    wbase = wstream + first_chunk.to(tl.int64) * (R * BK)
    tile = tl.arange(0, R)[:, None] * BK + tl.arange(0, BK)[None, :]
    acc = tl.zeros([R, BK], tl.float32)
    for i in tl.range(0, n, num_stages=STAGES):
        acc += tl.load(wbase + i * (R * BK) + tile, eviction_policy="evict_first").to(tl.float32)
    tl.store(out + wid, tl.sum(tl.sum(acc, axis=1), axis=0))


# ---------------------------------------------------------------------------------------------- host side
@dataclass
class Problem:
    """One preset's chain on a device (independent of the work split). w_all: every stage's row-major weights back
    to back, ws[s] = the [N, K] view at element wofs[s]; act: the input (K_0 elements) at 0, outs[s] = out_s
    ([N]) at aofs[s+1]; offsets multiples of 64 elements (128 bytes). bf16, or fp32 for the interpreter."""
    preset: str
    stages: list  # common.Stage
    w_all: torch.Tensor
    wofs: list
    ws: list
    act: torch.Tensor
    aofs: list
    outs: list


def build_problem(preset: str, layers: int | None, device: str, dtype=torch.bfloat16) -> Problem:
    """common.make_weights' weights and input, copied into one buffer each of ``dtype``."""
    stages = stages_for(preset, layers)
    for prev, st in zip([stages[0].K] + [st.N for st in stages], stages):
        assert st.K <= prev, "x_s = out_{s-1}[:K_s] needs K_s <= N_{s-1}"
    ws, x0 = make_weights(stages, device)

    def offsets(sizes):
        return list(accumulate((-(-n // 64) * 64 for n in sizes), initial=0))
    wofs, aofs = offsets([w.numel() for w in ws]), offsets([x0.numel()] + [st.N for st in stages])
    w_all = torch.empty(wofs[-1], dtype=dtype, device=device)
    act = torch.zeros(aofs[-1], dtype=dtype, device=device)
    for i, w in enumerate(ws):
        ws[i] = w_all[wofs[i]:wofs[i] + w.numel()].view_as(w).copy_(w)
    act[:x0.numel()] = x0
    outs = [act[o:o + st.N] for o, st in zip(aofs[1:], stages)]
    return Problem(preset, stages, w_all, wofs, ws, act, aofs, outs)


@dataclass
class Split:
    """The work split for chunks [R, BK]: tasks int32 [W, S, 5] (row groups, k-chunks per group, x offset/8, out
    offset/8, weight offset/8 of the tile's first row); packed: stream [chunks, R*BK] (per worker, in stage,
    group, k-chunk order; one zero chunk per empty tile) and woff int32 [W+1] (first chunk of each worker)."""
    W: int
    BK: int
    tasks: torch.Tensor
    stream: torch.Tensor | None
    woff: torch.Tensor | None


def build_split(prob: Problem, W: int, chunk_kb: int, packed: bool) -> Split:
    """common.tile_groups' tiles in chunks of chunk_kb KB; packed: also the stream (flat, nodeps, copy)."""
    BK = chunk_kb * 1024 // (R * prob.w_all.element_size())
    tasks = torch.zeros(W, len(prob.stages), 5, dtype=torch.int64)
    bounds = [tile_groups(st.N, W) for st in prob.stages]
    for s, (st, b) in enumerate(zip(prob.stages, bounds)):
        assert st.K % BK == 0, f"stage {st.name}: K={st.K} is not a multiple of BK={BK}"
        tasks[:, s, 0], tasks[:, s, 1], tasks[:, s, 2] = b[1:] - b[:-1], st.K // BK, prob.aofs[s] // 8
        tasks[:, s, 3] = (prob.aofs[s + 1] + b[:-1] * R) // 8
        tasks[:, s, 4] = (prob.wofs[s] + b[:-1] * R * st.K) // 8
    assert tasks.max() < 2 ** 31
    dev, stream, woff = prob.w_all.device, None, None
    if packed:
        chunks = (tasks[:, :, 0] * tasks[:, :, 1]).clamp_min(1)  # [W, S]
        woff = torch.cat([torch.zeros(1, dtype=torch.int64), chunks.sum(1).cumsum(0)])
        assert woff[-1] < 2 ** 31
        start = woff[:-1, None] + chunks.cumsum(1) - chunks  # [W, S]: first chunk of task (w, s)
        stream = torch.zeros(int(woff[-1]), R * BK, dtype=prob.w_all.dtype, device=dev)
        for s, (st, b, w) in enumerate(zip(prob.stages, bounds, prob.ws)):
            G, nk = st.N // R, st.K // BK
            g = torch.arange(G)
            owner = torch.searchsorted(b, g, right=True) - 1  # worker of row group g
            idx = (start[owner, s] + (g - b[owner]) * nk)[:, None] + torch.arange(nk)[None, :]
            stream.index_copy_(0, idx.reshape(-1).to(dev), w.view(G, R, nk, BK).transpose(1, 2).reshape(-1, R * BK))
        woff = woff.to(torch.int32).to(dev)
    return Split(W, BK, tasks.to(torch.int32).to(dev), stream, woff)


@dataclass(frozen=True)
class Config:
    """One kernel configuration. stages: num_stages of the pipelined loop (flat, nodeps, copy); xahead: x chunks
    prefetched (flat, nodeps); defer: the warp-per-row layout (module doc); warps 0: 4 up to 16 KB chunks, else 8
    (the fp32 accumulator alone is chunk bytes / 64 / warps registers per thread)."""
    variant: str
    chunk_kb: int
    stages: int = 4
    xahead: int = 2
    defer: bool = False
    warps: int = 0

    @property
    def num_warps(self) -> int:
        return self.warps or (4 if self.chunk_kb <= 16 else 8)

    @property
    def name(self) -> str:
        pipe = self.variant != "pertask"
        return (f"{self.variant}{' defer' if self.defer else ''}{f' S{self.stages}' if pipe else ''} "
                f"{self.chunk_kb}KB {self.num_warps}w{f' xa{self.xahead}' if pipe and self.variant != 'copy' else ''}")


# The sweep, per preset: per-task against flat at one chunk size and warp count, with and without --defer.
SWEEP = [Config("pertask", 16), Config("pertask", 32), Config("flat", 32), Config("nodeps", 32),
         Config("pertask", 32, defer=True), Config("flat", 32, defer=True), Config("nodeps", 32, defer=True),
         Config("copy", 32)]


def new_sync(n_stages: int, device) -> tuple:
    """Per-run dependency state: counters int32 [S], epoch int32 [1] (starts at 1), done int32 [1], err int32 [4]."""
    z = lambda n: torch.zeros(n, dtype=torch.int32, device=device)  # noqa: E731
    return z(n_stages), z(1) + 1, z(1), z(4)


def make_launch(cfg: Config, prob: Problem, split: Split, sync: tuple):
    """A no-argument callable launching one decode step of ``cfg`` on W workers."""
    W, BK, nw, asm = split.W, split.BK, cfg.num_warps, not INTERPRET
    assert not (asm and cfg.defer) or prob.act.dtype == torch.bfloat16, "--defer's GPU store is bf16"
    sargs = (*sync, len(prob.stages), W, SPIN_LIMIT)
    if cfg.variant == "pertask":
        return lambda: pertask_kernel[(W,)](prob.w_all, split.tasks, prob.act, *sargs, R=R, BK=BK, DEFER=cfg.defer,
                                            ASM=asm, num_warps=nw)
    if cfg.variant in ("flat", "nodeps"):
        return lambda: flat_kernel[(W,)](split.stream, split.woff, split.tasks, prob.act, *sargs, R=R, BK=BK,
                                         XAHEAD=cfg.xahead, STAGES=cfg.stages, DEPS=cfg.variant == "flat",
                                         DEFER=cfg.defer, ASM=asm, num_warps=nw)
    out = torch.zeros(W, dtype=torch.float32, device=prob.act.device)
    return lambda: copy_kernel[(W,)](split.stream, split.woff, out, R=R, BK=BK, STAGES=cfg.stages, num_warps=nw)


def check(prob: Problem, launch, sync: tuple, launches: int = 1) -> tuple[float, list]:
    """Poison every output with NaN, run ``launches`` steps; return (the largest of common.check_stages' errors:
    each stage against fp32 torch on the kernel's OWN input to it, inf if unwritten; the err flag [4])."""
    prob.act[prob.aofs[1]:] = float("nan")
    for _ in range(launches):
        launch()
    errs, _ = check_stages(prob.stages, prob.ws, prob.act[:prob.stages[0].K], prob.outs)
    return max(errs), sync[3].tolist()


def run_config(prob: Problem, split: Split, cfg: Config, args, copy_gbs: float | None) -> dict:
    """Check the first launch and, on a GPU, time it and check again after the timed launches (pertask and flat
    must pass; nodeps races by design; copy writes no outputs); return one JSON record."""
    sync = new_sync(len(prob.stages), prob.act.device)
    launch = make_launch(cfg, prob, split, sync)
    rec = dict(preset=prob.preset, **asdict(cfg), num_warps=cfg.num_warps, W=split.W, layers=len(prob.stages) // 4,
               R=R, BK=split.BK, dtype=str(prob.act.dtype).removeprefix("torch."), graph=args.graph,
               triton=triton.__version__, gpu=torch.cuda.get_device_name() if prob.act.is_cuda else "cpu (interpreter)")
    err = check(prob, launch, sync)[0] if cfg.variant != "copy" else None
    if prob.act.is_cuda:
        ms = time_launches(launch, n=args.iters, warmup=args.warmup, graph=args.graph)
        err = None if err is None else max(err, check(prob, launch, sync)[0])
        gbs = sum(w.numel() for w in prob.ws) * prob.w_all.element_size() / ms / 1e6
        rec.update(ms=ms, GBps=gbs, pct_copy=100 * gbs / copy_gbs, copy_GBps=copy_gbs)
    rec.update(max_rel_err=err, err_flag=sync[3].tolist())
    rec["ok"] = (err < TOL and rec["err_flag"][0] == 0) if cfg.variant in ("pertask", "flat") else None
    return rec


def configs(args) -> tuple[list[str], list[Config]]:
    """(presets, configs) to run: the SWEEP grid on llama-1b and llama-8b, or the command line's."""
    if args.sweep:
        return ["llama-1b", "llama-8b"], SWEEP
    return [args.preset], [Config(args.variant, args.chunk_kb, args.stages, args.xahead, args.defer, args.warps)]


def main_run(args) -> None:
    """Measure the copy bandwidth, then per preset build the problem and check + time every config (one split per
    chunk size), printing a line and (--out) rewriting the JSON list after each."""
    presets, cfgs = configs(args)
    copy_gbs = copy_bandwidth_gbs() if args.device == "cuda" else None
    if copy_gbs:
        print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (read + write), {torch.cuda.get_device_name()}, "
              f"triton {triton.__version__}")
    records = []
    for preset in presets:
        t0 = time.time()
        prob = build_problem(preset, args.layers, args.device, DTYPES[args.dtype])
        print(f"{preset}: {len(prob.stages)} stages (built in {time.time() - t0:.1f} s)", flush=True)
        for chunk_kb in sorted({c.chunk_kb for c in cfgs}):
            group = [c for c in cfgs if c.chunk_kb == chunk_kb]
            split = build_split(prob, args.workers, chunk_kb, any(c.variant != "pertask" for c in group))
            for cfg in group:
                try:
                    rec = run_config(prob, split, cfg, args, copy_gbs)
                    t = f"{rec['ms']:8.3f} ms {rec['GBps']:5.0f} GB/s {rec['pct_copy']:5.1f}% copy" if copy_gbs else ""
                    err = "-" if rec["max_rel_err"] is None else f"{rec['max_rel_err']:.1e}"
                    ok = {True: "pass", False: "FAIL", None: "n/a"}[rec["ok"]]
                    print(f"{preset:9s} {cfg.name:28s} [{R}x{split.BK}] {t}  err {err} flag {rec['err_flag'][0]} {ok}",
                          flush=True)
                except Exception as e:  # keep the sweep going; the record says what failed
                    rec = dict(preset=preset, **asdict(cfg), error=repr(e))
                    print(f"{preset} {cfg.name}: FAILED {e!r}", flush=True)
                records.append(rec)
                if args.out:
                    Path(args.out).write_text(json.dumps(records, indent=1))
            del split
            if copy_gbs:
                torch.cuda.empty_cache()
        del prob


def compile_only(args) -> None:
    """Compile the configs for sm_90 with scripts/compile_check.py's compile_sm90 (the kernels depend on BK and
    the flags only; the presets are checked for divisibility) and print the report."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from compile_check import compile_sm90  # sets TRITON_INTERPRET=0 and imports onekernel: only here

    dump = Path(args.dump_dir)
    bf, i32, f32 = (torch.zeros(8, dtype=d) for d in (torch.bfloat16, torch.int32, torch.float32))
    dummy = dict(wall=bf, wstream=bf, act=bf, out=f32, n_stages=1, n_workers=132, spin_limit=SPIN_LIMIT)
    presets, cfgs = configs(args)
    for cfg in cfgs:
        BK = cfg.chunk_kb * 1024 // (2 * R)
        for p in presets:
            assert all(st.K % BK == 0 for st in stages_for(p, args.layers)), (p, cfg)
        c = dict(R=R, BK=BK, ASM=True, DEFER=cfg.defer, STAGES=cfg.stages, XAHEAD=cfg.xahead,
                 DEPS=cfg.variant == "flat")
        fn = dict(pertask=pertask_kernel, copy=copy_kernel).get(cfg.variant, flat_kernel)
        c = {k: v for k, v in c.items() if k in fn.arg_names}
        name = cfg.name.replace(" ", "_")
        rep = compile_sm90(fn, [dummy.get(a, i32) for a in fn.arg_names if a not in c], c, cfg.num_warps, name,
                           out_dir=dump, ttgir=True)
        ptx, ttgir = (dump / f"{name}.ptx").read_text(), (dump / f"{name}.ttgir").read_text()
        copies = re.findall(r"%([a-z]+)_\d+ = ttg\.async_copy_global_to_local .*?: tensor<([\dx]+)x!tt\.ptr<(\w+)>",
                            ttgir)  # (variable, shape, dtype) of every pipelined load
        print(f"{cfg.name:28s} regs {rep['regs']:3d} spill {rep['spill_bytes']:4d} B  smem {rep['smem']:6d}  "
              f"v4 loads {rep['v4']:2d}  cp.async {ptx.count('cp.async.cg.shared.global'):2d}  "
              f"bar.sync {ptx.count('bar.sync'):2d}  pipelined (TTGIR async copies): "
              f"{', '.join(f'{copies.count(c)} x {c[0]} [{c[1]} {c[2]}]' for c in sorted(set(copies))) or '-'}  "
              f"({rep['s']:.1f} s)", flush=True)
    print(f"TTGIR and PTX in {dump}")


def parse(argv=None):
    ap = base_parser(__doc__.split("\n")[0])
    ap.add_argument("--variant", default="flat", choices=("pertask", "flat", "nodeps", "copy"))
    ap.add_argument("--chunk-kb", type=int, default=16, help="chunk bytes / 1024; chunk = [8, BK]")
    ap.add_argument("--stages", type=int, default=4, help="num_stages of the pipelined loop (flat/nodeps/copy)")
    ap.add_argument("--xahead", type=int, default=2, help="x chunks prefetched in registers (flat/nodeps)")
    ap.add_argument("--defer", action="store_true", help="warp-per-row chunk layout (see the module doc)")
    ap.add_argument("--warps", type=int, default=0, help="num_warps (0: 4 up to 16 KB chunks, else 8)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="the SWEEP grid on llama-1b and llama-8b")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu with TRITON_INTERPRET=1")
    ap.add_argument("--dtype", default="bf16", choices=DTYPES, help="fp32 for the interpreter (bf16 casts truncate)")
    ap.add_argument("--dump-dir", default="/tmp/tl_stream_ir", help="--compile-only: TTGIR and PTX go here")
    return ap.parse_args(argv)


if __name__ == "__main__":
    a = parse()
    if a.compile_only:
        compile_only(a)
    elif a.device == "cpu" and not INTERPRET:
        sys.exit("--device cpu needs TRITON_INTERPRET=1")
    else:
        main_run(a)
