"""The device-side inputs of a streaming plan that depend on the weights and buffers, not only on the shapes: the
packed weight stream (each worker's 16 KB GEMV chunks in queue order; for a ``gemv="mma"`` plan, each task's
chunks in k-major blocks and each chunk's elements permuted into the shared-memory layout the MMA operand loads
read, ``stream_base.mma_weight_bases``) and the argument table (every op's buffers as 16-byte offsets from the
base tensor of their dtype). ``exec.stream_runner`` calls them once per runner (the packed stream is shared by
runners of the same weights).
"""
from __future__ import annotations

import numpy as np
import torch

from onekernel.exec import stream_base as sd
from onekernel.exec.stream_base import MMA_WARPS, mma_weight_bases
from onekernel.exec.stream_plan import MAXA, ROLES, StreamPlan


def layout_coords(bases: tuple, shape: tuple) -> torch.Tensor:
    """int64 [prod(shape), len(shape)]: the logical coordinate held at each shared-memory offset (the linear
    layout: the XOR of the bases of the offset's set bits)."""
    n = 1
    for d in shape:
        n *= d
    assert 1 << len(bases) == n, (len(bases), shape)
    off = torch.arange(n)
    out = torch.zeros(n, len(shape), dtype=torch.int64)
    for j, b in enumerate(bases):
        out ^= ((off >> j) & 1)[:, None] * torch.tensor(b, dtype=torch.int64)[None, :]
    return out


def mma_chunk_perm(ck: int, rg: int) -> torch.Tensor:
    """int64 [RG * CK]: perm[o] = the [RG, CK] row-major index of the weight held at offset o of an MMA chunk
    (``packed_chunk.flatten() = chunk.flatten()[perm]``)."""
    ks = ck // MMA_WARPS
    c = layout_coords(mma_weight_bases(ck, rg), (MMA_WARPS, ks, rg))
    return c[:, 2] * ck + c[:, 0] * ks + c[:, 1]


def mma_chunk_order(g0: int, g1: int, nkb: int, gb: int) -> np.ndarray:
    """int64: the order in which the MMA path streams the chunks (group g, kb) = g * nkb + kb of groups [g0, g1):
    blocks of gb groups from g0, each k-major."""
    return np.concatenate([(np.arange(b0, min(b0 + gb, g1))[None, :] * nkb + np.arange(nkb)[:, None]).ravel()
                           for b0 in range(g0, g1, gb)] or [np.zeros(0, np.int64)]).astype(np.int64)


def _op_chunks(w: torch.Tensor, rows: torch.Tensor, nkb: int, rg: int, ck: int, perm) -> torch.Tensor:
    """[groups * nkb, RG, CK]: weight ``w`` [N, K] as chunk groups (group j: the rows ``rows[j]``, -1 = a zero row;
    chunk kb of a group: its columns kb*CK.., K zero-padded to nkb*CK), elements permuted by ``perm`` (MMA) or not."""
    n, k = w.shape
    wp = torch.zeros(n + 1, nkb * ck, dtype=w.dtype, device=w.device)
    wp[:n, :k] = w
    idx = torch.where(rows >= 0, rows, n).to(w.device)
    out = wp[idx].view(-1, rg, nkb, ck).transpose(1, 2).reshape(-1, rg, ck)
    return out if perm is None else out.reshape(-1, rg * ck)[:, perm].reshape(-1, rg, ck)


def pack_weights(plan: StreamPlan, tensors: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight stream bf16/fp16 [chunks, RG, CK] (each worker's GEMV chunks in queue order, back to back) and
    chunk_off int32 [W + 1] (worker w streams chunks chunk_off[w]:chunk_off[w+1]). MMA plans: each task's chunks
    in ``mma_chunk_order``, each chunk's elements permuted by ``mma_chunk_perm`` (module doc). One gather per op
    (its chunks, then every destination of them at once), so a start costs a few launches per op, not per task,
    and only one op's chunk copy is alive at a time."""
    g, c = plan.graph, plan.consts
    rg, ck = c["RG"], c["CK"]
    mma = bool(c.get("MMA"))
    per_task = {}
    for oi, rows in plan.group_rows.items():
        op = g.ops[oi]
        nkb = op.params["NKB"]
        gpu = 2 if plan.kinds[oi] == sd.K_GATEUP.value else 1
        for t in op.task_ids:
            u0, nu = plan.units[t]
            per_task[t] = (oi, u0 * gpu, (u0 + nu) * gpu, nkb)
    dst, src, off = {}, {}, [0]
    for q in plan.schedule.queues:  # each task's chunks: where they go in the stream, which of its op's they are
        o = off[-1]
        for t in q:
            if t not in per_task:
                continue
            oi, g0, g1, nkb = per_task[t]
            n = (g1 - g0) * nkb
            dst.setdefault(oi, []).append(np.arange(o, o + n, dtype=np.int64))
            src.setdefault(oi, []).append(mma_chunk_order(g0, g1, nkb, c["GB"]) if mma
                                          else np.arange(g0 * nkb, g1 * nkb, dtype=np.int64))
            o += n
        off.append(o)
    w0 = next(iter(plan.weight_of.values()))
    dev, dtype = tensors[w0].device, tensors[w0].dtype
    packed = torch.empty(max(off[-1], 1), rg, ck, dtype=dtype, device=dev)
    perm = mma_chunk_perm(ck, rg).to(dev) if mma else None
    for oi, rows in plan.group_rows.items():
        if oi not in dst:
            continue
        chunks = _op_chunks(tensors[plan.weight_of[oi]], rows, g.ops[oi].params["NKB"], rg, ck, perm)
        packed[torch.from_numpy(np.concatenate(dst[oi])).to(dev)] = \
            chunks[torch.from_numpy(np.concatenate(src[oi])).to(dev)]
        del chunks
    return packed, torch.tensor(off, dtype=torch.int32, device=dev)


def scratch_tensors(plan: StreamPlan, device) -> dict:
    """The plan's own buffers, which the step does not hold: the LM head's per-task partials stream.pmax / pidx
    (-1) and attention's arrival counters stream.arrive.* (FOLD; zero, and zero again after each step's last
    arrival: stream_attn._arrive_and_merge)."""
    g = plan.graph
    return {n: torch.full(b.shape, 0 if n.startswith("stream.arrive.") else -1, dtype=b.dtype, device=device)
            for n, b in g.buffers.items() if n.startswith("stream.")}


def arg_table(plan: StreamPlan, tensors: dict, bases: dict) -> torch.Tensor:
    """int64 [ops, MAXA]: each op's buffers (ROLES order) as offsets in 16-byte units from the base tensor of
    their dtype (model dtype, fp32, int32). Raises ValueError for a buffer that is not 16-byte aligned."""
    g = plan.graph
    tab = torch.zeros(len(g.ops), MAXA, dtype=torch.int64)
    for op, kind in zip(g.ops, plan.kinds):
        for j, role in enumerate(ROLES[kind]):
            if role not in op.args:  # attention's out and arrive: only when it merges (stream_plan.FOLD)
                continue
            t = tensors[op.args[role]]
            base = bases[t.dtype]
            delta = t.data_ptr() - base.data_ptr()
            if t.data_ptr() % 16 or delta % 16:
                raise ValueError(f"buffer {op.args[role]!r} of op {op.name!r} is not 16-byte aligned")
            tab[op.index, j] = delta // 16
    return tab
