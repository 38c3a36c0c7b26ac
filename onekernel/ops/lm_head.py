"""``lm_head`` (final RMSNorm + vocab GEMV -> fp32 logits + per-tile argmax partials) and ``argmax``.

lm_head, tile t = BLOCK_N vocab rows [t*BLOCK_N, ...) for all B rows (model dtype dt):
    h = LlamaRMSNorm(x) with weight ``norm``;   logits[b, n] = float((h[b] @ lm_head[n]).to(dt))
(HF: ``lm_head`` runs in dt, then ``.float()``), and per tile the partials
    pmax[b, t] = max_n logits[b, n],   pidx[b, t] = smallest n reaching it          (fp32 / int32 [B, T])
argmax, one task: next_tokens[b] = pidx[b, t*] with t* the smallest t maximising pmax[b, t]; that is the
smallest index of the row maximum, exactly ``torch.argmax`` (NaN logits are not handled).
Batch invariance: the logits use the per-row GEMV of ops/gemv_rows.py or the tensor-core GEMV of ops/gemv_mma.py
(``MMA``; tiles independent of B either way); max/argmax are
exact (order-free, ties to the smallest index), so argmax's B-dependent BLOCK_T cannot change a result.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from onekernel.graph.ir import Buffer, Graph, Op, Task
from onekernel.ops.base import OpKind
from onekernel.ops.gemv_mma import gemv_mma
from onekernel.ops.gemv_rows import gemv_rows, load_w_chunk, rms_norm_ref, rms_rstd, rnd, tile_rows
from onekernel.ops.tiling import Tiling, cdiv, gemv_blocks, gemv_cost, pow2_ceil, region, row_tiled_tasks


@triton.jit
def lm_head_prologue(tile, x, nw, w, logits, pmax, pidx, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                     T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EPS: tl.constexpr, MMA: tl.constexpr):
    rows, rmask = tile_rows(tile, N, BLOCK_N)
    return load_w_chunk(w, rows, rmask, 0, K, BLOCK_K)


@triton.jit
def lm_head_body(tile, w0, x, nw, w, logits, pmax, pidx, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 T: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EPS: tl.constexpr, MMA: tl.constexpr):
    rows, rmask = tile_rows(tile, N, BLOCK_N)
    rstd = rms_rstd(x, B, K, BLOCK_B, EPS)
    if MMA:  # tensor cores (ops/gemv_mma.py), BLOCK_B = 16
        acc = gemv_mma(w0, x, nw, rstd, w, rows, rmask, B, K, BLOCK_N, BLOCK_K, True)
    else:
        acc = gemv_rows(w0, x, nw, rstd, w, rows, rmask, B, K, BLOCK_B, BLOCK_N, BLOCK_K, True)
    lg = rnd(acc, x.dtype.element_ty)
    ob = tl.arange(0, BLOCK_B)
    bm = ob < B
    tl.store(logits + ob.to(tl.int64)[:, None] * N + rows[None, :], lg, mask=bm[:, None] & rmask[None, :])
    vals = tl.where(rmask[None, :], lg, -float("inf"))
    m = tl.max(vals, axis=1)
    i = tl.argmax(vals, axis=1, tie_break_left=True).to(tl.int32) + tile * BLOCK_N
    tl.store(pmax + ob * T + tile, m, mask=bm)
    tl.store(pidx + ob * T + tile, i, mask=bm)


def lm_head_reference(op: Op, t: dict) -> None:
    a, p = op.args, op.params
    B, N, T, BN = p["B"], p["N"], p["T"], p["BLOCK_N"]
    lg = F.linear(rms_norm_ref(t[a["x"]], t[a["nw"]], p["EPS"]), t[a["w"]]).float()
    t[a["logits"]].copy_(lg)
    pad = torch.full((B, T * BN), float("-inf"), device=lg.device)
    pad[:, :N] = lg
    m, i = pad.view(B, T, BN).max(dim=-1)
    t[a["pmax"]].copy_(m)
    t[a["pidx"]].copy_((i + torch.arange(T, device=lg.device) * BN).to(torch.int32))


LM_HEAD = OpKind(
    "lm_head", lm_head_prologue, lm_head_body, ("x", "nw", "w", "logits", "pmax", "pidx"),
    ("B", "N", "K", "T", "BLOCK_B", "BLOCK_N", "BLOCK_K", "EPS", "MMA"), 1, lm_head_reference)


@triton.jit
def argmax_prologue(tile, pmax, pidx, out, B: tl.constexpr, T: tl.constexpr, BLOCK_B: tl.constexpr,
                    BLOCK_T: tl.constexpr):
    return tl.arange(0, BLOCK_B)


@triton.jit
def argmax_body(tile, ob, pmax, pidx, out, B: tl.constexpr, T: tl.constexpr, BLOCK_B: tl.constexpr,
                BLOCK_T: tl.constexpr):
    bm = ob < B
    best = tl.full([BLOCK_B], -float("inf"), tl.float32)
    bidx = tl.zeros([BLOCK_B], tl.int32)
    for t0 in range(0, T, BLOCK_T):
        ot = t0 + tl.arange(0, BLOCK_T)
        v = tl.load(pmax + ob[:, None] * T + ot[None, :], mask=bm[:, None] & (ot[None, :] < T),
                    other=-float("inf"), cache_modifier=".cg")
        cm = tl.max(v, axis=1)
        ci = tl.argmax(v, axis=1, tie_break_left=True)
        gi = tl.load(pidx + ob * T + t0 + ci, mask=bm, other=0, cache_modifier=".cg")
        upd = cm > best
        best = tl.where(upd, cm, best)
        bidx = tl.where(upd, gi, bidx)
    tl.store(out + ob, bidx, mask=bm)


def argmax_reference(op: Op, t: dict) -> None:
    a = op.args
    pm, pi = t[a["pmax"]], t[a["pidx"]]
    best = pm.argmax(dim=-1, keepdim=True)
    t[a["out"]].copy_(pi.gather(1, best)[:, 0])


ARGMAX = OpKind("argmax", argmax_prologue, argmax_body, ("pmax", "pidx", "out"),
                ("B", "T", "BLOCK_B", "BLOCK_T"), 1, argmax_reference)


def add_lm_head(graph: Graph, name: str, x: Buffer, nw: Buffer, w: Buffer, *, eps: float,
                tiling: Tiling = Tiling(), gemv: str = "fma", blocks: dict | None = None) -> tuple[Buffer, Buffer]:
    """Append ``lm_head`` (op ``name``) and ``argmax`` (op ``{name}.argmax``); returns ``{name}.logits`` fp32
    [B, V] and ``{name}.next_tokens`` int32 [B] (outputs), with the partials ``{name}.pmax``/``.pidx`` as
    scratch. gemv: "fma" | "mma" (CUDA or tensor cores, ops/tiling.py ``check_gemv``). blocks: tiling
    overrides (BLOCK_N, BLOCK_K of lm_head; BLOCK_T, tiles per argmax chunk)."""
    B, K = x.shape
    N = w.shape[0]
    es = w.nbytes // (N * K)
    blocks = dict(blocks or {})
    block_t = blocks.pop("BLOCK_T", None)
    p = {"B": B, "N": N, "K": K, **gemv_blocks(N, K, B, tiling, gemv=gemv), "EPS": float(eps), **blocks}
    T = p["T"] = cdiv(N, p["BLOCK_N"])
    logits = graph.add_buffer(f"{name}.logits", (B, N), torch.float32, "output")
    next_tokens = graph.add_buffer(f"{name}.next_tokens", (B,), torch.int32, "output")
    pmax = graph.add_buffer(f"{name}.pmax", (B, T), torch.float32, "scratch")
    pidx = graph.add_buffer(f"{name}.pidx", (B, T), torch.int32, "scratch")

    def make(t, n0, n1):
        nbytes, flops = gemv_cost(n1 - n0, K, B, es, K * es + 4 * B * (n1 - n0) + 8 * B)
        return ([region(x), region(nw), region(w, (n0, n1), (0, K))],
                [region(logits, (0, B), (n0, n1)), region(pmax, (0, B), (t, t + 1)),
                 region(pidx, (0, B), (t, t + 1))], nbytes, flops)

    args = {"x": x, "nw": nw, "w": w, "logits": logits, "pmax": pmax, "pidx": pidx}
    graph.add_op(Op(name, LM_HEAD, {role: b.name for role, b in args.items()}, p),
                 row_tiled_tasks(N, p["BLOCK_N"], make))
    bb = pow2_ceil(B)
    ap = {"B": B, "T": T, "BLOCK_B": bb, "BLOCK_T": block_t or min(pow2_ceil(T), max(16, 4096 // bb))}
    task = Task(-1, 0, (region(pmax), region(pidx)), (region(next_tokens),), 8 * B * T + 4 * B, B * T)
    graph.add_op(Op(f"{name}.argmax", ARGMAX, {"pmax": pmax.name, "pidx": pidx.name, "out": next_tokens.name},
                    ap), [task])
    return logits, next_tokens
