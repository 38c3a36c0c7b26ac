"""``allreduce``: the tensor-parallel sum of the ranks' partial rows, as tile tasks of one rank's step.

Megatron-LM (Shoeybi et al. 2019, sections 3 and 3.1): after a row-parallel GEMV (wo, w_down) and the
vocabulary-parallel embedding every rank holds a partial sum ``p_r [B, D]`` (model dtype) of the same output;
the all-reduce makes every rank's copy the whole sum. Here rank ``rank`` of ``N`` computes, per tile of
BLOCK_D columns of all B rows,

    out[b, d] = round( res[b, d] + p_0[b, d] + p_1[b, d] + ... + p_{N-1}[b, d] )

in fp32, in that fixed order (the residual first, when there is one, then the ranks 0..N-1), rounded once to the
model dtype (round to nearest even: ``gemv_rows.rnd``, as PyTorch's conversion). Every rank sums the same values in the same order, so every rank's ``out``
holds the same bits. ``p_rank`` is the rank's own buffer (written by its producer op); the others are *peer*
buffers (``add_peer_buffer``: kind "peer", this process's mapping of another rank's copy of the same buffer,
bound by the tensor-parallel runner to symmetric memory). The graph records which buffer each peer buffer
mirrors (``graph.meta["peers"]``), so ``graph.deps.derive_remote_dependencies`` can make a task that reads a
peer buffer wait on the producers of those rows *on that rank* (identical graphs on every rank, identical task
and event ids). ``res``: the residual stream, added here (once) instead of by one rank's GEMV, so that every
rank's graph is the same (dist/tp_megakernel.py).

The partials are read with ``volatile=True`` (``ld.volatile.global``, which the PTX memory model treats as a
relaxed load at system scope; ``cache_modifier=".cv"`` would not do: Triton 3.6 drops it, a plain ``ld.global`` in
the sm_90a PTX, found in session 39; scripts/tp_compile_check.py counts the 16-bit volatile loads): the peer rows
live in another GPU's memory and are read after a system-scope acquire of that GPU's event counter
(exec/mk_device.py ``spin_peer``), then the CTA barrier. By the memory model the peer's release (after its CTA
barrier: cumulativity), our acquire and the barrier already order these loads after the peer's stores; a load that
no cache can serve keeps a line fetched before the acquire from being seen (belt and braces, as the streaming
kernel's all-reduce does). The loads are scalar (no 16-byte vectors for volatile loads): a tile is B x BLOCK_D
elements per rank, a few hundred bytes.

Up to MAX_RANKS inputs: the tile function has MAX_RANKS pointer arguments and the constexpr N says how many are
read (Triton has no variadic pointer arguments); the builder binds the unused roles to ``p_0``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from onekernel.graph.ir import Buffer, Graph, Op
from onekernel.ops.base import OpKind
from onekernel.ops.gemv_rows import rnd
from onekernel.ops.tiling import Tiling, block_n_for, pow2_ceil, region, row_tiled_tasks

MAX_RANKS = 8
IN_ROLES = tuple(f"in{j}" for j in range(MAX_RANKS))


@triton.jit
def allreduce_prologue(tile, in0, in1, in2, in3, in4, in5, in6, in7, res, out, B: tl.constexpr, D: tl.constexpr,
                       N: tl.constexpr, RES: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr):
    return tile * BLOCK_D + tl.arange(0, BLOCK_D)


@triton.jit
def _add(acc, p, offs, m, N: tl.constexpr, J: tl.constexpr):
    if J < N:
        acc += tl.load(p + offs, mask=m, other=0.0, volatile=True).to(tl.float32)
    return acc


@triton.jit
def allreduce_body(tile, cols, in0, in1, in2, in3, in4, in5, in6, in7, res, out, B: tl.constexpr,
                   D: tl.constexpr, N: tl.constexpr, RES: tl.constexpr, BLOCK_B: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    ob = tl.arange(0, BLOCK_B)
    offs = ob[:, None] * D + cols[None, :]
    m = (ob < B)[:, None] & (cols[None, :] < D)
    acc = tl.zeros((BLOCK_B, BLOCK_D), dtype=tl.float32)
    if RES:
        acc += tl.load(res + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    acc = _add(acc, in0, offs, m, N, 0)  # rank order 0..N-1: the same sum, bit for bit, on every rank
    acc = _add(acc, in1, offs, m, N, 1)
    acc = _add(acc, in2, offs, m, N, 2)
    acc = _add(acc, in3, offs, m, N, 3)
    acc = _add(acc, in4, offs, m, N, 4)
    acc = _add(acc, in5, offs, m, N, 5)
    acc = _add(acc, in6, offs, m, N, 6)
    acc = _add(acc, in7, offs, m, N, 7)
    tl.store(out + offs, rnd(acc, out.dtype.element_ty).to(out.dtype.element_ty), mask=m)  # RNE, as PyTorch


def allreduce_reference(op: Op, t: dict) -> None:
    """fp32 sum in the kernel's order (residual, then ranks 0..N-1), rounded once to the output dtype."""
    a, p = op.args, op.params
    out = t[a["out"]]
    acc = t[a["res"]].float().clone() if p["RES"] else torch.zeros(out.shape, dtype=torch.float32,
                                                                   device=out.device)
    for j in range(p["N"]):
        acc += t[a[IN_ROLES[j]]].float()
    out.copy_(acc.to(out.dtype))


