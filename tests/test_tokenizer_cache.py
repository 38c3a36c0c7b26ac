"""The default GGUF's tokenizer is converted once and kept ($ONEKERNEL_CACHE/tokenizers): a later build loads the
kept folder (no GGUF conversion) and tokenizes, detokenizes and applies the chat template exactly as the fresh
conversion; a damaged kept folder is rebuilt; ONEKERNEL_HOST_CACHE=0 keeps nothing."""
import random

import pytest

from onekernel.models import tokenizer as tk
from onekernel.models.load import default_model_path


def _texts(seed):
    rng = random.Random(seed)
    alphabet = "abcXYZ019 .,;!?\n\t'\"éü中文🤖<|>/_" + "".join(chr(c) for c in range(0x400, 0x410))
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    out = ["", " ", "What is the capital of France?", "  two leading spaces", "a" * 500]
    for _ in range(40):
        parts = [rng.choice(specials) if rng.random() < 0.1 else "".join(rng.choice(alphabet) for _ in range(
            rng.randint(1, 30))) for _ in range(rng.randint(1, 5))]
        out.append("".join(parts))
    return out


def _same(a, b, texts):
    assert (a.eos_token_ids, a.bos_token_id, a.vocab_size) == (b.eos_token_ids, b.bos_token_id, b.vocab_size)
    for t in texts:
        ids = a.encode(t)
        assert b.encode(t) == ids, repr(t)
        assert b.chat(t) == a.chat(t), repr(t)
        assert b.decode(ids) == a.decode(ids), repr(t)


def test_the_kept_tokenizer_equals_the_conversion_and_skips_it(tmp_path, monkeypatch, seed):
    monkeypatch.setenv("ONEKERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("ONEKERNEL_HOST_CACHE", raising=False)
    path = default_model_path()
    fresh = tk.Tokenizer.from_gguf(path)
    kept = tk._kept_dir(path)
    assert (kept / tk.DONE).is_file() and (kept / "tokenizer.json").is_file()

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def no_conversion(*a, **k):
        raise AssertionError("the GGUF was converted again although its tokenizer is kept")
    with monkeypatch.context() as m:
        m.setattr(gguf_utils, "load_gguf_checkpoint", no_conversion)
        again = tk.Tokenizer.from_gguf(path)
    _same(fresh, again, _texts(seed))

    (kept / "tokenizer.json").write_text("{ not json")  # damaged: rebuilt from the GGUF, then kept again
    rebuilt = tk.Tokenizer.from_gguf(path)
    _same(fresh, rebuilt, _texts(seed + 1))
    assert tk._load_kept(kept) is not None


def test_nothing_is_kept_with_the_host_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("ONEKERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("ONEKERNEL_HOST_CACHE", "0")
    assert tk._kept_dir(default_model_path()) is None
    tk.Tokenizer.from_gguf(default_model_path())
    assert not (tmp_path / "tokenizers").exists()
