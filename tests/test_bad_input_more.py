"""Bad input found by trying to break the tool: each gives one OneKernelError (exit code 2 on the CLI),
raised before the model loads where the check needs no model."""
import json

import gguf
import numpy as np
import pytest

from onekernel import cli
from onekernel.errors import InputError, ModelFileError
from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", random_weights=True)


def test_string_prompt_is_one_prompt(tiny):
    res = generate(tiny, "hello", max_new_tokens=2)
    assert len(res.sequences) == 1 and len(res.sequences[0].generated_ids) == 2


def test_token_ids_outside_vocabulary(tiny):
    with pytest.raises(InputError, match="outside the model's vocabulary"):
        generate(tiny, [[1, tiny.config.vocab_size]], max_new_tokens=1)
    with pytest.raises(InputError, match="outside the model's vocabulary"):
        generate(tiny, [[-1]], max_new_tokens=1)


@pytest.mark.parametrize("kw", [{"temperature": float("nan")}, {"temperature": float("inf")},
                                {"temperature": 1e-40}, {"top_k": 2.5}, {"top_p": float("nan")}])
def test_bad_sampling_params(kw):
    with pytest.raises(InputError):
        SamplingParams(**kw)


@pytest.mark.parametrize("content", ['{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}', "[1, 2]"])
def test_bad_config_json(tmp_path, content):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelFileError, match="config.json"):
        load_model(str(tmp_path))


def test_gguf_without_metadata(tmp_path):
    path = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.random.rand(8, 4).astype(np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ModelFileError, match="metadata"):
        load_model(str(path))


def test_cli_checks_run_before_the_model_loads(monkeypatch, capsys):
    def boom(*a, **k):
        raise AssertionError("the model must not load for input that is bad on its face")
    monkeypatch.setattr("onekernel.models.load.load_model", boom)
    for argv in (["generate"] + ["--prompt", "x"] * 17, ["generate", "--prompt", "x", "--max-new-tokens", "0"],
                 ["generate", "--prompt", "x", "--max-seq-len", "0"],
                 ["generate", "--prompt", "x", "--mode", "megakernel", "--device", "cpu"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("onekernel: error:"), err


@pytest.mark.parametrize("argv,msg", [(["--batch", "abc"], "--batch must be an integer"),
                                      (["--workers", "0"], "--workers must be between"),
                                      (["--context", "100000"], "--context must be between")])
def test_graph_cli_bad_numbers(capsys, argv, msg):
    assert cli.main(["graph", "--model", "tiny", *argv]) == 2
    out = capsys.readouterr()
    assert msg in out.err and out.out == ""


def test_graph_cli_missing_path_says_so(capsys):
    assert cli.main(["graph", "--model", "./no/such/model.gguf"]) == 2
    assert "no/such/model.gguf" in capsys.readouterr().err


def test_corrupt_generation_config(tmp_path):
    from onekernel.models.tokenizer import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer as RawTokenizer, models
    raw = RawTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text("{oops")
    with pytest.raises(ModelFileError, match="generation_config.json"):
        Tokenizer.from_hf(tmp_path)
