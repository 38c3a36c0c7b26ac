"""Decode attention (attn_partial + attn_merge) under the Triton interpreter, fp32.

Every output element is checked against (a) the ops' PyTorch references and (b) an independent softmax
attention formula with GQA over positions 0..seq_lens[b]. Outputs start as NaN so unwritten slots fail.
"""
import math

import pytest
import torch

from onekernel.exec.codegen import launch_op
from onekernel.graph.ir import Graph
from onekernel.ops.attention import add_attn_merge, add_attn_partial, choose_split


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


def attention_graph(B, Hq, Hkv, hd, S, split=None, dtype=torch.float32):
    """q [B, Hq, hd], the caches [B, Hkv, S, hd] and seq_lens [B] declared; attn_partial then attn_merge.
    Buffers: "q", "kc", "vc", "seq_lens", "attn.o_part", "attn.lse_part", "merge.out"."""
    g = Graph()
    q = g.add_buffer("q", (B, Hq, hd), dtype, "activation")
    kc = g.add_buffer("kc", (B, Hkv, S, hd), dtype, "kv")
    vc = g.add_buffer("vc", (B, Hkv, S, hd), dtype, "kv")
    sl = g.add_buffer("seq_lens", (B,), torch.int32, "input")
    o_part, lse_part = add_attn_partial(g, "attn", q, kc, vc, sl, split=split)
    add_attn_merge(g, "merge", o_part, lse_part, dtype)
    return g


def build(B, Hq, Hkv, hd, S, lens, split=None, seed=0):
    g = attention_graph(B, Hq, Hkv, hd, S, split)
    gen = torch.Generator().manual_seed(seed)
    t = {}
    for name, buf in g.buffers.items():
        if name in ("q", "kc", "vc"):
            t[name] = torch.randn(buf.shape, generator=gen, dtype=buf.dtype)
        else:
            t[name] = torch.full(buf.shape, float("nan"), dtype=buf.dtype) if buf.dtype.is_floating_point \
                else torch.empty(buf.shape, dtype=buf.dtype)
    t["seq_lens"] = torch.tensor(lens, dtype=torch.int32) - 1
    return g, g.ops, t


CASES = [  # B, Hq, Hkv, hd, S, lengths (seq_lens + 1), split override
    (1, 2, 2, 16, 64, [1], None),                          # ratio 1, length 1, one split
    (1, 4, 4, 64, 130, [97], 128),                         # ratio 1, hd 64, 2 inner blocks of 64 + 33 rows
    (3, 6, 2, 64, 200, [97, 128, 200], 64),                # ratio 3: 97, multiple of SPLIT, S (slot S-1)
    (3, 3, 1, 16, 96, [1, 32, 96], 32),                    # ratio 3, one kv head, S a multiple of SPLIT
    (16, 8, 2, 16, 160, [1 + (37 * i) % 160 for i in range(14)] + [64, 160], 64),  # ratio 4, B 16
    (2, 8, 2, 16, 256, [256, 5], 128),                     # ratio 4, two inner blocks per split
    (2, 8, 1, 16, 96, [96, 40], None),                     # ratio 8: choose_split's SPLIT 32 for wide groups
]


