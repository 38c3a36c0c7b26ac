"""The streaming (Gluon) megakernel on a Hopper GPU against the PyTorch reference and the Triton megakernel
(the interpreter-tested path), and its bitwise batch invariance. Skipped without a CUDA sm_90 GPU."""
import pytest
import torch

from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")]


def _state(model, lens, seed, max_len):
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache = KVCache(model.config, len(lens), max_len, torch.bfloat16, "cuda")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g, device="cuda"))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g, device="cuda"))
    cache.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    tokens = torch.randint(0, model.config.vocab_size, (len(lens),), generator=g, device="cuda", dtype=torch.int32)
    return cache, tokens


def _one(model, mode, cache, tokens, **opts):
    c = KVCache(model.config, cache.k.shape[1], cache.k.shape[3], torch.bfloat16, "cuda")
    for a, b in ((c.k, cache.k), (c.v, cache.v), (c.seq_lens, cache.seq_lens)):
        a.copy_(b)
    r = make_step_runner(mode, model, c, **opts)
    logits, nxt = r.step(tokens)
    torch.cuda.synchronize()
    r.check()
    return logits.clone(), nxt.clone(), c


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-3.2-1b"])
def test_gluon_matches_reference_and_is_batch_invariant(name, seed):
    model = load_model(name, random_weights=True, dtype=torch.bfloat16, device="cuda", seed=seed % 1000)
    lens = [300, 217, 45]
    cache, tokens = _state(model, lens, seed, max(lens) + 32)
    ref = _one(model, "reference", cache, tokens)
    tri = _one(model, "megakernel", cache, tokens, backend="triton")
    glu = _one(model, "megakernel", cache, tokens, backend="gluon")
    for other in (ref, tri):
        err = ((glu[0] - other[0]).norm(dim=-1) / other[0].norm(dim=-1)).max().item()
        assert err < 0.08, err  # bf16 rounding of different reduction orders (the Triton path: same size)
    assert torch.equal(glu[1], glu[0].argmax(-1).to(torch.int32))
    b = torch.arange(len(lens), device="cuda")
    pos = cache.seq_lens.long()
    def rows(c):  # the K and V rows this step wrote, one row per (layer, sequence, head)
        return torch.cat([c.k[:, b, :, pos], c.v[:, b, :, pos]]).reshape(-1, c.k.shape[-1]).float()
    kv_err = ((rows(glu[2]) - rows(ref[2])).norm(dim=-1) / rows(ref[2]).norm(dim=-1)).max().item()
    kv_tri = ((rows(tri[2]) - rows(ref[2])).norm(dim=-1) / rows(ref[2]).norm(dim=-1)).max().item()
    assert kv_err < max(0.08, 1.5 * kv_tri), (kv_err, kv_tri)  # elementwise: bf16 ulps of values near zero
    keep = torch.ones_like(glu[2].k, dtype=torch.bool)
    keep[:, b, :, pos] = False
    assert torch.equal(glu[2].k[keep], cache.k[keep]), "a KV row other than seq_lens[b] was written"
    for i, n in enumerate(lens):  # each sequence alone, at batch 1: bitwise the same logits
        one, _ = _state(model, [n], seed, max(lens) + 32)  # the same cache length: the same splits
        one.k.copy_(cache.k[:, i:i + 1])
        one.v.copy_(cache.v[:, i:i + 1])
        alone = _one(model, "megakernel", one, tokens[i:i + 1], backend="gluon")[0]
        assert torch.equal(alone[0], glu[0][i]), f"row {i} differs from its batch-1 run"
