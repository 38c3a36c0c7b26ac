"""Decode attention (attn_partial + attn_merge) under the Triton interpreter, fp32.

Every output element is checked against (a) the ops' PyTorch references and (b) an independent softmax
attention formula with GQA over positions 0..seq_lens[b]. Outputs start as NaN so unwritten slots fail.
"""
import math
from types import SimpleNamespace

import pytest
import torch

from onekernel.exec.codegen import launch_op
from onekernel.graph.ir import Graph
from onekernel.ops import attention
from onekernel.ops.attention import add_attention, choose_split
from onekernel.ops.base import OP_KINDS


def naive_attention(q, k, v, seq_lens):
    """q [B, Hq, hd], k/v [B, Hkv, S, hd] -> [B, Hq*hd]: softmax(q k^T / sqrt(hd)) v over 0..seq_lens[b]."""
    B, Hq, hd = q.shape
    rep = Hq // k.shape[1]
    out = torch.empty(B, Hq * hd, dtype=torch.float64)
    for b in range(B):
        n = int(seq_lens[b]) + 1
        for h in range(Hq):
            kk, vv = k[b, h // rep, :n].double(), v[b, h // rep, :n].double()
            w = torch.softmax(kk @ q[b, h].double() / math.sqrt(hd), 0)
            out[b, h * hd:(h + 1) * hd] = w @ vv
    return out


def build(B, Hq, Hkv, hd, S, lens, split=None, layer=0, seed=0):
    g = Graph()
    cfg = SimpleNamespace(n_heads=Hq, n_kv_heads=Hkv, head_dim=hd)
    ops = add_attention(g, cfg, layer, B, S, torch.float32, split=split)
    gen = torch.Generator().manual_seed(seed)
    t = {}
    for name, buf in g.buffers.items():
        if buf.kind in ("activation", "kv") and name != f"attn.{layer}":
            t[name] = torch.randn(buf.shape, generator=gen, dtype=buf.dtype)
        else:
            t[name] = torch.full(buf.shape, float("nan"), dtype=buf.dtype) if buf.dtype.is_floating_point \
                else torch.empty(buf.shape, dtype=buf.dtype)
    t["seq_lens"] = torch.tensor(lens, dtype=torch.int32) - 1
    return g, ops, t


CASES = [  # B, Hq, Hkv, hd, S, lengths (seq_lens + 1), split override
    (1, 2, 2, 16, 64, [1], None),                          # ratio 1, length 1, one split
    (1, 4, 4, 64, 130, [97], 128),                         # ratio 1, hd 64, 2 inner blocks of 64 + 33 rows
    (3, 6, 2, 64, 200, [97, 128, 200], 64),                # ratio 3: 97, multiple of SPLIT, S (slot S-1)
    (3, 3, 1, 16, 96, [1, 32, 96], 32),                    # ratio 3, one kv head, S a multiple of SPLIT
    (16, 8, 2, 16, 160, [1 + (37 * i) % 160 for i in range(14)] + [64, 160], 64),  # ratio 4, B 16
    (2, 8, 2, 16, 256, [256, 5], 128),                     # ratio 4, two inner blocks per split
]


@pytest.mark.parametrize("B,Hq,Hkv,hd,S,lens,split", CASES)
def test_attention(B, Hq, Hkv, hd, S, lens, split):
    g, (partial, merge), t = build(B, Hq, Hkv, hd, S, lens, split)
    SPLIT, NSPLIT = partial.params["SPLIT"], partial.params["NSPLIT"]
    assert NSPLIT == -(-S // SPLIT) and partial.n_tiles == B * Hkv * NSPLIT and merge.n_tiles == B * Hq
    launch_op(g, partial, t)
    launch_op(g, merge, t)
    o, lse, out = t["attn_o.0"], t["attn_lse.0"], t["attn.0"]
    assert not o.isnan().any() and not lse.isnan().any() and not out.isnan().any()

    # (a) op references: partials from the same inputs, merge from the kernel's partials
    ref = {k: v.clone() for k, v in t.items()}
    ref["attn_o.0"].fill_(float("nan"))
    ref["attn_lse.0"].fill_(float("nan"))
    OP_KINDS["attn_partial"].reference(partial, ref)
    torch.testing.assert_close(o, ref["attn_o.0"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, ref["attn_lse.0"], rtol=1e-5, atol=1e-5)  # equal -inf passes
    ref["attn.0"].fill_(float("nan"))
    OP_KINDS["attn_merge"].reference(merge, {**ref, "attn_o.0": o, "attn_lse.0": lse})
    torch.testing.assert_close(out, ref["attn.0"], rtol=1e-4, atol=1e-5)

    # empty splits: lse = -inf and zeros, exactly
    for b, n in enumerate(lens):
        for s in range(NSPLIT):
            empty = s * SPLIT >= n
            assert bool(torch.isinf(lse[b, :, s]).all()) == empty
            if empty:
                assert (o[b, :, s] == 0).all()

    # (b) independent formula
    want = naive_attention(t["q.0"], t["layers.0.k_cache"], t["layers.0.v_cache"], t["seq_lens"])
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)


def test_regions_and_costs():
    g, (partial, merge), _ = build(2, 8, 2, 16, 160, [1, 1], split=64)
    t0 = g.tasks[partial.task_ids[0 * 3 + 2]]  # b 0, g 0, s 2: rows 128..160 (clipped to S)
    assert t0.reads[1].box == ((0, 1), (0, 1), (128, 160), (0, 16))
    assert t0.writes[0].box == ((0, 1), (0, 4), (2, 3), (0, 16))
    assert t0.bytes == 4 * 16 * 4 + 2 * 32 * 16 * 4 + 4 + 4 * 17 * 4
    m = g.tasks[merge.task_ids[8 + 5]]  # b 1, h 5
    assert m.writes[0].box == ((1, 2), (80, 96)) and m.reads[0].box == ((1, 2), (5, 6), (0, 3), (0, 16))
    # every partial slot is written by exactly one partial task, every output element by one merge task
    assert sum(math.prod(hi - lo for lo, hi in tk.writes[0].box) for tk in (g.tasks[i] for i in partial.task_ids)) \
        == math.prod(g.buffers["attn_o.0"].shape)
    assert sum(math.prod(hi - lo for lo, hi in tk.writes[0].box) for tk in (g.tasks[i] for i in merge.task_ids)) \
        == math.prod(g.buffers["attn.0"].shape)


def test_choose_split():
    assert choose_split(8, 8192) == (128, 64)      # 512 tiles <= 4 waves of 132
    assert choose_split(8, 65536) == (256, 256)    # capped at 256
    assert choose_split(2, 512) == (64, 8)
    with pytest.raises(ValueError):
        add_attention(Graph(), SimpleNamespace(n_heads=6, n_kv_heads=4, head_dim=64), 0, 1, 64, torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or __import__("os").environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU and TRITON_INTERPRET=0")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("B,Hq,Hkv,hd,S,lens", [(1, 32, 8, 128, 4096, [4096]),
                                                 (4, 9, 3, 64, 1000, [1, 97, 512, 1000])])
def test_attention_gpu(B, Hq, Hkv, hd, S, lens, dtype):
    g = Graph()
    ops = add_attention(g, SimpleNamespace(n_heads=Hq, n_kv_heads=Hkv, head_dim=hd), 0, B, S, dtype)
    t = {n: (torch.randn(b.shape, device="cuda").to(b.dtype) if b.kind in ("activation", "kv")
             else torch.full(b.shape, float("nan"), device="cuda", dtype=b.dtype)) for n, b in g.buffers.items()
         if n != "seq_lens"}
    t["seq_lens"] = torch.tensor(lens, dtype=torch.int32, device="cuda") - 1
    t["attn.0"].fill_(float("nan"))
    for op in ops:
        launch_op(g, op, t)
    want = naive_attention(t["q.0"].cpu().float(), t["layers.0.k_cache"].cpu().float(),
                           t["layers.0.v_cache"].cpu().float(), t["seq_lens"].cpu())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(t["attn.0"].cpu().double(), want, rtol=tol, atol=tol)
