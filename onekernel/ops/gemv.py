"""Row-tiled GEMV ops: ``gemv_residual`` (O- and down-projection + residual) and ``gate_up`` (RMSNorm +
gate/up projection + SiLU*mul), built from the shared row blocks of ``ops.gemv_rows`` (numerics, batch
invariance and compile-time notes there).

Tile = BLOCK_N output rows for all B batch rows (see ops/tiling.py); the ``MMA`` switch picks the tensor-core
GEMV of ``ops.gemv_mma`` (BLOCK_B = 16) instead of the CUDA-core rows. The prologue loads the tile's first
weight chunk (weights are ready before the step); the body reads activations (``.cg``) and streams the rest
double-buffered: chunk k+1's load is issued before chunk k is reduced, so two chunks are in flight per CTA.
"""
from __future__ import annotations

import torch.nn.functional as F
import triton
import triton.language as tl

from onekernel.graph.ir import Buffer, Graph, Op
from onekernel.ops.base import OpKind
from onekernel.ops.gemv_mma import COLS, gemv_mma, load_xt, mma_acc, mma_stages, norm_xt
from onekernel.ops.gemv_rows import (gemv_rows, last_chunk, load_nw_chunk, load_w_chunk, load_x_raw, norm_x,
                                    rms_norm_ref, rms_norm_rows, rms_rstd, rnd, row_dot, row_of, silu, tile_rows)
from onekernel.ops.tiling import (MAX_TILE_ELEMS, Tiling, cdiv, check_gemv, gate_up_rows, gemv_blocks, gemv_cost,
                                  prenorm_default, prenorm_pipeline, prenorm_scratch, region, row_tiled_tasks)


# ----------------------------------------------------------------------------------------- gemv_residual
@triton.jit
def gemv_residual_prologue(tile, x, w, res, out, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                           BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MMA: tl.constexpr,
                           STAGES: tl.constexpr):
    rows, rmask = tile_rows(tile, N, BLOCK_N)
    return load_w_chunk(w, rows, rmask, 0, K, BLOCK_K)


