"""The PyTorch baseline's capturable decode step computes the reference decode step."""
import torch

from onekernel.bench.baselines import static_decode_step
from onekernel.models.load import load_model
from onekernel.runtime.reference import decode_step


def test_static_decode_step_matches_reference(twin_caches):
    seed = int(torch.randint(0, 10_000, ()))
    model = load_model("tiny", random_weights=True, seed=seed)
    caches, g = twin_caches(model, 3, 24, [0, 7, 23], seed)
    tokens = torch.randint(0, model.config.vocab_size, (3,), generator=g, dtype=torch.int32)
    want = decode_step(model, caches[0], tokens)
    got = static_decode_step(model, caches[1], tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1].k, caches[0].k)
    torch.testing.assert_close(caches[1].v, caches[0].v)
