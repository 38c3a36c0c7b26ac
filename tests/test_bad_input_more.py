"""Bad input found by trying to break the tool: each gives one OneKernelError (exit code 2 on the CLI),
raised before the model loads where the check needs no model."""
import re

import gguf
import numpy as np
import pytest
import torch

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


# ---- found by a fresh-user pass (userfix) --------------------------------------------------------------

def _one_line_error(capsys, argv, *needles):
    """``onekernel ARGV`` exits 2 with exactly one line on stderr (no usage block, no note, no traceback)."""
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "error:" in out.err and "Traceback" not in out.err, out.err
    for n in needles:
        assert n in out.err, out.err
    return out.err


def test_hf_folder_without_tokenizer_is_one_line(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128,
                                 max_position_embeddings=64)).save_pretrained(tmp_path)
    with pytest.raises(ModelFileError, match="no tokenizer") as e:
        load_model(str(tmp_path))
    assert "\n" not in str(e.value)
    capsys.readouterr()  # save_pretrained's progress bar
    _one_line_error(capsys, ["generate", "--model", str(tmp_path), "--prompt", "hi"], "tokenizer.json")


def test_tokenizer_error_text_is_one_line(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')
    from onekernel.models.tokenizer import Tokenizer
    with pytest.raises(ModelFileError, match="tokenizer.json") as e:
        Tokenizer.from_hf(tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw,msg", [({"device": "tpu"}, "device 'tpu' is not supported; use 'cpu' or 'cuda'"),
                                    ({"device": "meta"}, "device 'meta'"), ({"device": None}, "device None"),
                                    ({"seed": "a"}, "seed"), ({"seed": 2**70}, "seed")])
def test_load_model_bad_device_and_seed(kw, msg):
    with pytest.raises(InputError, match=re.escape(msg)):
        load_model("tiny", random_weights=True, **kw)


@pytest.mark.parametrize("model", [5, ["tiny"], b"tiny", {"a": 1}, "", "  "])
def test_load_model_bad_model_argument(model):
    with pytest.raises(InputError, match="model"):
        load_model(model, random_weights=True)


@pytest.mark.parametrize("argv,msg", [(["--mode", "fast"], "invalid choice: 'fast'"),
                                      (["--max-new-tokens", "abc"], "invalid int value"),
                                      (["--nope"], "unrecognized arguments")])
def test_argparse_errors_are_one_line(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--prompt", "x", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err and "usage:" not in err, err
    assert "onekernel generate --help" in err


def test_batch_is_not_batch_file(capsys, monkeypatch):
    """argparse's prefix matching used to read `--batch 4` as `--batch-file 4` ("cannot read --batch-file '4'")."""
    monkeypatch.setattr("onekernel.models.load.load_model", lambda *a, **k: pytest.fail("model loaded"))
    for argv in (["--batch", "4"], ["--batch=4"], ["--batch"]):
        _one_line_error(capsys, ["generate", "--prompt", "x", *argv], "no --batch option", "--prompt")


def test_batch_file_not_utf8(tmp_path, capsys):
    f = tmp_path / "prompts.bin"
    f.write_bytes(b"\xb0\xff\x00abc\n")
    _one_line_error(capsys, ["generate", "--batch-file", str(f)], "not UTF-8", "prompts.bin")


def test_prompt_with_invalid_utf8(tiny, capsys):
    bad = b"ab\xff".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    with pytest.raises(InputError, match="not valid UTF-8"):
        generate(tiny, [bad], max_new_tokens=1)
    with pytest.raises(InputError, match="not valid UTF-8"):
        generate(tiny, [[{"role": "user", "content": bad}]], chat=True, max_new_tokens=1)
    _one_line_error(capsys, ["generate", "--model", "tiny", "--random-weights", "--prompt", bad], "prompt 0")


def test_seed_out_of_range(capsys):
    with pytest.raises(InputError, match="seed"):
        SamplingParams(seed=2**64)
    _one_line_error(capsys, ["generate", "--model", "tiny", "--random-weights", "--prompt", "x", "--seed",
                             str(10**23)], "--seed")


def test_no_gpu_note_not_printed_before_an_error(capsys, monkeypatch):
    """The 'no GPU' note goes out with the first token, so a bad prompt found after loading stays one line."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = _one_line_error(capsys, ["generate", "--model", "tiny", "--random-weights", "--prompt", ""], "empty")
    assert "note" not in err
    err = _one_line_error(capsys, ["generate", "--model", "tiny", "--random-weights", "--prompt", "x",
                                   "--max-seq-len", "4", "--max-new-tokens", "4"], "1 token;", "--max-seq-len")


@pytest.mark.parametrize("kw,msg", [({"prompts": 5}, "prompts must be"), ({"on_token": 5}, "on_token"),
                                    ({"max_seq_len": "8"}, "max_seq_len"), ({"max_seq_len": 8.5}, "max_seq_len"),
                                    ({"prompts": [[1.5, 2.0]]}, "token ids")])
def test_generate_bad_arguments(tiny, kw, msg):
    kw = {"prompts": ["hi"], "max_new_tokens": 1, **kw}
    with pytest.raises(InputError, match=msg):
        generate(tiny, **kw)


def test_bench_empty_modes(capsys):
    _one_line_error(capsys, ["bench", "--modes", ","], "--modes is empty")


def test_error_message_with_newlines_is_one_line(capsys, monkeypatch):
    def boom(args):
        raise ModelFileError("first line\nsecond line")
    monkeypatch.setitem(cli.SUBCOMMANDS, "graph", (cli.SUBCOMMANDS["graph"][0], cli.SUBCOMMANDS["graph"][1], boom))
    assert _one_line_error(capsys, ["graph"], "first line second line")


def test_broken_pipe_is_quiet(monkeypatch, capsys):
    def boom(args):
        raise BrokenPipeError
    monkeypatch.setitem(cli.SUBCOMMANDS, "graph", (cli.SUBCOMMANDS["graph"][0], cli.SUBCOMMANDS["graph"][1], boom))
    assert cli.main(["graph"]) == 1
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kw,msg", [({"random_weights": "no"}, "random_weights must be True or False"),
                                    ({"random_weights": True, "dtype": "int8"}, "not a dtype"),
                                    ({"random_weights": True, "dtype": 3}, "not a dtype")])
def test_load_model_flag_and_dtype_kinds(kw, msg):
    with pytest.raises(InputError, match=msg):
        load_model("tiny", **kw)


@pytest.mark.parametrize("name,want", [("bf16", torch.bfloat16), ("float16", torch.float16), ("FP32", torch.float32),
                                       ("torch.bfloat16", torch.bfloat16)])
def test_load_model_dtype_names(name, want, seed):
    m = load_model("tiny", random_weights=True, dtype=name, seed=seed)
    ref = load_model("tiny", random_weights=True, dtype=want, seed=seed)
    assert all(t.dtype == want for t in m.weights.values() if t.is_floating_point())
    assert all(torch.equal(m.weights[k], ref.weights[k]) for k in ref.weights)
