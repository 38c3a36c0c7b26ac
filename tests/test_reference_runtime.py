"""Self-consistency of the reference decoder and the KV cache on small random models (fast, CPU, fp32)."""
import pytest
import torch

from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner, prefill


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen3"])
def model(request):
    return load_model(request.param, random_weights=True, seed=1)


def test_decode_matches_prefill_of_longer_prompt(model):
    """prefill(p) + decode(t) must give the same logits as prefill(p + [t]), for a right-padded batch."""
    prompts = [[5, 7, 9, 11, 13], [3, 4]]
    nxt = [17, 19]
    cache = KVCache(model.config, 2, 16, torch.float32, "cpu")
    prefill(model, cache, prompts)
    assert cache.seq_lens.tolist() == [5, 2]
    got = ReferenceRunner(model, cache).step(torch.tensor(nxt, dtype=torch.int32))[0]
    assert cache.seq_lens.tolist() == [5, 2]  # the caller increments
    for b, (p, t) in enumerate(zip(prompts, nxt)):
        c1 = KVCache(model.config, 1, 16, torch.float32, "cpu")
        want = prefill(model, c1, [p + [t]])[0]
        torch.testing.assert_close(got[b], want, atol=1e-4, rtol=1e-4)
        n = len(p) + 1
        torch.testing.assert_close(cache.k[:, b, :, :n], c1.k[:, 0, :, :n], atol=1e-5, rtol=1e-5)


def test_runner_step_and_greedy(model):
    cache = KVCache(model.config, 1, 8, torch.float32, "cpu")
    runner = ReferenceRunner(model, cache)
    runner.prefill([[1, 2, 3]])
    logits, nxt = runner.step(torch.tensor([4], dtype=torch.int32))
    assert logits.dtype == torch.float32 and logits.shape == (1, model.config.vocab_size)
    assert nxt.dtype == torch.int32 and nxt.tolist() == [int(logits.argmax())]


def test_kv_cache_shapes_reset_reallocate(model):
    cfg = model.config
    cache = KVCache(cfg, 3, 10, torch.float32, "cpu")
    assert cache.k.shape == (cfg.n_layers, 3, cfg.n_kv_heads, 10, cfg.head_dim) == cache.v.shape
    assert cache.seq_lens.dtype == torch.int32 and cache.seq_lens.shape == (3,)
    ptr = cache.k.data_ptr()
    cache.k.fill_(1.0)
    cache.seq_lens.fill_(4)
    cache.reset()
    assert cache.k.data_ptr() == ptr and cache.k.abs().sum() == 0 and cache.seq_lens.sum() == 0
    old = (cache.k.data_ptr(), cache.v.data_ptr(), cache.seq_lens.data_ptr())
    cache.reallocate()
    assert all(a != b for a, b in zip(old, (cache.k.data_ptr(), cache.v.data_ptr(), cache.seq_lens.data_ptr())))
    assert cache.k.shape == (cfg.n_layers, 3, cfg.n_kv_heads, 10, cfg.head_dim)