ALLREDUCE = OpKind("allreduce", allreduce_prologue, allreduce_body, (*IN_ROLES, "res", "out"),
                   ("B", "D", "N", "RES", "BLOCK_B", "BLOCK_D"), 1, allreduce_reference)


@triton.jit
def _signal_and_wait(tile, flags, mine, pdelta, err, D: tl.constexpr, N: tl.constexpr, BLOCK_D: tl.constexpr,
                     SPIN: tl.constexpr):
    """The one-shot all-reduce's barrier for one tile (module doc of ``ALLREDUCE_ONESHOT``): count this tile's
    runs (m), post m into every peer's flag for (tile, rank) with a system-scope release (the rank is read from
    pdelta[N]: one kernel serves every rank), then poll this rank's flags (tile, p) of every peer p until they reach
    m (a system-scope acquire), at most SPIN polls each and none once a failure is recorded; the first that gives up
    records (5, tile, op ordinal, seen, m, peer) in err[0:6]."""
    NT: tl.constexpr = (D + BLOCK_D - 1) // BLOCK_D
    rank = tl.load(pdelta + N).to(tl.int32)
    m = tl.load(mine + tile) + 1
    tl.store(mine + tile, m)  # only this tile's program touches its count
    for q in tl.static_range(N):
        if q != rank:
            tl.atomic_xchg(flags + tl.load(pdelta + q) + tile * N + rank, m, sem="release", scope="sys")
    for p in tl.static_range(N):
        if p != rank:
            f = flags + tile * N + p
            seen = tl.atomic_add(f, 0, sem="acquire", scope="sys")
            bad = tl.load(err, volatile=True)
            n = 0
            while (seen < m) & (n < SPIN) & (bad == 0):
                seen = tl.atomic_add(f, 0, sem="acquire", scope="sys")
                bad = tl.load(err, volatile=True)
                n += 1
            if (seen < m) & (bad == 0):
                if tl.atomic_cas(err, 0, 5) == 0:
                    tl.store(err + 1, tile)
                    tl.store(err + 2, tl.load(mine + NT))
                    tl.store(err + 3, seen)
                    tl.store(err + 4, m)
                    tl.store(err + 5, p)


@triton.jit
def allreduce_oneshot_body(tile, cols, in0, in1, in2, in3, in4, in5, in6, in7, res, out, flags, mine, pdelta, err,
                           B: tl.constexpr, D: tl.constexpr, N: tl.constexpr, RES: tl.constexpr,
                           BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, SPIN: tl.constexpr):
    _signal_and_wait(tile, flags, mine, pdelta, err, D, N, BLOCK_D, SPIN)
    tl.debug_barrier()  # every thread's loads of the peers' rows after the (one-thread) acquire polls
    allreduce_body(tile, cols, in0, in1, in2, in3, in4, in5, in6, in7, res, out, B, D, N, RES, BLOCK_B, BLOCK_D)


@triton.jit
def allreduce_oneshot_prologue(tile, in0, in1, in2, in3, in4, in5, in6, in7, res, out, flags, mine, pdelta, err,
                               B: tl.constexpr, D: tl.constexpr, N: tl.constexpr, RES: tl.constexpr,
                               BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, SPIN: tl.constexpr):
    return tile * BLOCK_D + tl.arange(0, BLOCK_D)


