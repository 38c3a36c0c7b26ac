"""Stream-K GEMV tasks of the streaming megakernel, host side (Osama et al., "Stream-K: Work-centric Parallel
Decomposition for Dense Matrix-Matrix Multiplication on the GPU", PPoPP 2023, section 4): an op whose units do not
divide evenly over the workers (Llama-3.1-70B's TP=8 shard: 80 qkv_rope units of 16 chunks on 132 workers) is cut
in its (unit, k-chunk) sequence instead, so every worker streams the same number of k-chunks (+-1).

The op's T = units x NKB positions (position u * NKB + kb: unit u's k-chunk kb, each of the unit's chunk groups)
go to its W tasks in equal runs: task w takes [p_w, p_{w+1}), p_w = floor(w T / W). A unit cut between tasks is a
*split unit*; each task holds at most two pieces of one (its first unit from k-chunk KS, its last up to KE: it streams
them before its whole units), and stores each piece's fp32 sums [groups, B, RG] in its own slot of the op's partials buffer (2 w: the first unit's,
2 w + 1: the last one's). Each piece then adds one to the unit's arrival counter; the task that brings it to the
unit's piece count sums the pieces' slots in k order (the same fixed order whoever arrives last, so a step's bits do
not depend on timing) and runs the unit's epilogue (exec.stream_combine). The device finds a unit's pieces from
(T, W, NKB) alone: the task holding position x is ((x + 1) W - 1) // T (``task_of``).

Only the tensor-core path's qkv_rope (not Qwen3's, whose q/k norm needs whole heads in a task) and gate_up are
split: the residual GEMVs' RMSNorm partials are summed per task, which a unit finished by either of two tasks would
make timing-dependent. STREAM_SPLIT_K: "auto" (the default: an op is split when its largest task would stream at
least SPLIT_K_MIN times the mean), "1" (every op that can be), "0" (none).
"""
from __future__ import annotations

import os

import numpy as np

from onekernel.errors import InputError
from onekernel.exec import stream_base as sd

SPLIT_K = os.environ.get("STREAM_SPLIT_K", "auto")
if SPLIT_K not in ("auto", "1", "0"):  # at import, as stream_plan.SS_PARTIALS
    raise InputError(f"STREAM_SPLIT_K must be auto, 1 or 0, got {SPLIT_K!r}; unset it for the default (auto)")
SPLIT_K_MIN = 1.10
SPLIT_KINDS = (sd.K_QKV.value, sd.K_GATEUP.value)


def split_wanted(kind: int, params: dict, units: int, nkb: int, n_workers: int, mma: bool) -> bool:
    """Whether a GEMV op of ``units`` units of ``nkb`` k-chunks is cut stream-K over ``n_workers`` tasks (module
    doc): tensor-core qkv_rope (without Qwen3's q/k norm) and gate_up with at least one position a task, under
    STREAM_SPLIT_K."""
    if SPLIT_K == "0" or not mma or kind not in SPLIT_KINDS or params.get("QK_NORM") or nkb < 2 \
            or units * nkb < n_workers:
        return False
    if SPLIT_K == "1":
        return True
    return -(-units // n_workers) * n_workers >= SPLIT_K_MIN * units


def split_tasks(units: int, nkb: int, n_workers: int) -> list[tuple[int, int, int, int]]:
    """Per task w: (first unit, units touched, KS, KE): its positions [p_w, p_{w+1}) (module doc) run from k-chunk
    KS of its first unit to k-chunk KE (exclusive) of its last. Needs units * nkb >= n_workers (no empty task)."""
    total = units * nkb
    p = [(w * total) // n_workers for w in range(n_workers + 1)]
    out = []
    for w in range(n_workers):
        ua, ub = p[w] // nkb, (p[w + 1] - 1) // nkb
        out.append((ua, ub - ua + 1, p[w] % nkb, (p[w + 1] - 1) % nkb + 1))
    return out


def pieces(u0: int, nu: int, ks: int, ke: int, nkb: int) -> list[tuple[int, int, int, int, int]]:
    """The task's work in stream order as (first unit, end unit, k0, k1, slot): -1 for whole units, else which of its
    two partials slots (0: its first unit's piece, 1: its last's) a split unit's piece goes to. The device's
    ``stream_mma.gemv_mma`` walks the same list: the pieces first (its first unit's, then its last unit's), then the
    whole units. So a cut unit's pieces are all done early in their tasks, and the one that combines them waits for
    their slots (L2 round trips) while the loader keeps streaming the task's whole units, not at the op's end."""
    hs = ks > 0 or (nu == 1 and ke < nkb)
    ts = nu > 1 and ke < nkb
    out = []
    if hs:
        out.append((u0, u0 + 1, ks, ke if nu == 1 else nkb, 0))
    if ts:
        out.append((u0 + nu - 1, u0 + nu, 0, ke, 1))
    if u0 + hs < u0 + nu - ts:
        out.append((u0 + hs, u0 + nu - ts, 0, nkb, -1))
    return out


def task_of(x: int, total: int, n_workers: int) -> int:
    """The task whose run holds position x (the device's formula: p_w <= x iff w T < (x + 1) W)."""
    return ((x + 1) * n_workers - 1) // total


def unit_slots(u: int, nkb: int, total: int, n_workers: int) -> list[int]:
    """The partials slots of unit u's pieces in k order (the combine's summation order; stream_combine)."""
    w0, w1 = task_of(u * nkb, total, n_workers), task_of((u + 1) * nkb - 1, total, n_workers)
    return [2 * w + int(u != ((w * total) // n_workers) // nkb) for w in range(w0, w1 + 1)]


def chunk_order(u0: int, nu: int, ks: int, ke: int, nkb: int, gpu: int, gb: int) -> np.ndarray:
    """int64: the op-local chunk indices (group g, k-chunk kb) = g * nkb + kb a stream-K task streams, in the MMA
    path's order (stream_pack.mma_chunk_order): per piece, blocks of gb chunk groups (gb / gpu units), each k-major
    over the piece's k-chunks [k0, k1)."""
    parts = []
    for a, b, k0, k1, _ in pieces(u0, nu, ks, ke, nkb):
        for b0 in range(a * gpu, b * gpu, gb):
            grp = np.arange(b0, min(b0 + gb, b * gpu))
            parts.append((grp[None, :] * nkb + np.arange(k0, k1)[:, None]).ravel())
    return np.concatenate(parts or [np.zeros(0, np.int64)]).astype(np.int64)
