import torch

from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.sampling import SamplingParams, make_generator, sample, top_k_filter, top_p_filter


def _logits(B=4, V=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g) * 3


def test_greedy_is_argmax():
    x = _logits()
    assert torch.equal(sample(x, SamplingParams()), x.argmax(-1).to(torch.int32))


def test_seeded_sampling_is_reproducible():
    x = _logits()
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=123)
    a = [sample(x, p, g).tolist() for g in [make_generator(p)] for _ in range(10)]
    b = [sample(x, p, g).tolist() for g in [make_generator(p)] for _ in range(10)]
    assert a == b
    assert len({tuple(t) for t in a}) > 1  # it really samples
    p7 = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    g7 = make_generator(p7)
    assert [sample(x, p7, g7).tolist() for _ in range(10)] != a  # another seed, another sequence


def test_top_k_1_equals_greedy():
    x = _logits()
    p = SamplingParams(temperature=1.5, top_k=1, seed=3)
    g = make_generator(p)
    for _ in range(5):
        assert torch.equal(sample(x, p, g), x.argmax(-1).to(torch.int32))


def test_top_k_keeps_k():
    x = _logits()
    kept = torch.isfinite(top_k_filter(x, 17))
    assert (kept.sum(-1) == 17).all()
    assert torch.equal(kept, x >= x.topk(17, -1).values[:, -1:])


def test_top_p_keeps_the_nucleus():
    x = _logits()
    for top_p in (0.1, 0.5, 0.9, 0.99):
        kept = torch.isfinite(top_p_filter(x, top_p))
        for b in range(x.shape[0]):
            probs = x[b].softmax(-1)
            order = probs.argsort(descending=True)
            cum = probs[order].cumsum(0)
            n = int((cum < top_p).sum()) + 1  # smallest prefix whose probability sum reaches top_p
            want = torch.zeros_like(kept[b])
            want[order[:n]] = True
            assert torch.equal(kept[b], want), (top_p, b)


def test_top_p_samples_only_from_the_nucleus():
    x = _logits(B=2)
    p = SamplingParams(temperature=1.0, top_p=0.5, seed=1)
    kept = torch.isfinite(top_p_filter(x, 0.5))
    g = make_generator(p)
    for _ in range(50):
        t = sample(x, p, g).long()
        assert kept[torch.arange(2), t].all()


def test_generate_with_sampling_is_reproducible():
    m = load_model("tiny", random_weights=True)
    p = SamplingParams(temperature=1.0, top_k=50, seed=5)
    a = generate(m, ["hello", "hi"], max_new_tokens=8, sampling=p)
    b = generate(m, ["hello", "hi"], max_new_tokens=8, sampling=p)
    assert [s.generated_ids for s in a.sequences] == [s.generated_ids for s in b.sequences]


def test_each_sequence_has_its_own_random_stream():
    """A sequence's samples depend only on its prompt, seed and sampling parameters: alone, beside another
    prompt, twice in one batch (both copies) and in another row it gives the same tokens (the generator was
    once shared by the whole batch, so every one of these differed)."""
    m = load_model("tiny", random_weights=True)
    p = SamplingParams(temperature=1.0, seed=7)

    def run(prompts, sampling=p):
        return [s.generated_ids for s in generate(m, prompts, max_new_tokens=12, sampling=sampling).sequences]

    alone = run(["The cat sat"])[0]
    assert run(["The cat sat", "Hello there"]) == [alone, run(["Hello there"])[0]]
    assert run(["The cat sat", "The cat sat"]) == [alone, alone]
    assert run(["Hello there", "The cat sat"])[1] == alone
    # one SamplingParams per prompt: each row keeps its own seed and parameters; a greedy row stays greedy
    other = SamplingParams(temperature=0.7, top_k=20, seed=3)
    greedy = run(["The cat sat"], SamplingParams())[0]
    assert run(["The cat sat"] * 3, [p, other, SamplingParams()]) == [alone, run(["The cat sat"], other)[0], greedy]
    assert alone != greedy  # it really samples


def test_per_prompt_sampling_must_match_the_prompts():
    import pytest

    from onekernel.errors import InputError
    m = load_model("tiny", random_weights=True)
    with pytest.raises(InputError, match="one SamplingParams per prompt"):
        generate(m, ["a", "b"], max_new_tokens=1, sampling=[SamplingParams()])
    with pytest.raises(InputError, match="SamplingParams"):
        generate(m, ["a"], max_new_tokens=1, sampling=[0.5])
