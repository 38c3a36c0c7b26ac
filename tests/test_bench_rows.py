"""The bench rows of ``bench.modes.MODE_VARIANTS`` added in session 29 (pdl-triton-wait, graph-mma, pdl-mma,
pdl-triton-mma): each builds its mode with its fixed options and computes the PyTorch reference's step (Triton
interpreter, fp32, the `tiny` model with fresh random weights and a random KV cache); an option given twice (the
row's and the caller's, e.g. ``--gemv``) is one clear InputError; the interpreter refuses the bf16 tensor-core path
it computes wrongly."""
import pytest
import torch

from onekernel.bench.modes import MODE_VARIANTS, make_bench_runner, runner_gemv, variant_options
from onekernel.cli import main
from onekernel.errors import InputError
from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner
from onekernel.runtime.runners import make_step_runner

ROWS = ("pdl-triton-wait", "graph-mma", "pdl-mma", "pdl-triton-mma")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", random_weights=True, seed=29)


def _state(model, dtype=torch.float32, seed=0):
    """A cache of 3 sequences at random positions holding random K/V, and random tokens."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(model.config, 3, 24, dtype, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g).to(dtype))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g).to(dtype))
    cache.seq_lens.copy_(torch.randint(0, 20, (3,), generator=g, dtype=torch.int32))
    tokens = torch.randint(0, model.config.vocab_size, (3,), generator=g, dtype=torch.int32)
    return cache, tokens


@pytest.mark.parametrize("row", ROWS)
def test_each_new_row_runs_its_options_and_the_reference_step(tiny, row):
    cache, tokens = _state(tiny, seed=ROWS.index(row))
    want, _ = ReferenceRunner(tiny, _state(tiny, seed=ROWS.index(row))[0]).step(tokens)  # the same state
    r = make_bench_runner(row, tiny, cache, interpret=True)
    assert runner_gemv(r) == MODE_VARIANTS[row][1].get("gemv", "fma")  # tiny's own path is the CUDA cores
    if "trigger" in MODE_VARIANTS[row][1]:
        assert r.trigger == MODE_VARIANTS[row][1]["trigger"]
    logits, _ = r.step(tokens)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)


def test_an_option_the_row_fixes_is_refused(tiny):
    assert variant_options("graph-mma", {"interpret": True}) == ("graph", {"gemv": "mma", "interpret": True})
    assert variant_options("graph", {"gemv": "fma"}) == ("graph", {"gemv": "fma"})
    for gemv in ("fma", "mma"):
        with pytest.raises(InputError, match="bench row 'graph-mma' fixes gemv='mma'; leave gemv out"):
            make_bench_runner("graph-mma", tiny, _state(tiny)[0], interpret=True, gemv=gemv)
    with pytest.raises(InputError, match="fixes backend='triton', trigger='wait'"):
        variant_options("pdl-triton-wait", {"trigger": "end", "backend": "triton"})


def test_bench_cli_refuses_gemv_with_a_row_that_fixes_it(capsys):
    assert main(["bench", "--model", "tiny", "--random-weights", "--modes", "graph,pdl-mma", "--gemv", "fma"]) != 0
    err = capsys.readouterr().err
    # refused before any GPU check
    assert "bench row 'pdl-mma' fixes gemv='mma'; leave gemv out, or time the mode 'pdl' with it" in err


def test_the_interpreter_refuses_its_wrong_bf16_tensor_core_dot(tiny):
    cache, _ = _state(tiny, torch.bfloat16)
    bf16 = load_model("tiny", random_weights=True, dtype=torch.bfloat16, seed=29)
    for mode in ("eager", "graph", "megakernel"):
        with pytest.raises(InputError, match="no bf16 tensor-core dot.*--dtype fp32.*--gemv fma"):
            make_step_runner(mode, bf16, cache, interpret=True, gemv="mma")
    assert runner_gemv(make_step_runner("eager", bf16, cache, interpret=True)) == "fma"  # tiny's own path