# The same all-reduce as a separate kernel of the eager / graph / pdl modes ("--allreduce oneshot",
# dist/tp_oneshot.py): no event counters there, so each tile opens with a barrier on its peers' same tile
# (``_signal_and_wait``), then reads their partials where they are (one NVLink round trip) and sums them in the
# same order, rounding once: the megakernel's bits. The producers are the GEMV kernels before it on each rank:
# a tile posts its flag only once its own kernel runs, i.e. after its rank's producers finished (stream order, or
# PDL's ``griddepcontrol.wait``, which the per-op kernel calls before the body); so a peer's flag at m means that
# rank's partials of its m-th run of this op are complete. The GEMVs write their partials straight into the
# symmetric pool (no copy in, none out) and the kernel joins the PDL chain like any op. Extra roles: ``flags``
# int32 [tiles, N] in this rank's pool (peers post into it), ``mine`` int32 [tiles + 1] (this rank's run count
# per tile, then the op's ordinal for error reports), ``pdelta`` int64 [N + 1] (int32 elements from this rank's
# flags region to rank q's, one virtual address space; then this rank's index, so that one compiled kernel serves
# every rank), ``err`` int32 [8]; constant SPIN (polls).
# Cross-step safety is the megakernel's argument with kernels for tasks (dist/tp_oneshot.py).
ALLREDUCE_ONESHOT = OpKind("allreduce_oneshot", allreduce_oneshot_prologue, allreduce_oneshot_body,
                           (*IN_ROLES, "res", "out", "flags", "mine", "pdelta", "err"),
                           ("B", "D", "N", "RES", "BLOCK_B", "BLOCK_D", "SPIN"), 1, allreduce_reference)


def peer_name(source: str, peer: int) -> str:
    """The name of rank ``peer``'s copy of buffer ``source`` in another rank's graph."""
    return f"peer{peer}.{source}"


def add_peer_buffer(graph: Graph, source: Buffer, peer: int) -> Buffer:
    """Declare rank ``peer``'s copy of ``source`` (same shape and dtype; kind "peer": read only here, written by
    that rank's own step) and record it in ``graph.meta["peers"][name] = (peer, source.name)``. Returns it
    (an existing declaration is returned again)."""
    name = peer_name(source.name, peer)
    if name in graph.buffers:
        return graph.buffers[name]
    b = graph.add_buffer(name, source.shape, source.dtype, "peer")
    graph.meta.setdefault("peers", {})[name] = (int(peer), source.name)
    return b


def add_allreduce(graph: Graph, name: str, partials: list[Buffer], *, residual: Buffer | None = None,
                  tiling: Tiling = Tiling(), block_d: int | None = None) -> Buffer:
    """Append ``out = round(residual + sum_j partials[j])`` (fp32, in list order; module doc) tiled over D.

    partials: rank 0..N-1's partial [B, D] buffers (this rank's own, the others ``add_peer_buffer`` handles),
    1 <= N <= MAX_RANKS, all of one shape and dtype; residual: None or a [B, D] buffer of that dtype. Tiles:
    BLOCK_D columns of all B rows, BLOCK_D the power of two giving ``tiling``'s tile count (4..256 columns;
    ``block_d`` overrides), never depending on B. Returns ``out`` (``{name}.out``, activation). Raises
    ValueError for an empty or too long list, or mismatched shapes / dtypes."""
    if not 1 <= len(partials) <= MAX_RANKS:
        raise ValueError(f"allreduce {name!r}: {len(partials)} partials; 1..{MAX_RANKS} ranks are supported")
    shape, dtype = partials[0].shape, partials[0].dtype
    others = [*partials, *([residual] if residual is not None else [])]
    bad = [b.name for b in others if b.shape != shape or b.dtype != dtype]
    if len(shape) != 2 or bad:
        raise ValueError(f"allreduce {name!r}: every partial (and the residual) must be one [B, D] shape and dtype "
                         f"as {partials[0].name!r} {shape} {dtype}; {bad} differ")
    B, D = shape
    out = graph.add_buffer(f"{name}.out", (B, D), dtype, "activation")
    bd = block_d or block_n_for(D, tiling.min_tiles, lo=4, hi=256)
    p = {"B": B, "D": D, "N": len(partials), "RES": residual is not None, "BLOCK_B": pow2_ceil(B), "BLOCK_D": bd}
    es = out.nbytes // (B * D)
    args = {role: partials[j if j < len(partials) else 0].name for j, role in enumerate(IN_ROLES)}
    args["res"] = (residual or partials[0]).name
    args["out"] = out.name

    def make(t, d0, d1):
        reads = [region(b, (0, B), (d0, d1)) for b in others]
        return reads, [region(out, (0, B), (d0, d1))], (len(others) + 1) * B * (d1 - d0) * es, len(others) * B * (d1 - d0)

    graph.add_op(Op(name, ALLREDUCE, args, p), row_tiled_tasks(D, bd, make))
    return out
