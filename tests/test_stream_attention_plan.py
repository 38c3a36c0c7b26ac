"""The streaming megakernel's attention constants (stream_plan, stream_attn.attn_task): the 4 warps split each
split-KV tile's positions in BN-blocks, and merge their softmax states in a shared-memory scratch of fp32
[8 * RP, HD] (the MMA path's partial-sum buffer, or the CUDA-core path's xbuf, grown where it is smaller). CPU
only: the plan's numbers and refusals; the kernel itself runs in tests/test_stream_gpu.py."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from onekernel.exec import stream_plan as sp
from onekernel.exec.stream_support import chunk_shape, unsupported
from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph


def _cuda_step(monkeypatch, cfg, batch=1, seq=1024):
    """The bf16 decode graph of ``cfg`` (cache of ``seq`` positions, the model's GEMV path) and a step stand-in on a
    Hopper device for ``stream_support.unsupported``."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    g, _, _ = decode_graph(cfg, batch, seq, torch.bfloat16)
    return g, SimpleNamespace(graph=g, device=SimpleNamespace(type="cuda"), batch=batch)


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", "llama-3.2-3b", "llama-3.1-70b"])
def test_attention_blocks_tile_each_warps_quarter(name, monkeypatch):
    """BN divides the quarter SPLIT / 4 of a tile that each warp takes, a warp's block has at most 4096 products
    (RP x BN x HD), and the scratch fp32 [8 * RP, HD] fits the buffer it views (MMA: the partial sums, grown
    for Llama-3.1-70B's 8 query heads per KV head at head_dim 128, and counted in the plan's shared memory)."""
    g, step = _cuda_step(monkeypatch, get_config(name))
    assert unsupported(step) is None
    at = next(op.params for op in g.ops if op.kind.name == "attn_partial")
    rp = sp.pow2_ceil(at["HQ"] // at["HKV"])
    bn = sp.attn_bn(at["SPLIT"], rp, at["HD"])
    assert (at["SPLIT"] // 4) % bn == 0 and rp * bn * at["HD"] <= 4096
    _, ck, rg, _ = chunk_shape(g)
    if g.meta.get("gemv") == "mma":  # the accbuf the kernel allocates holds the scratch, and the plan counts it
        groups = sp.acc_groups(rg, rp, at["HD"])
        assert groups * 4 * sp.MMA_ROWS * rg * 4 >= 32 * rp * at["HD"] and groups >= sp.mma_groups(rg)
        assert sp.mma_smem(ck, rg, 1, rp, at["HD"]) == sp.MMA_ROWS * ck * 2 + groups * 4 * sp.MMA_ROWS * rg * 4


@pytest.mark.parametrize("seq,split", [(512, 32), (513, 64), (4096, 64)])
def test_wide_group_takes_split_32_on_a_short_cache(seq, split, monkeypatch):
    """Llama-3.1-70B's TP=8 shard (8 query heads on 1 KV head): SPLIT 32 in the benchmark's cache of 512 positions
    (ops.attention.choose_split: at most 16 tiles a sequence), 64 past it; the CUDA-core attention (the tensor-core
    one takes at most 4 heads) with each warp's quarter of the split in whole blocks of at most 4096 products."""
    from onekernel.dist.sharding import shard_config
    cfg = shard_config(get_config("llama-3.1-70b"), 8, 0).config
    g, step = _cuda_step(monkeypatch, cfg, seq=seq)
    assert unsupported(step) is None
    at = next(op.params for op in g.ops if op.kind.name == "attn_partial")
    assert (at["SPLIT"], at["NSPLIT"]) == (split, -(-seq // split))
    bn = sp.attn_bn(at["SPLIT"], 8, at["HD"])
    assert (at["SPLIT"] // 4) % bn == 0 and 8 * bn * at["HD"] <= 4096
    _, ck, rg, _ = chunk_shape(g)
    assert sp.attn_tc_bufs(ck, at["HD"], at["SPLIT"], at["HQ"], at["HKV"], rg, True) == 0


@pytest.mark.parametrize("name,gemv,want", [("smollm2-135m", "mma", 512), ("smollm2-135m", "fma", 256),
                                            ("smollm2-360m", "mma", 512), ("llama-3.2-1b", "mma", 1024),
                                            ("llama-3.1-8b", "mma", 1024), ("qwen3-0.6b", "mma", 1024)])
def test_chunk_columns_hold_a_kv_block_on_the_tensor_core_path(name, gemv, want):
    """stream_support.attn_cols: on the tensor-core path the chunk columns CK are at least 8 head_dim, so the staged
    tile (32 CK bytes) holds one K and one V block of the 4 warps and attention takes the tensor cores: SmolLM2-135M
    and -360M (head dim 64; K = 576 / 960, which no power of two >= 256 divides) take CK 512 with their K zero-padded
    to 1024, the CUDA-core path keeps 256; models whose every K divides 1024 keep 1024. The padded widths cover
    every K, and the chunk holds CHUNK_ELEMS."""
    cfg = get_config(name)
    g, _, _ = decode_graph(cfg, 1, 1024, torch.bfloat16, gemv=gemv)
    ks, ck, rg, kxb = chunk_shape(g)
    assert ck == want and ck * rg == sp.CHUNK_ELEMS and kxb * ck >= max(ks) and kxb & (kxb - 1) == 0
    at = next(op.params for op in g.ops if op.kind.name == "attn_partial")
    tc = sp.attn_tc_bufs(ck, at["HD"], at["SPLIT"], at["HQ"], at["HKV"], rg, gemv == "mma")
    assert (tc >= 1) == (gemv == "mma"), tc


@pytest.mark.parametrize("kw,why", [(dict(n_heads=4, n_kv_heads=1, head_dim=256), "head dim 256: one K/V view at CK 1024"),
                                    (dict(n_heads=15, n_kv_heads=1, head_dim=64), "15 query heads per KV head")])
def test_chunk_columns_stay_where_attention_stays_on_the_cuda_cores(kw, why):
    """A small model (hidden 640 < 1024) whose attention would not take the tensor cores at the raised CK keeps the old
    CK (the largest power of two >= 256 dividing every K: 256 here), so it pays no padding for nothing
    (stream_support.attn_cols)."""
    cfg = dataclasses.replace(get_config("smollm2-135m"), name="small-640", dim=640, ffn_dim=1728, n_layers=2, **kw)
    g, _, _ = decode_graph(cfg, 1, 1024, torch.bfloat16, gemv="mma")
    _, ck, _, _ = chunk_shape(g)
    assert ck == 256, (why, ck)


def test_chunk_columns_of_a_larger_model_keep_their_divisor():
    """A model of hidden size >= 1024 whose K no power of two >= 8 head_dim divides (hidden 2560, intermediate 9728,
    head dim 128: the largest dividing power is 512) keeps CK 512 without padding (stream_support.attn_cols: the
    raise is measured on latency-bound models only), on both paths."""
    cfg = dataclasses.replace(get_config("llama-3.2-1b"), name="wide-2560", dim=2560, n_heads=20, n_kv_heads=4,
                              head_dim=128, ffn_dim=9728, n_layers=2)
    for gemv in ("mma", "fma"):
        g, _, _ = decode_graph(cfg, 1, 1024, torch.bfloat16, gemv=gemv)
        ks, ck, _, kxb = chunk_shape(g)
        assert ck == 512 and all(k % ck == 0 for k in ks), (gemv, ks, ck)


def test_a_gqa_group_too_wide_for_the_merge_scratch_is_refused(monkeypatch):
    """32 query heads per KV head at head_dim 64: m and l of the 4 warps x RP heads do not fit one row of the
    scratch (4 * RP > HD), so the streaming plan refuses the step with the counts in the reason; 8 per KV head at
    head_dim 128 (Llama-3.1-70B's group) passes, its partial-sum buffer grown to hold the scratch, whose rows
    (the whole buffer viewed as [rows, RP, HD]) stay a power of two."""
    from onekernel.exec.stream_device import scr_rows

    base = get_config("llama-3.2-1b")
    wide = dataclasses.replace(base, name="gqa-32", n_heads=32, n_kv_heads=1, head_dim=64, n_layers=1)
    _, step = _cuda_step(monkeypatch, wide)
    why = unsupported(step)
    assert why is not None and "32 query heads per KV head" in why and "head_dim 64" in why, why
    ok = dataclasses.replace(base, name="gqa-8", n_heads=64, n_kv_heads=8, head_dim=128, dim=8192, n_layers=1)
    g, step = _cuda_step(monkeypatch, ok)
    assert unsupported(step) is None
    _, ck, rg, _ = chunk_shape(g)
    groups = sp.acc_groups(rg, 8, 128)
    rows = scr_rows(groups, rg, 8, 128)
    assert groups > sp.mma_groups(rg) and rows >= 8 and rows & (rows - 1) == 0
    assert rows * 8 * 128 == groups * 4 * sp.MMA_ROWS * rg


@pytest.mark.parametrize("xb,kxb,ck,rp,hd", [(1, 6, 256, 4, 64), (3, 6, 256, 4, 64), (1, 8, 1024, 4, 64),
                                             (2, 2, 256, 8, 128)])
def test_fma_path_counts_the_attention_scratch(xb, kxb, ck, rp, hd):
    """The CUDA-core path's shared memory beside the ring: xbuf's XB rows [XB, KXB, CK] (2-byte) plus attention's
    own scratch fp32 [8, RP, HD] (stream_device allocates both), so the slot count and the mbarrier offset guess
    count what the kernel allocates."""
    assert sp.fma_xbuf_bytes(xb, kxb, ck, rp, hd) == xb * kxb * ck * 2 + 8 * rp * hd * 4
