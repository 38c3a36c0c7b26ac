"""Named configs, RoPE tables (checked against transformers), HF config parsing, random weights."""
import dataclasses

import pytest
import torch

from onekernel.errors import UnsupportedModelError
from onekernel.models.config import (CONFIG_NAMES, config_from_hf, expected_shapes, get_config,
                                     rope_inv_freq)
from onekernel.models.random_init import random_weights

REQUIRED = ["tiny", "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "llama-3.2-1b", "llama-3.2-3b",
            "llama-3.1-8b", "llama-3.1-70b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-8b"]


def _hf_config(cfg):
    """The transformers config object our config corresponds to."""
    from transformers import LlamaConfig, Qwen3Config
    rope = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    if cfg.rope_scaling:
        rope = {**rope, **cfg.rope_scaling, "rope_type": "llama3"}
    cls = LlamaConfig if cfg.arch == "llama" else Qwen3Config
    return cls(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, num_hidden_layers=cfg.n_layers,
               num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
               intermediate_size=cfg.ffn_dim, rms_norm_eps=cfg.norm_eps, rope_parameters=rope,
               max_position_embeddings=cfg.max_seq_len, tie_word_embeddings=cfg.tie_embeddings)


@pytest.mark.parametrize("name", REQUIRED)
def test_named_configs_valid(name):
    cfg = get_config(name)
    assert cfg.name == name and cfg.validate() is cfg
    assert cfg.qk_norm == (cfg.arch == "qwen3")
    assert (cfg.rope_scaling is not None) == name.startswith("llama-3")


def test_published_values():
    tiny = get_config("tiny")
    assert (tiny.n_layers, tiny.dim, tiny.n_heads, tiny.n_kv_heads, tiny.head_dim, tiny.ffn_dim,
            tiny.vocab_size) == (2, 64, 4, 2, 16, 128, 256)
    s = get_config("smollm2-135m")
    assert (s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.ffn_dim, s.rope_theta) == (576, 30, 9, 3, 1536, 1e5)
    q = get_config("qwen3-0.6b")
    assert q.n_heads * q.head_dim == 2048 != q.dim and q.tie_embeddings
    l8 = get_config("llama-3.1-8b")
    assert l8.rope_scaling["factor"] == 8.0 and not l8.tie_embeddings and l8.ffn_dim == 14336
    assert get_config("llama-3.2-1b").rope_scaling["factor"] == 32.0


def test_unknown_name_lists_known():
    with pytest.raises(UnsupportedModelError) as e:
        get_config("gpt-5")
    assert "gpt-5" in str(e.value) and all(n in str(e.value) for n in REQUIRED)
    assert set(REQUIRED) <= set(CONFIG_NAMES)


@pytest.mark.parametrize("change", [dict(arch="mamba"), dict(n_kv_heads=3), dict(head_dim=15), dict(dim=0),
                                    dict(norm_eps=0.0), dict(rope_scaling={"factor": 8.0})])
def test_validate_rejects_nonsense(change):
    with pytest.raises(UnsupportedModelError):
        dataclasses.replace(get_config("tiny"), **change).validate()


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", "qwen3-8b"])
def test_rope_inv_freq_matches_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg = get_config(name)
    hf = _hf_config(cfg)
    if cfg.rope_scaling:
        want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, torch.device("cpu"))
    else:
        want = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
    got = rope_inv_freq(cfg)
    assert got.dtype == torch.float32 and got.shape == (cfg.head_dim // 2,)
    torch.testing.assert_close(got, want.float(), rtol=0, atol=0)


@pytest.mark.parametrize("name", REQUIRED)
def test_config_from_hf_round_trip(name):
    cfg = get_config(name)
    hf = _hf_config(cfg).to_dict()
    hf["architectures"] = ["LlamaForCausalLM" if cfg.arch == "llama" else "Qwen3ForCausalLM"]
    assert config_from_hf(hf, name=name) == cfg
    hf_old = {k: v for k, v in hf.items() if k != "rope_parameters"}  # transformers 4 style keys
    hf_old["rope_theta"] = cfg.rope_theta
    if cfg.rope_scaling:
        hf_old["rope_scaling"] = {"rope_type": "llama3", **cfg.rope_scaling}
    assert config_from_hf(hf_old, name=name) == cfg


def test_config_from_hf_rejects_other_arch():
    hf = _hf_config(get_config("tiny")).to_dict()
    with pytest.raises(UnsupportedModelError, match="MistralForCausalLM"):
        config_from_hf({**hf, "architectures": ["MistralForCausalLM"]})


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_random_weights(name):
    cfg = get_config(name)
    w = random_weights(cfg, torch.float32, "cpu", seed=1)
    assert {k: tuple(v.shape) for k, v in w.items()} == expected_shapes(cfg)
    assert (w["lm_head"] is w["tok_embeddings"]) == cfg.tie_embeddings
    assert abs(w["layers.0.wq"].std().item() - 0.02) < 0.003
    assert abs(w["norm"].mean().item() - 1.0) < 0.01 and w["norm"].std().item() > 0
    again = random_weights(cfg, torch.float32, "cpu", seed=1)
    assert all(torch.equal(w[k], again[k]) for k in w)
    other = random_weights(cfg, torch.bfloat16, "cpu", seed=2)
    assert other["layers.1.w_up"].dtype == torch.bfloat16 and not torch.equal(other["norm"].float(), w["norm"])
