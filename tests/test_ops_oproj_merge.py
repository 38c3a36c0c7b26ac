"""``oproj_merge`` (flash-decoding merge fused into the O-projection + residual) under the Triton interpreter.

The partials come from a real ``attn_partial`` launch (so empty splits have lse = -inf and O = 0), then the O of
every empty split is poisoned with NaN (the kernel must never read it) and the output with NaN (every element
must be written). Every element is compared to (a) the op's PyTorch reference and (b) an independent formula:
``res + naive_attention(q, K, V) @ w^T``. Shapes are awkward: batch 1 and 3, N not a multiple of BLOCK_N,
K = Hq*hd over several BLOCK_K chunks (one chunk spanning two heads, or a head spanning two chunks), NSPLIT with
empty splits, sequence lengths 1 and 97 and different per row, more live splits than CH (the running-max
rescale). fp32, plus one fp16 case; no bf16: the Triton interpreter converts fp32 -> bf16 by truncation (the
GPU rounds to nearest even, as ``rnd`` does), so interpreter bf16 stores cannot match PyTorch's rounding.
"""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from onekernel.exec.codegen import launch_op
from onekernel.graph.deps import derive_dependencies
from onekernel.graph.ir import Graph
from onekernel.ops.attention import add_attn_partial
from onekernel.ops.oproj_merge import MERGE_TILE_ELEMS, add_oproj_merge
from test_ops_attention import naive_attention

CASES = [  # B, Hq, Hkv, hd, S, lengths (seq_lens + 1), SPLIT, N, BLOCK_N, BLOCK_K, CH (None: default), dtype
    (1, 4, 2, 16, 200, [97], 32, 40, 16, 32, None, torch.float32),        # chunk = 2 heads, 4 live splits of 7
    (1, 4, 2, 16, 200, [97], 16, 40, 16, 32, 2, torch.float32),           # 7 live of 13, 2 per chunk: rescaling
    (1, 2, 2, 16, 64, [1], 16, 24, 16, 16, None, torch.float32),          # length 1: one live split of 4
    (3, 6, 2, 32, 200, [1, 97, 200], 64, 40, 16, 16, 1, torch.float32),   # head = 2 chunks, 1/2/4 live, CH 1
    (3, 3, 1, 16, 96, [41, 1, 96], 32, 20, 8, 32, 2, torch.float32),      # K = 48: last chunk partial; 2/1/3 live
    (3, 4, 2, 16, 160, [97, 33, 1], 64, 40, 16, 32, None, torch.float16),  # fp16: rounding of merge and output
]
IDS = [f"B{c[0]}-Hq{c[1]}-hd{c[3]}-SPLIT{c[6]}-CH{c[10]}-{str(c[11])[6:]}" for c in CASES]


def partials_graph(B, Hq, Hkv, hd, S, dtype, split=None):
    """q "q" [B, Hq, hd], caches "kc"/"vc" [B, Hkv, S, hd], "seq_lens"; then attn_partial (op "attn")."""
    g = Graph()
    q = g.add_buffer("q", (B, Hq, hd), dtype, "activation")
    kc = g.add_buffer("kc", (B, Hkv, S, hd), dtype, "kv")
    vc = g.add_buffer("vc", (B, Hkv, S, hd), dtype, "kv")
    sl = g.add_buffer("seq_lens", (B,), torch.int32, "input")
    return g, add_attn_partial(g, "attn", q, kc, vc, sl, split=split)


def build(B, Hq, Hkv, hd, S, lens, split, N, block_n, block_k, ch, dtype, seed=0):
    """Graph (attn_partial + oproj_merge, output "o_proj.out"), its two ops and fresh tensors: random
    q/K/V/w/res, poisoned rest."""
    g, (o_part, lse_part) = partials_graph(B, Hq, Hkv, hd, S, dtype, split)
    wo = g.add_buffer("wo", (N, Hq * hd), dtype, "weight")
    res = g.add_buffer("res", (B, N), dtype, "activation")
    add_oproj_merge(g, "o_proj", o_part, lse_part, wo, res,
                    blocks={"BLOCK_N": block_n, "BLOCK_K": block_k, **({"CH": ch} if ch else {})})
    partial, op = g.ops
    gen = torch.Generator().manual_seed(seed)
    t = {}
    for name, buf in g.buffers.items():
        if name in ("q", "kc", "vc", "wo", "res"):
            scale = 1 / math.sqrt(Hq * hd) if name == "wo" else 1.0
            t[name] = (torch.randn(buf.shape, generator=gen) * scale).to(buf.dtype)
        else:
            t[name] = torch.full(buf.shape, float("nan"), dtype=buf.dtype) if buf.dtype.is_floating_point \
                else torch.empty(buf.shape, dtype=buf.dtype)
    t["seq_lens"] = torch.tensor(lens, dtype=torch.int32) - 1
    return g, partial, op, t


