"""Tensor-parallel sharding (onekernel.dist.sharding): local shapes for every named config and valid TP size, the
shards partition the weights exactly, vocabulary ranges, and the refusals of TP sizes that do not fit."""
import dataclasses

import pytest
import torch

from onekernel.dist.sharding import check_tp, shard_config, shard_weights, valid_tp_sizes, vocab_range
from onekernel.errors import DeviceError, InputError, UnsupportedModelError
from onekernel.models.config import CONFIG_NAMES, expected_shapes, get_config
from onekernel.models.random_init import random_weights


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_local_shapes_of_every_valid_tp_size(name):
    cfg = get_config(name)
    meta = {n: torch.empty(s, device="meta") for n, s in expected_shapes(cfg).items()}
    if cfg.tie_embeddings:
        meta["lm_head"] = meta["tok_embeddings"]
    sizes = [t for t in (1, 2, 4, 8) if t in valid_tp_sizes(cfg)]
    assert 1 in sizes
    for t in sizes:
        vocab = 0
        for r in range(t):
            s = shard_config(cfg, t, r)
            c = s.config
            assert (c.n_heads, c.n_kv_heads, c.ffn_dim) == (cfg.n_heads // t, cfg.n_kv_heads // t, cfg.ffn_dim // t)
            assert (c.dim, c.head_dim, c.n_layers) == (cfg.dim, cfg.head_dim, cfg.n_layers)
            w = shard_weights(s, meta)
            assert {n: tuple(x.shape) for n, x in w.items()} == expected_shapes(c)
            assert (w["lm_head"] is w["tok_embeddings"]) == cfg.tie_embeddings
            vocab += c.vocab_size
        assert vocab == cfg.vocab_size


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_shards_partition_the_weights(name, seed):
    """Concatenating the ranks' shards along their split dimension gives back every weight; the replicated ones
    are the same tensors."""
    cfg = dataclasses.replace(get_config(name), vocab_size=253)  # 253 = 127 + 126: uneven vocabulary ranges
    full = random_weights(cfg, torch.float32, "cpu", seed)
    shards = [shard_weights(shard_config(cfg, 2, r), full) for r in range(2)]
    split_dim = {"wq": 0, "wk": 0, "wv": 0, "w_gate": 0, "w_up": 0, "tok_embeddings": 0, "lm_head": 0,
                 "wo": 1, "w_down": 1}
    for n, w in full.items():
        dim = split_dim.get(n.rsplit(".", 1)[-1])
        if dim is None:
            assert all(s[n] is w for s in shards), n
        else:
            assert torch.equal(torch.cat([s[n] for s in shards], dim), w), n


def test_kv_heads_follow_their_q_heads():
    """Rank r's q heads read (under GQA) exactly the KV heads it holds."""
    cfg = get_config("llama-3.1-8b")  # 32 q heads, 8 KV heads
    for t in (2, 4, 8):
        for r in range(t):
            c = shard_config(cfg, t, r).config
            rep = cfg.n_heads // cfg.n_kv_heads
            q_heads = range(r * c.n_heads, (r + 1) * c.n_heads)
            assert {h // rep for h in q_heads} == set(range(r * c.n_kv_heads, (r + 1) * c.n_kv_heads))


@pytest.mark.parametrize("vocab", [256, 253, 151936, 7])
def test_vocab_ranges(vocab):
    for t in range(1, 9):
        ranges = [vocab_range(vocab, t, r) for r in range(t)]
        assert ranges[0][0] == 0 and ranges[-1][1] == vocab
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [b - a for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("name, tp, named, valid", [
    ("tiny", 3, "n_heads=4, n_kv_heads=2, ffn_dim=128", "1, 2"),
    ("smollm2-135m", 2, "n_heads=9, n_kv_heads=3", "1, 3"),
    ("llama-3.1-8b", 16, "n_kv_heads=8", "1, 2, 4, 8"),
    ("qwen3-8b", 3, "n_heads=32, n_kv_heads=8", "1, 2, 4, 8"),
])
def test_tp_sizes_that_do_not_divide_are_refused(name, tp, named, valid):
    with pytest.raises(UnsupportedModelError) as e:
        check_tp(get_config(name), tp)
    msg = str(e.value)
    assert f"tensor-parallel size {tp} does not divide {named}; " in msg
    cfg = get_config(name)
    assert f"n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads}, ffn_dim={cfg.ffn_dim}" in msg
    assert msg.endswith(f"valid TP sizes for this model: {valid}")


@pytest.mark.parametrize("tp", [0, -1, 1.5, "2", True])
def test_tp_of_the_wrong_kind(tp):
    with pytest.raises(InputError, match="integer >= 1"):
        check_tp(get_config("tiny"), tp)


def test_more_ranks_than_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match="--tp 2 needs 2 GPUs .* but 1 are visible"):
        check_tp(get_config("tiny"), 2, "cuda")
    assert check_tp(get_config("tiny"), 2, "cpu") == 2


@pytest.mark.parametrize("rank", [-1, 2, None])
def test_rank_outside_the_group(rank):
    with pytest.raises(InputError, match=r"rank must be an integer in \[0, 2\)"):
        shard_config(get_config("tiny"), 2, rank)
