"""The PyTorch baseline's capturable decode step computes the reference decode step."""
import torch

from onekernel.bench.baselines import static_decode_step
from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import decode_step


def test_static_decode_step_matches_reference():
    seed = int(torch.randint(0, 10_000, ()))
    model = load_model("tiny", random_weights=True, seed=seed)
    caches = [KVCache(model.config, 3, 24, torch.float32, "cpu") for _ in range(2)]
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(caches[0].k.shape, generator=g), torch.randn(caches[0].v.shape, generator=g)
    lens = torch.tensor([0, 7, 23], dtype=torch.int32)
    for c in caches:
        c.k.copy_(k); c.v.copy_(v); c.seq_lens.copy_(lens)
    tokens = torch.randint(0, model.config.vocab_size, (3,), generator=g, dtype=torch.int32)
    want = decode_step(model, caches[0], tokens)
    got = static_decode_step(model, caches[1], tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1].k, caches[0].k)
    torch.testing.assert_close(caches[1].v, caches[0].v)
