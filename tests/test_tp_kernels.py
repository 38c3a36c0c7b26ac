"""The kernel modes at tensor-parallel size 2 on the CPU: each rank's Triton step (eager launches, with the
all-reduces after embed, o_proj and down and the gathered logits) in the Triton interpreter over gloo, two
processes, against the single-device PyTorch reference; the symmetric-memory all-reduce's refusals off a GPU."""
import random

import pytest
import torch

from onekernel.dist.allreduce import check_allreduce
from onekernel.errors import InputError
from onekernel.models.config import get_config
from test_tp import _reference, _run_ranks

pytestmark = pytest.mark.xdist_group("tp-ranks")  # one worker runs the TP ranks' tests (see tests/test_tp.py)


@pytest.mark.parametrize("gemv", [None, "mma"])
def test_tp2_kernel_step_equals_tp1_reference(gemv, seed, tmp_path):
    """Mode "graph" (in the interpreter: its eager launches with the same host calls) on ``tiny`` with a
    vocabulary of 253 (ranges of 127 and 126 rows), on the model's GEMV path (fp32: "fma") and on the tensor-core
    path (gemv="mma": o_proj and down's row-parallel partials through the MMA GEMV, rank 0 adding the residual):
    every logit of every step within fp32 rounding of the TP=1 reference (the kernels sum in another order than
    PyTorch), greedy tokens (distributed argmax) equal where the top-2 margin is clear, rank 0's KV cache equal to
    the first half of the reference's KV heads. The step's outputs start poisoned (NaN, -1), so a logit or token
    no rank wrote fails."""
    import dataclasses

    cfg = dataclasses.replace(get_config("tiny"), vocab_size=253)
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(cfg.vocab_size) for _ in range(n)] for n in (4, 2)]
    steps = 3
    out = tmp_path / "rank0.pt"
    _run_ranks(2, {"model": "tiny", "vocab": 253, "tp": 2, "seed": seed, "prompts": prompts, "steps": steps,
                   "out": str(out), "mode": "graph", "gemv": gemv}, env={"TRITON_INTERPRET": "1"}, timeout=300)
    got = torch.load(out)
    assert got["gemv"] == (gemv or "fma")
    want_logits, want_tokens, cache = _reference(cfg, seed, prompts, steps)
    assert got["logits"].shape == want_logits.shape == (steps + 1, 2, cfg.vocab_size)
    assert torch.isfinite(got["logits"]).all()
    scale = want_logits.abs().max()
    err = (got["logits"] - want_logits).abs().max() / scale
    assert err < 1e-5, f"TP=2 kernel logits differ from the TP=1 reference by {err:.2e} of their range"
    top2 = want_logits.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 1e-4 * scale
    assert clear.float().mean() > 0.8
    assert torch.equal(got["tokens"][clear], want_tokens[clear])
    hkv = cfg.n_kv_heads // 2
    torch.testing.assert_close(got["k"], cache.k[:, :, :hkv], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["v"], cache.v[:, :, :hkv], rtol=1e-5, atol=1e-5)


def test_symm_allreduce_is_refused_off_a_gpu():
    with pytest.raises(InputError, match="--allreduce symm needs CUDA GPUs"):
        check_allreduce("symm", "cpu")
    with pytest.raises(InputError, match="unknown all-reduce 'mpi'"):
        check_allreduce("mpi", "cpu")
    with pytest.raises(InputError, match="reduces float32 or bfloat16"):
        check_allreduce("symm", "cuda", torch.float16)
    assert check_allreduce("nccl", "cpu") == "nccl"
    with pytest.raises(InputError, match="--allreduce oneshot needs CUDA GPUs"):
        check_allreduce("oneshot", "cpu")


def test_after_names_must_be_ops():
    from onekernel.models.load import load_model
    from onekernel.runtime.kv_cache import KVCache
    from onekernel.runtime.runners import make_step_runner

    tiny = load_model("tiny", random_weights=True)
    with pytest.raises(InputError, match="after= names o_proj.99, which are not ops"):
        make_step_runner("eager", tiny, KVCache(tiny.config, 1, 8, torch.float32, "cpu"), interpret=True,
                         after={"o_proj.99": lambda: None})


def test_cli_generate_tp2_eager_equals_tp1(seed):
    """`onekernel generate --tp 2 --mode eager --interpret` (the CLI's launcher, gloo, the Triton interpreter)
    emits the greedy tokens of --tp 1's reference mode (fp32: the logits differ by rounding only; the seed is
    fixed per test, so a near-tie cannot make it flaky)."""
    import json

    from test_tp import _cli

    args = ("generate", "--model", "tiny", "--random-weights", "--prompt", "hello", "--max-new-tokens", "2",
            "--json", "--quiet", "--seed", str(seed))
    rc, out, err = _cli(*args, "--mode", "eager", "--interpret", "--tp", "2", "--allreduce", "nccl",
                        env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert rc == 0, err
    got = json.loads(out)
    rc, out, err = _cli(*args, "--mode", "reference")
    assert rc == 0, err
    want = json.loads(out)
    assert got["mode"] == "eager" and want["mode"] == "reference"
    assert got["sequences"][0]["generated_ids"] == want["sequences"][0]["generated_ids"]
    assert len(got["sequences"][0]["generated_ids"]) == 2