@triton.jit
def gemv_residual_body(tile, w0, x, w, res, out, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                       BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MMA: tl.constexpr,
                       STAGES: tl.constexpr):
    """out[b, n] = (res[b, n] + (x[b, :] @ w[n, :]).to(dt)).to(dt) for the tile's BLOCK_N rows n (MMA: on the
    tensor cores, BLOCK_B = 16, the chunk loop STAGES deep: ops/gemv_mma.py ``gemv_mma``)."""
    rows, rmask = tile_rows(tile, N, BLOCK_N)
    if MMA:
        acc = gemv_mma(w0, x, w, 1.0, w, rows, rmask, B, K, BLOCK_N, BLOCK_K, False, STAGES)
    else:
        acc = gemv_rows(w0, x, w, 1.0, w, rows, rmask, B, K, BLOCK_B, BLOCK_N, BLOCK_K, False)
    ob = tl.arange(0, BLOCK_B)
    m = (ob[:, None] < B) & rmask[None, :]
    offs = ob[:, None] * N + rows[None, :]
    r = tl.load(res + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    y = rnd(acc, out.dtype.element_ty)
    tl.store(out + offs, (r + y).to(out.dtype.element_ty), mask=m)


def gemv_residual_reference(op: Op, t: dict) -> None:
    a = op.args
    t[a["out"]].copy_(t[a["res"]] + F.linear(t[a["x"]], t[a["w"]]))


GEMV_RESIDUAL = OpKind(
    "gemv_residual", gemv_residual_prologue, gemv_residual_body, ("x", "w", "res", "out"),
    ("B", "N", "K", "BLOCK_B", "BLOCK_N", "BLOCK_K", "MMA", "STAGES"), 1, gemv_residual_reference)


def add_gemv_residual(graph: Graph, name: str, x: Buffer, w: Buffer, res: Buffer, *, tiling: Tiling = Tiling(),
                      gemv: str = "fma", blocks: dict | None = None) -> Buffer:
    """Append ``out[B, N] = res + x[B, K] @ w[N, K]^T`` (all model dtype) tiled over N; returns ``out``
    (``{name}.out``). gemv: "fma" (CUDA cores) or "mma" (tensor cores; ops/tiling.py ``check_gemv``).
    blocks: overrides of the tiling (BLOCK_N, BLOCK_K, STAGES; tests and tuning)."""
    B, K = x.shape
    N = w.shape[0]
    es = w.nbytes // (N * K)
    out = graph.add_buffer(f"{name}.out", (B, N), res.dtype, "activation")
    p = {"B": B, "N": N, "K": K, **gemv_blocks(N, K, B, tiling, gemv=gemv)}
    p = {**p, "STAGES": mma_stages("gemv_residual", p["BLOCK_N"], p["MMA"], tiling.separate), **(blocks or {})}

    def make(t, n0, n1):
        nbytes, flops = gemv_cost(n1 - n0, K, B, es, 2 * B * (n1 - n0) * es)
        return ([region(x), region(w, (n0, n1), (0, K)), region(res, (0, B), (n0, n1))],
                [region(out, (0, B), (n0, n1))], nbytes, flops)

    graph.add_op(Op(name, GEMV_RESIDUAL, {"x": x.name, "w": w.name, "res": res.name, "out": out.name}, p),
                 row_tiled_tasks(N, p["BLOCK_N"], make))
    return out


# ----------------------------------------------------------------------------------------- gate_up
@triton.jit
def gate_up_mac(ag, au, x, nw, rstd, wg, wu, k0, B: tl.constexpr, BLOCK_B: tl.constexpr, K: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """``mac_rows2d`` for the gate and up chunks at once (each normalized x row loaded once)."""
    g = load_nw_chunk(nw, k0, K, BLOCK_K, True)
    ob = tl.arange(0, BLOCK_B)
    cg = tl.zeros_like(ag)
    cu = tl.zeros_like(au)
    xn = load_x_raw(x, 0, k0, K, BLOCK_K, True)
    for b in range(B):
        xb = norm_x(xn, g, row_of(rstd, ob, b), True)
        xn = load_x_raw(x, b + 1, k0, K, BLOCK_K, b + 1 < B)  # in flight during row b's reductions
        cg = tl.where(ob[:, None] == b, row_dot(xb, wg)[None, :], cg)
        cu = tl.where(ob[:, None] == b, row_dot(xb, wu)[None, :], cu)
    return ag + cg, au + cu


@triton.jit
def gate_up_mma(wg0, wu0, x, nw, rstd, w, rows, rmask, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, NORM: tl.constexpr = True,
                XS: tl.constexpr = 0):
    """(gate, up) fp32 [16, BLOCK_N] on the tensor cores (ops/gemv_mma.py ``gemv_mma`` with two weight
    matrices): each (NORM: normalized) activation tile is made once and feeds both MMAs; the chunk loop
    double-buffered in registers (STAGES 0) or STAGES deep through shared memory; x's rows XS elements apart (0: K)."""
    ag = tl.zeros([BLOCK_N, COLS], tl.float32)
    au = tl.zeros([BLOCK_N, COLS], tl.float32)
    if STAGES > 0:  # pipelined STAGES chunks deep through shared memory (ops/gemv_mma.py: DEEP)
        h = norm_xt(load_xt(x, B, 0, K, BLOCK_K, XS), nw, rstd, 0, K, BLOCK_K, NORM)
        ag = mma_acc(ag, wg0, h)
        au = mma_acc(au, wu0, h)
        for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
            wg = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
            wu = load_w_chunk(w, rows + N, rmask, k0, K, BLOCK_K)
            h = norm_xt(load_xt(x, B, k0, K, BLOCK_K, XS), nw, rstd, k0, K, BLOCK_K, NORM)
            ag = mma_acc(ag, wg, h)
            au = mma_acc(au, wu, h)
        return tl.trans(ag), tl.trans(au)
    wg, wu = wg0, wu0
    xv = load_xt(x, B, 0, K, BLOCK_K, XS)
    for k0 in range(BLOCK_K, K, BLOCK_K):  # double-buffered, as in gemv_mma
        ng = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
        nu = load_w_chunk(w, rows + N, rmask, k0, K, BLOCK_K)
        nx = load_xt(x, B, k0, K, BLOCK_K, XS)
        h = norm_xt(xv, nw, rstd, k0 - BLOCK_K, K, BLOCK_K, NORM)
        ag = mma_acc(ag, wg, h)
        au = mma_acc(au, wu, h)
        wg, wu, xv = ng, nu, nx
    h = norm_xt(xv, nw, rstd, last_chunk(K, BLOCK_K), K, BLOCK_K, NORM)
    return tl.trans(mma_acc(ag, wg, h)), tl.trans(mma_acc(au, wu, h))


@triton.jit
def gate_up_prologue(tile, x, nw, w, xn, out, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                     BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EPS: tl.constexpr,
                     MMA: tl.constexpr, STAGES: tl.constexpr, PRENORM: tl.constexpr, ROWS: tl.constexpr):
    rows, rmask = tile_rows(tile, N, BLOCK_N, ROWS)
    return load_w_chunk(w, rows, rmask, 0, K, BLOCK_K), load_w_chunk(w, rows + N, rmask, 0, K, BLOCK_K)


@triton.jit
def gate_up_body(tile, wg0, wu0, x, nw, w, xn, out, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EPS: tl.constexpr,
                 MMA: tl.constexpr, STAGES: tl.constexpr, PRENORM: tl.constexpr, ROWS: tl.constexpr):
    """h = RMSNorm(x); out[b, n] = silu((h @ Wg[n]).to(dt)).to(dt) * (h @ Wu[n]).to(dt), rounded to dt.
    w = cat(w_gate, w_up) [2N, K]: gate row n is row n, up row n is row N + n. MMA: on the tensor cores
    (BLOCK_B = 16). PRENORM (MMA only): h written once into this tile's row of the scratch xn [B, n_tiles, K], the
    chunk loop loads it (ops/qkv.py's module doc). ROWS: the tile's rows, the first ROWS of its BLOCK_N register rows
    (the others masked: ``tiling.gate_up_rows``); 0: all BLOCK_N."""
    rows, rmask = tile_rows(tile, N, BLOCK_N, ROWS)
    if PRENORM:
        TR: tl.constexpr = BLOCK_N if ROWS == 0 else ROWS
        NT: tl.constexpr = (N + TR - 1) // TR  # the op's tiles
        xs = xn + tile.to(tl.int64) * K  # row b of this tile at (b NT + tile) K
        rms_norm_rows(x, nw, xs, B, K, EPS, NT * K)
        tl.debug_barrier()
        ag, au = gate_up_mma(wg0, wu0, xs, nw, tl.zeros([BLOCK_B], tl.float32), w, rows, rmask, B, N, K, BLOCK_N,
                             BLOCK_K, STAGES, False, NT * K)
    elif MMA:
        rstd = rms_rstd(x, B, K, BLOCK_B, EPS)
        ag, au = gate_up_mma(wg0, wu0, x, nw, rstd, w, rows, rmask, B, N, K, BLOCK_N, BLOCK_K, STAGES)
    else:
        rstd = rms_rstd(x, B, K, BLOCK_B, EPS)
        z = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
        ag, au = z, z
        wg, wu = wg0, wu0
        for k0 in range(BLOCK_K, K, BLOCK_K):  # double-buffered, as in gemv_rows_t
            ng = load_w_chunk(w, rows, rmask, k0, K, BLOCK_K)
            nu = load_w_chunk(w, rows + N, rmask, k0, K, BLOCK_K)
            ag, au = gate_up_mac(ag, au, x, nw, rstd, wg, wu, k0 - BLOCK_K, B, BLOCK_B, K, BLOCK_K)
            wg, wu = ng, nu
        ag, au = gate_up_mac(ag, au, x, nw, rstd, wg, wu, last_chunk(K, BLOCK_K), B, BLOCK_B, K, BLOCK_K)
    dt = out.dtype.element_ty
    g = rnd(ag, dt)
    u = rnd(au, dt)
    s = rnd(silu(g), dt)
    ob = tl.arange(0, BLOCK_B)
    m = (ob[:, None] < B) & rmask[None, :]
    tl.store(out + ob[:, None] * N + rows[None, :], (s * u).to(dt), mask=m)


def gate_up_reference(op: Op, t: dict) -> None:
    a, N = op.args, op.params["N"]
    h = rms_norm_ref(t[a["x"]], t[a["nw"]], op.params["EPS"])
    w = t[a["w"]]
    if op.params.get("PRENORM"):  # every tile's scratch row holds the normalised activation
        t[a["xn"]].copy_(h[:, None, :].expand_as(t[a["xn"]]))
    t[a["out"]].copy_(F.silu(F.linear(h, w[:N])) * F.linear(h, w[N:]))


GATE_UP = OpKind(
    "gate_up", gate_up_prologue, gate_up_body, ("x", "nw", "w", "xn", "out"),
    ("B", "N", "K", "BLOCK_B", "BLOCK_N", "BLOCK_K", "EPS", "MMA", "STAGES", "PRENORM", "ROWS"), 2, gate_up_reference)


def add_gate_up(graph: Graph, name: str, x: Buffer, nw: Buffer, w: Buffer, *, eps: float,
                tiling: Tiling = Tiling(), gemv: str = "fma", blocks: dict | None = None) -> Buffer:
    """Append ``out[B, F] = silu(RMSNorm(x) Wg^T) * (RMSNorm(x) Wu^T)`` with w = cat(w_gate, w_up) [2F, D];
    returns ``out`` (``{name}.out``). gemv: "fma" | "mma" (``add_gemv_residual``). blocks: overrides of the
    tiling (BLOCK_N, ROWS, BLOCK_K, STAGES, PRENORM; tests and tuning); ROWS (0 < ROWS <= BLOCK_N): a tile's rows,
    held in BLOCK_N register rows (``tiling.gate_up_rows``, the default on the separate kernels' tensor-core path at
    batch 1-2 where the power-of-two tiles take more than one wave). PRENORM (ops/qkv.py's module doc) defaults to on
    for the separate kernels' tensor-core path where the op's tiles fit one wave (at most ``tiling.n_sm``), with
    ``tiling.prenorm_pipeline``'s depth and chunks; it adds the graph's scratch ``tiling.prenorm_scratch``. Raises
    ValueError for PRENORM without gemv "mma" or a ROWS outside [0, BLOCK_N]."""
    B, K = x.shape
    N = w.shape[0] // 2
    es = w.nbytes // (2 * N * K)
    out = graph.add_buffer(f"{name}.out", (B, N), x.dtype, "activation")
    # chunks of both matrices double-buffered in registers: half the elements per matrix, but not on the separate
    # kernels' tensor-core path (one wave of 64-row tiles; ``ops.gemv_mma.mma_stages`` has the measurement)
    elems = MAX_TILE_ELEMS if tiling.separate and check_gemv(gemv, B) else MAX_TILE_ELEMS // 2
    p = {"B": B, "N": N, "K": K, **gemv_blocks(N, K, B, tiling, max_elems=elems, gemv=gemv), "EPS": float(eps)}
    blocks = blocks or {}
    dflt = p["BLOCK_N"]  # the power-of-two tiles' rows (mma_stages' depth is theirs)
    bn = blocks.get("BLOCK_N", dflt)
    rows = blocks.get("ROWS", 0 if "BLOCK_N" in blocks else gate_up_rows(N, dflt, tiling, p["MMA"], B))
    if not 0 <= rows <= bn:
        raise ValueError(f"{name}: ROWS {rows} must be 0 (all BLOCK_N rows) or within BLOCK_N {bn}")
    p = {**p, "BLOCK_N": bn, "ROWS": rows}
    tr = rows or bn  # a tile's rows
    n_tiles = cdiv(N, tr)
    prenorm = bool(blocks.get("PRENORM", prenorm_default(p["MMA"], tiling, n_tiles)))
    if prenorm and not p["MMA"]:
        raise ValueError(f"{name}: PRENORM needs gemv='mma'")
    stages = (prenorm_pipeline(2 * bn, es, K, tiling, n_tiles) if prenorm else
              (mma_stages("gate_up", dflt, p["MMA"], tiling.separate), p["BLOCK_K"]))
    p = {**p, "STAGES": stages[0], "BLOCK_K": stages[1], **blocks, "PRENORM": prenorm}
    xn = prenorm_scratch(graph, n_tiles, B, K, x.dtype) if prenorm else x  # x: unread without PRENORM

    def make(t, n0, n1):
        nbytes, flops = gemv_cost(2 * (n1 - n0), K, B, es, K * es + B * (n1 - n0) * es)
        reads, writes = [region(x), region(nw), region(w, (n0, n1), (0, K)), region(w, (N + n0, N + n1), (0, K))], []
        if prenorm:  # the tile's own row of the scratch: written, then read by its chunk loop
            reads.append(region(xn, (0, B), (t, t + 1), (0, K)))
            writes.append(region(xn, (0, B), (t, t + 1), (0, K)))
            nbytes += 2 * B * K * es
        return reads, writes + [region(out, (0, B), (n0, n1))], nbytes, flops + 8 * B * (n1 - n0)

    graph.add_op(Op(name, GATE_UP, {"x": x.name, "nw": nw.name, "w": w.name, "xn": xn.name, "out": out.name}, p),
                 row_tiled_tasks(N, tr, make))
    return out