@pytest.mark.parametrize("B,Hq,Hkv,hd,S,lens,split,N,block_n,block_k,ch,dtype", CASES, ids=IDS)
def test_oproj_merge(B, Hq, Hkv, hd, S, lens, split, N, block_n, block_k, ch, dtype, seed):
    g, partial, op, t = build(B, Hq, Hkv, hd, S, lens, split, N, block_n, block_k, ch, dtype, seed)
    NSPLIT = partial.params["NSPLIT"]
    assert op.params["NSPLIT"] == NSPLIT and op.params["K"] == Hq * hd and op.n_tiles == -(-N // block_n)
    assert op.params["CH"] == (ch or min(op.params["NSP2"], MERGE_TILE_ELEMS // block_k))
    assert N % block_n and Hq * hd > block_k  # a partial last tile, several K chunks
    launch_op(g, partial, t)
    ref = {k: v.clone() for k, v in t.items()}
    empty = 0
    for b, n in enumerate(lens):  # the O of an empty split must never be read: poison it
        for s in range(NSPLIT):
            if s * split >= n:
                assert torch.isinf(t["attn.lse_part"][b, :, s]).all()
                t["attn.o_part"][b, :, s] = float("nan")
                empty += 1
    assert empty > 0
    launch_op(g, op, t)
    out = t["o_proj.out"]
    assert not out.isnan().any()

    # (a) the op's reference on the same (unpoisoned) partials
    op.kind.reference(op, ref)
    tol = dict(rtol=2e-3, atol=2e-2) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out, ref["o_proj.out"], **tol)

    # (b) independent formula: x + softmax attention @ wo^T
    attn = naive_attention(t["q"].float(), t["kc"].float(), t["vc"].float(), t["seq_lens"])
    want = t["res"].double() + attn @ t["wo"].double().T
    tol = dict(rtol=2e-3, atol=2e-2) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.double(), want, **tol)


def test_regions_dependencies_and_costs():
    g, partial, op, _ = build(2, 4, 2, 16, 160, [1, 97], 64, 40, 16, 32, None, torch.float32)
    B, Hq, NSPLIT, HD, K, N = 2, 4, 3, 16, 64, 40
    last = g.tasks[op.task_ids[-1]]  # rows 32..40 (clipped to N)
    assert last.writes[0].box == ((0, B), (32, 40))
    assert [r.box for r in last.reads] == [((0, B), (0, Hq), (0, NSPLIT), (0, HD)), ((0, B), (0, Hq), (0, NSPLIT)),
                                           ((32, 40), (0, K)), ((0, B), (32, 40))]
    assert last.bytes == 8 * K * 4 + B * Hq * NSPLIT * (HD + 1) * 4 + 2 * B * 8 * 4
    assert last.flops == 2 * B * 8 * K + 5 * B * K * NSPLIT
    # every O-proj tile waits for every partial tile (it reads all partials of all its rows); tiles of one op
    # are independent; every output element is written by exactly one tile
    deps = derive_dependencies(g)
    for tid in op.task_ids:
        assert set(deps[tid]) == set(partial.task_ids)
    assert sum(math.prod(hi - lo for lo, hi in g.tasks[i].writes[0].box) for i in op.task_ids) == B * N


def test_shape_mismatch_is_rejected():
    g, (o_part, lse_part) = partials_graph(1, 4, 2, 16, 64, torch.float32)
    wo = g.add_buffer("wo", (40, 48), torch.float32, "weight")  # K should be 4 * 16 = 64
    res = g.add_buffer("res", (1, 40), torch.float32, "activation")
    with pytest.raises(ValueError, match="do not fit"):
        add_oproj_merge(g, "o", o_part, lse_part, wo, res)