@pytest.mark.parametrize("B,Hq,Hkv,hd,S,lens,split", CASES)
def test_attention(B, Hq, Hkv, hd, S, lens, split, seed):
    g, (partial, merge), t = build(B, Hq, Hkv, hd, S, lens, split, seed)
    SPLIT, NSPLIT = partial.params["SPLIT"], partial.params["NSPLIT"]
    assert NSPLIT == -(-S // SPLIT) and partial.n_tiles == B * Hkv * NSPLIT and merge.n_tiles == B * Hq
    launch_op(g, partial, t)
    launch_op(g, merge, t)
    o, lse, out = t["attn.o_part"], t["attn.lse_part"], t["merge.out"]
    assert not o.isnan().any() and not lse.isnan().any() and not out.isnan().any()

    # (a) op references: partials from the same inputs, merge from the kernel's partials
    ref = {k: v.clone() for k, v in t.items()}
    ref["attn.o_part"].fill_(float("nan"))
    ref["attn.lse_part"].fill_(float("nan"))
    partial.kind.reference(partial, ref)
    torch.testing.assert_close(o, ref["attn.o_part"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, ref["attn.lse_part"], rtol=1e-5, atol=1e-5)  # equal -inf passes
    ref["merge.out"].fill_(float("nan"))
    merge.kind.reference(merge, {**ref, "attn.o_part": o, "attn.lse_part": lse})
    torch.testing.assert_close(out, ref["merge.out"], rtol=1e-4, atol=1e-5)

    # empty splits: lse = -inf and zeros, exactly
    for b, n in enumerate(lens):
        for s in range(NSPLIT):
            empty = s * SPLIT >= n
            assert bool(torch.isinf(lse[b, :, s]).all()) == empty
            if empty:
                assert (o[b, :, s] == 0).all()

    # (b) independent formula
    want = naive_attention(t["q"], t["kc"], t["vc"], t["seq_lens"])
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
        == math.prod(g.buffers["attn.o_part"].shape)
    assert sum(math.prod(hi - lo for lo, hi in tk.writes[0].box) for tk in (g.tasks[i] for i in merge.task_ids)) \
        == math.prod(g.buffers["merge.out"].shape)


def test_choose_split():
    # head dim 128 (the default): at most 4 waves of 132 SMs of tiles per sequence
    assert choose_split(8, 8192) == (128, 64)      # 512 tiles <= 4 waves of 132
    assert choose_split(8, 4096) == (64, 64)
    assert choose_split(8, 4224) == (64, 66)       # 528 tiles: exactly 4 waves
    assert choose_split(8, 4225) == (128, 34)
    assert choose_split(8, 65536) == (256, 256)    # capped at 256
    assert choose_split(2, 512) == (64, 8)
    # head dim <= 64: at most 2 waves
    assert choose_split(8, 8192, head_dim=64) == (256, 32)      # 256 tiles
    assert choose_split(8, 4096, head_dim=64) == (128, 32)      # 64: 512 tiles, more than 2 waves
    assert choose_split(8, 2048, head_dim=64) == (64, 32)       # <= 2048 positions: the 4-wave choice
    assert choose_split(32, 1024, head_dim=64) == (64, 16)      # SmolLM2-1.7B: 512 tiles, 4 waves
    assert choose_split(32, 2048, head_dim=64) == (128, 16)
    assert choose_split(8, 2112, head_dim=64) == (64, 33)       # 264 tiles: exactly 2 waves
    assert choose_split(8, 2113, head_dim=64) == (128, 17)
    assert choose_split(3, 4096, head_dim=64) == (64, 64)       # 192 tiles
    assert choose_split(8, 8192, n_sms=264, head_dim=64) == (128, 64)
    # groups of more than 4 query heads per KV head also take 32 up to 16 tiles a sequence (Llama-3.1-70B: 8 heads a
    # KV head)
    assert choose_split(1, 512, group=8) == (32, 16)            # its TP=8 shard: 1 KV head
    assert choose_split(2, 256, group=8) == (32, 8)             # 16 tiles
    assert choose_split(2, 512, group=8) == (64, 8)             # TP=4: 32 tiles of 32, past the bound
    assert choose_split(8, 512, group=8) == (64, 8)             # TP=1
    assert choose_split(1, 513, group=8) == (64, 9)             # 17 splits of 32
    assert choose_split(1, 4096, group=8) == (64, 64)           # 32 lost at 4096 positions (call 399)
    assert choose_split(8, 4225, group=8) == (128, 34)          # the 4-wave bound as for any group
    assert choose_split(1, 512, group=4) == choose_split(1, 512) == (64, 8)   # 4 heads: as before
    assert choose_split(8, 8192, group=8) == (128, 64)
    for hq, hd, S, (split, nsplit) in ((32, 64, 4096, (128, 32)), (32, 128, 4096, (64, 64)),
                                       (8, 128, 512, (32, 16)), (64, 128, 512, (64, 8)), (32, 128, 512, (64, 8))):
        g = attention_graph(1, hq, 1 if hq == 8 else 8, hd, S)  # the graph's attention op takes its model's rule
        partial = next(o for o in g.ops if o.kind.name == "attn_partial")
        assert (partial.params["SPLIT"], partial.params["NSPLIT"]) == (split, nsplit), (hq, hd)
    with pytest.raises(ValueError, match="Hq % Hkv"):
        attention_graph(1, 6, 4, 64, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or __import__("os").environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU and TRITON_INTERPRET=0")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("B,Hq,Hkv,hd,S,lens", [(1, 32, 8, 128, 4096, [4096]),
                                                 (4, 9, 3, 64, 1000, [1, 97, 512, 1000])])
def test_attention_gpu(B, Hq, Hkv, hd, S, lens, dtype):
    g = attention_graph(B, Hq, Hkv, hd, S, dtype=dtype)
    t = {n: (torch.randn(b.shape, device="cuda").to(b.dtype) if n in ("q", "kc", "vc")
             else torch.full(b.shape, float("nan"), device="cuda", dtype=b.dtype)) for n, b in g.buffers.items()
         if n != "seq_lens"}
    t["seq_lens"] = torch.tensor(lens, dtype=torch.int32, device="cuda") - 1
    for op in g.ops:
        launch_op(g, op, t)
    want = naive_attention(t["q"].cpu().float(), t["kc"].cpu().float(), t["vc"].cpu().float(), t["seq_lens"].cpu())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(t["merge.out"].cpu().double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("text,want", [("", None), ("32", 32), (" 16 ", 16), ("24", None), ("8", None), ("-32", None),
                                       ("abc", None), ("1.5", None)])
def test_split_switch(text, want, monkeypatch):
    """ONEKERNEL_ATTN_SPLIT (a measurement switch) gives every attention op its split; anything but a power of two
    >= 16 is refused with one InputError when a graph is built (the import never fails)."""
    from onekernel.errors import InputError
    from onekernel.ops import attention
    monkeypatch.setattr(attention, "SPLIT_ENV", text)
    if want is None and text:
        with pytest.raises(InputError, match="ONEKERNEL_ATTN_SPLIT"):
            attention_graph(1, 8, 1, 16, 96)
        return
    partial = next(o for o in attention_graph(1, 8, 1, 16, 96).ops if o.kind.name == "attn_partial")
    assert partial.params["SPLIT"] == (want or choose_split(1, 96, head_dim=16, group=8)[0])
