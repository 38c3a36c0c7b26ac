"""Batch buckets in ``generate`` (issue 12 item 4): a kernel mode runs 3 prompts at the batch-4 bucket, padded
with one-token rows, and every prompt still gets the tokens it gets alone (greedy and seeded sampling)."""
import pytest
import torch

from onekernel.models.load import load_model
from onekernel.runtime import generate as gen_mod
from onekernel.runtime.generate import generate
from onekernel.runtime.sampling import SamplingParams


def test_three_prompts_run_at_bucket_four_and_equal_each_alone(seed, monkeypatch):
    model = load_model("tiny", random_weights=True, seed=seed % 1000)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in (7, 2, 12)]
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=seed + i) if i != 1 else SamplingParams()
              for i in range(3)]  # seeded sampling and greedy (the kernel's argmax)
    built = []
    real = gen_mod.make_step_runner

    def spy(mode, model, cache, **kw):
        built.append(cache.k.shape[1])
        return real(mode, model, cache, **kw)
    monkeypatch.setattr(gen_mod, "make_step_runner", spy)
    res = generate(model, prompts, max_new_tokens=3, mode="eager", interpret=True, sampling=params,
                   ignore_eos=True, max_seq_len=32)
    assert res.bucket == 4 and built == [4], (res.bucket, built)
    assert len(res.sequences) == 3 and [s.prompt_ids for s in res.sequences] == prompts
    for p, sp, s in zip(prompts, params, res.sequences):
        alone = generate(model, [p], max_new_tokens=3, mode="eager", interpret=True, sampling=sp, ignore_eos=True,
                         max_seq_len=32).sequences[0]
        assert s.generated_ids == alone.generated_ids and len(s.generated_ids) == 3


def test_reference_mode_runs_the_batch_as_given(seed):
    model = load_model("tiny", random_weights=True, seed=seed % 1000)
    res = generate(model, [[5, 6, 7], [8, 9], [10]], max_new_tokens=2, ignore_eos=True)
    assert res.bucket == 3 and len(res.sequences) == 3
