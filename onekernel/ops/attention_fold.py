"""``attn_partial_fold``: decode attention in one kernel: the split-KV partials, and the last split of each
(sequence, KV head) group to finish merges the group (``fold_merge=True``, models/decode_graph.py; the
separate-kernel modes' counterpart of the streaming megakernel's fold, exec/stream_fold.py).

Math: ``attn_partial``'s partials and ``attn_merge``'s log-sum-exp merge, the same tile functions
(ops/attention.py: ``attn_partial_prologue`` / ``attn_partial_body``, then ``merge_row`` per row), so the fold
changes who merges, not what is computed. Source: Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov,
"Flash-Decoding for long-context inference" (2023).

Layouts (model dtype T = fp32/bf16/fp16): q T [B, Hq, hd], k_cache / v_cache T [B, Hkv, S, hd], seq_lens int32 [B];
scratch o_part fp32 [B, Hq, NSPLIT, hd], lse_part fp32 [B, Hq, NSPLIT]; ``counter`` int32 [B, Hkv] (buffer kind
"counter": zero when the step is bound, and zero again after every step); output ``out`` T [B, Hq*hd].

Tile (b, g, s), as ``attn_partial``'s: the partials of split s of KV head g of sequence b (an empty split too:
O = 0, lse = -inf), then
  1. ``tl.debug_barrier()``: every thread of the CTA has issued its partial stores;
  2. one ``atomic_add(counter[b, g], 1, sem="acq_rel", scope="gpu")`` (one thread of the CTA), every tile;
  3. the tile that reads NSPLIT - 1 arrived last: it stores 0 to the counter (the next step, a later kernel
     launch, or a CUDA-graph replay, starts from 0) and merges the group's R = Hq/Hkv rows into ``out``
     (``merge_row``: the partials read with ``.cg``, from L2).
Memory ordering (CUTLASS's split-K semaphore pattern): the barrier puts every thread's partial stores before the
atomic in causality order, the atomic's release (gpu scope) makes them visible to whoever acquires a later value
of the counter; the last arrival's acquire reads the NSPLIT - 1 earlier releases (atomics on one address are
totally ordered), and its loads come after the acquire (Triton broadcasts the atomic's result through shared
memory behind a CTA barrier, and the merge branches on it), bypassing L1 (``.cg``). So the merging tile reads
every split's final partials, whichever tile it is; its stores of ``out`` are ordered before the next op by the
kernel boundary (eager, graph), ``griddepcontrol.wait`` (pdl: the whole grid completes and flushes first), or
the Triton megakernel's signal after the task body. The reset needs no ordering within the step: no tile of
the group adds again.

Regions: every tile's writes of the group's partials, its counter and its ``out`` rows are *shared* writes
(``Region.shared``): any of the NSPLIT tiles may write the rows (the last to arrive), the group's tiles run
concurrently and order themselves, so they do not depend on each other, and a reader of ``out`` (o_proj) depends
on every tile of the group.
Batch invariance: the tiles and the merge of row b read only sequence b's data with B-independent shapes;
which tile merges never changes the merge's operands or their order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from onekernel.graph.ir import Buffer, Graph, Op, Task
from onekernel.ops.attention import (attn_partial_body, attn_partial_prologue, merge_params, merge_partials,
                                     merge_row, partial_reference, partial_tasks)
from onekernel.ops.base import OpKind
from onekernel.ops.tiling import region


@triton.jit
def attn_fold_prologue(tile, q, k_cache, v_cache, seq_lens, o_part, lse_part, counter, out,
                       HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, S: tl.constexpr,
                       SPLIT: tl.constexpr, NSPLIT: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
                       SM_SCALE: tl.constexpr, NSP2: tl.constexpr, CH: tl.constexpr):
    return attn_partial_prologue(tile, q, k_cache, v_cache, seq_lens, o_part, lse_part, HQ, HKV, HD, S, SPLIT,
                                 NSPLIT, GP, BLOCK_N, SM_SCALE)


@triton.jit
def attn_fold_body(tile, b, g, s, end, q, k_cache, v_cache, seq_lens, o_part, lse_part, counter, out,
                   HQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, S: tl.constexpr,
                   SPLIT: tl.constexpr, NSPLIT: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
                   SM_SCALE: tl.constexpr, NSP2: tl.constexpr, CH: tl.constexpr):
    """The tile's partials, its arrival, and for the last arrival the group's merge (module doc)."""
    attn_partial_body(tile, b, g, s, end, q, k_cache, v_cache, seq_lens, o_part, lse_part, HQ, HKV, HD, S, SPLIT,
                      NSPLIT, GP, BLOCK_N, SM_SCALE)
    tl.debug_barrier()  # every thread's partial stores before the release
    grp = counter + b * HKV + g
    if tl.atomic_add(grp, 1, sem="acq_rel", scope="gpu") == NSPLIT - 1:
        tl.store(grp, 0)
        R: tl.constexpr = HQ // HKV
        for r in range(R):
            merge_row(o_part, lse_part, out, b * HQ + g * R + r, HD, NSPLIT, NSP2, CH)


def fold_reference(op: Op, t: dict) -> None:
    """PyTorch reference: ``attn_partial``'s partials, then ``attn_merge``'s merge into ``out``; the counter is
    left at 0 (as every step leaves it)."""
    partial_reference(op, t)
    out = t[op.args["out"]]
    out.copy_(merge_partials(t[op.args["o_part"]], t[op.args["lse_part"]], out.dtype))
    t[op.args["counter"]].zero_()


ATTN_PARTIAL_FOLD = OpKind(
    "attn_partial_fold", attn_fold_prologue, attn_fold_body,
    ("q", "k_cache", "v_cache", "seq_lens", "o_part", "lse_part", "counter", "out"),
    ("HQ", "HKV", "HD", "S", "SPLIT", "NSPLIT", "GP", "BLOCK_N", "SM_SCALE", "NSP2", "CH"), 4, fold_reference)


def add_attn_partial_fold(graph: Graph, name: str, q: Buffer, k_cache: Buffer, v_cache: Buffer, seq_lens: Buffer,
                          dtype: torch.dtype, *, split: int | None = None, n_sm: int = 132) -> Buffer:
    """Append decode attention with the merge folded in (module doc) and return ``{name}.out`` [B, Hq*hd] in
    ``dtype`` (the model dtype). Declares the scratch ``{name}.o_part`` / ``{name}.lse_part`` (as
    ``add_attn_partial``) and ``{name}.counter`` int32 [B, Hkv] (kind "counter").

    q [B, Hq, hd], k_cache / v_cache [B, Hkv, S, hd], seq_lens int32 [B]; ``split`` / ``n_sm``: as
    ``add_attn_partial``. Raises ValueError as ``add_attn_partial`` (Hq % Hkv, head_dim, cache shapes).
    Task costs: ``add_attn_partial``'s, plus 8 bytes (the counter's atomic) and the group's merge
    (``add_attn_merge``'s cost of its R rows) spread over its NSPLIT tiles (any one of them merges)."""
    args, params, tasks = partial_tasks(graph, name, q, k_cache, v_cache, seq_lens, split, n_sm)
    B, HQ, HD = q.shape
    HKV, NSPLIT = params["HKV"], params["NSPLIT"]
    R = HQ // HKV
    out = graph.add_buffer(f"{name}.out", (B, HQ * HD), dtype, "activation")
    counter = graph.add_buffer(f"{name}.counter", (B, HKV), torch.int32, "counter")
    e = out.nbytes // (B * HQ * HD)
    merge_bytes = R * (NSPLIT * (HD + 1) * 4 + HD * e) // NSPLIT
    merge_flops = R * (2 * NSPLIT * HD + 3 * NSPLIT) // NSPLIT
    o_part, lse_part = args["o_part"], args["lse_part"]
    folded = []
    for t in tasks:
        b, g = t.tile // (HKV * NSPLIT), t.tile // NSPLIT % HKV
        bb, hs = (b, b + 1), (g * R, g * R + R)
        writes = (region(o_part, bb, hs, (0, NSPLIT), (0, HD), shared=True),
                  region(lse_part, bb, hs, (0, NSPLIT), shared=True),
                  region(counter, bb, (g, g + 1), shared=True),
                  region(out, bb, (g * R * HD, (g + 1) * R * HD), shared=True))
        folded.append(Task(0, t.tile, t.reads, writes, t.bytes + 8 + merge_bytes, t.flops + merge_flops))
    args.update(counter=counter, out=out)
    graph.add_op(Op(name, ATTN_PARTIAL_FOLD, {role: b.name for role, b in args.items()},
                    {**params, **merge_params(NSPLIT, HD)}), folded)
    return out
