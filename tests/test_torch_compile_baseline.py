"""The torch.compile baseline (gpt-fast layout: weights, KV cache, tokens and seq_lens as module buffers)
computes the reference decode step; compiled on the CPU with a tracing-only backend (Inductor's CUDA graphs
need a GPU), so this checks the traced graph, its in-place cache writes and that new positions don't retrace."""
import pytest
import torch

from onekernel.bench.baselines import StaticDecoder, TorchCompileRunner
from onekernel.bench.modes import make_bench_runner
from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner


@pytest.mark.parametrize("name,backend", [("tiny", "aot_eager"), ("tiny-qwen3", "eager")])
def test_compiled_module_matches_reference(name, backend, twin_caches, seed):
    model = load_model(name, random_weights=True, seed=seed)
    caches, g = twin_caches(model, 3, 24, [0, 7, 21], seed)
    ref = ReferenceRunner(model, caches[0])
    r = TorchCompileRunner(model, caches[1], compile_kwargs={"backend": backend, "fullgraph": True})
    assert r.module.k_cache.data_ptr() == caches[1].k.data_ptr()  # the cache is aliased, not copied
    for _ in range(3):  # positions advance: the compiled step reads seq_lens from its buffer
        tokens = torch.randint(0, model.config.vocab_size, (3,), generator=g, dtype=torch.int32)
        want = ref.step(tokens)[0].clone()
        logits, nxt = r.step(tokens)
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(nxt, want.argmax(-1).to(torch.int32))
        torch.testing.assert_close(caches[1].k, caches[0].k)
        torch.testing.assert_close(caches[1].v, caches[0].v)
        for c in caches:
            c.seq_lens += 1
    r.check()  # no recompilation after warm-up


def test_module_buffers_are_static_and_tied_head_is_shared():
    model = load_model("tiny-qwen3", random_weights=True)  # tied embeddings
    cache = KVCache(model.config, 2, 8, torch.float32, "cpu")
    m = StaticDecoder(model, cache)
    assert m.names["lm_head"] == m.names["tok_embeddings"]
    for n, b in m.named_buffers():
        assert getattr(b, "_dynamo_static_input_type", None), n
    assert m.seq_lens is cache.seq_lens and m.tokens.shape == (2,)
    assert isinstance(make_bench_runner("torch+compile", model, cache, compile_kwargs={"backend": "eager"}),
                      TorchCompileRunner)
