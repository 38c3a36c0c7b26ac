"""Model hyper-parameters (`ModelConfig`), the named configs, RoPE inverse frequencies, and the
canonical weight-shape table every loader is checked against (see docs/DESIGN.md "Model config")."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from onekernel.errors import ModelFileError, UnsupportedModelError

ARCHS = ("llama", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    """Decoder hyper-parameters. `rope_scaling` is None or the Llama-3 dict with keys `factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings`. `qk_norm` is Qwen3's
    per-head RMSNorm on q and k."""

    name: str
    arch: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_seq_len: int
    tie_embeddings: bool
    qk_norm: bool

    def validate(self) -> "ModelConfig":
        """Return self; raise UnsupportedModelError for an unknown arch or inconsistent sizes."""
        if self.arch not in ARCHS:
            raise UnsupportedModelError(f"{self.name}: architecture {self.arch!r} is not supported "
                                        f"(supported: {', '.join(ARCHS)})")
        ints = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "max_seq_len")
        for f in ints:
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise UnsupportedModelError(f"{self.name}: {f}={v!r} must be a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError(f"{self.name}: n_heads={self.n_heads} is not a multiple of "
                                        f"n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise UnsupportedModelError(f"{self.name}: head_dim={self.head_dim} must be even for RoPE")
        if not (0 < self.norm_eps < 1) or not (self.rope_theta > 1):
            raise UnsupportedModelError(f"{self.name}: norm_eps={self.norm_eps} / rope_theta={self.rope_theta} "
                                        "out of range")
        if self.rope_scaling is not None:
            need = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
            missing = need - set(self.rope_scaling)
            if missing or self.rope_scaling["high_freq_factor"] <= self.rope_scaling["low_freq_factor"]:
                raise UnsupportedModelError(f"{self.name}: rope_scaling {self.rope_scaling} is not a valid "
                                            f"Llama-3 scaling (needs {sorted(need)}, high > low)")
        return self


def _llama3(factor: float) -> dict:
    return {"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


def _c(name, arch, V, D, L, H, KV, hd, F, eps, theta, seq, tie, scaling=None) -> ModelConfig:
    return ModelConfig(name, arch, V, D, L, H, KV, hd, F, eps, theta, scaling, seq, tie, arch == "qwen3")


# Values from each checkpoint's published config.json on the Hugging Face hub.
_CONFIGS = {c.name: c for c in [
    _c("tiny", "llama", 256, 64, 2, 4, 2, 16, 128, 1e-5, 10000.0, 256, False),
    _c("tiny-qwen3", "qwen3", 256, 64, 2, 4, 2, 32, 128, 1e-6, 10000.0, 256, True),
    # tests only: head counts and FFN rows that TP 2, 4 and 8 divide (tiny's 4 heads / 2 KV heads stop at TP 2)
    _c("tiny-tp8", "llama", 256, 64, 2, 16, 8, 16, 256, 1e-5, 10000.0, 256, False),
    _c("smollm2-135m", "llama", 49152, 576, 30, 9, 3, 64, 1536, 1e-5, 100000.0, 8192, True),
    _c("smollm2-360m", "llama", 49152, 960, 32, 15, 5, 64, 2560, 1e-5, 100000.0, 8192, True),
    _c("smollm2-1.7b", "llama", 49152, 2048, 24, 32, 32, 64, 8192, 1e-5, 130000.0, 8192, True),
    _c("llama-3.2-1b", "llama", 128256, 2048, 16, 32, 8, 64, 8192, 1e-5, 500000.0, 131072, True, _llama3(32.0)),
    _c("llama-3.2-3b", "llama", 128256, 3072, 28, 24, 8, 128, 8192, 1e-5, 500000.0, 131072, True, _llama3(32.0)),
    _c("llama-3.1-8b", "llama", 128256, 4096, 32, 32, 8, 128, 14336, 1e-5, 500000.0, 131072, False, _llama3(8.0)),
    # Llama-3.1-70B (meta-llama/Llama-3.1-70B config.json): random weights only, for TP=8 (issue 16)
    _c("llama-3.1-70b", "llama", 128256, 8192, 80, 64, 8, 128, 28672, 1e-5, 500000.0, 131072, False, _llama3(8.0)),
    _c("qwen3-0.6b", "qwen3", 151936, 1024, 28, 16, 8, 128, 3072, 1e-6, 1000000.0, 40960, True),
    _c("qwen3-1.7b", "qwen3", 151936, 2048, 28, 16, 8, 128, 6144, 1e-6, 1000000.0, 40960, True),
    _c("qwen3-8b", "qwen3", 151936, 4096, 36, 32, 8, 128, 12288, 1e-6, 1000000.0, 40960, False),
]}
CONFIG_NAMES = tuple(_CONFIGS)


def get_config(name: str) -> ModelConfig:
    """The named config (see CONFIG_NAMES). Raises UnsupportedModelError listing the known names."""
    try:
        return _CONFIGS[name.lower()]
    except KeyError:
        raise UnsupportedModelError(f"unknown model config {name!r}; known names: {', '.join(CONFIG_NAMES)}, "
                                    "or pass a path to a .gguf file or a Hugging Face checkpoint folder") from None


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies, float32 [head_dim // 2] on the CPU: theta^(-2i/hd), then, when
    `cfg.rope_scaling` is set, the Llama-3 smoothing of HF `modeling_rope_utils._compute_llama3_parameters`
    (low frequencies divided by `factor`, high ones kept, a linear blend in between)."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    s = cfg.rope_scaling
    if s is None:
        return inv
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled).float()


def config_from_hf(hf: dict, name: str = "hf") -> ModelConfig:
    """ModelConfig from a Hugging Face config.json dict (LlamaForCausalLM / Qwen3ForCausalLM; reads both
    the transformers 4 `rope_theta`/`rope_scaling` keys and the transformers 5 `rope_parameters` dict).
    Raises UnsupportedModelError for other architectures, biases or a non-Llama-3 rope scaling."""
    archs = hf.get("architectures") or [hf.get("model_type", "?")]
    arch = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}.get(archs[0])
    if arch is None:
        raise UnsupportedModelError(f"{name}: architecture {archs[0]!r} is not supported "
                                    "(supported: LlamaForCausalLM, Qwen3ForCausalLM)")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise UnsupportedModelError(f"{name}: attention/MLP biases are not supported")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype not in ("default", "llama3"):
        raise UnsupportedModelError(f"{name}: rope scaling type {rtype!r} is not supported (only llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    scaling = {k: rope[k] for k in keys} if rtype == "llama3" else None
    D, H = hf["hidden_size"], hf["num_attention_heads"]
    return ModelConfig(
        name=name, arch=arch, vocab_size=hf["vocab_size"], dim=D, n_layers=hf["num_hidden_layers"],
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, head_dim=hf.get("head_dim") or D // H,
        ffn_dim=hf["intermediate_size"], norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_scaling=scaling, max_seq_len=hf.get("max_position_embeddings", 2048),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), qk_norm=arch == "qwen3").validate()


def _llama3_from_rope_freqs(rope_freqs, cfg: ModelConfig) -> dict:
    """llama.cpp stores Llama-3 scaling as a `rope_freqs` tensor of per-frequency divisors (convert_hf_to_gguf
    `LlamaModel.generate_extra_tensors`). Recover the dict: factor = max divisor, other values = Llama-3's
    published defaults; check by recomputing the table."""
    divisors = torch.tensor(np.array(rope_freqs, dtype=np.float32)).flatten()
    scaling = _llama3(float(divisors.max()))
    base = dataclasses.replace(cfg, rope_scaling=None)
    want = rope_inv_freq(base) / rope_inv_freq(dataclasses.replace(cfg, rope_scaling=scaling))
    if divisors.shape != want.shape or not torch.allclose(divisors, want, rtol=1e-3):
        raise UnsupportedModelError(f"{cfg.name}: rope_freqs tensor does not match a Llama-3 rope scaling")
    return scaling


def config_from_gguf(reader, name: str | None = None) -> ModelConfig:
    """ModelConfig from the `{arch}.*` metadata (llama.cpp key names) and tensor list of `reader`: a
    `gguf.GGUFReader` or a `gguf_file.GGUFModel` (all shards of a split file; `tie_embeddings` is true only
    when no shard holds `output.weight`). Raises UnsupportedModelError naming the arch when it is not llama or
    qwen3."""
    f = reader.fields

    def get(key, default=None):
        return f[key].contents() if key in f else default

    arch = get("general.architecture", "?")
    if arch not in ARCHS:
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})")
    if get(f"{arch}.rope.scaling.type", "none") not in ("none", "llama3"):
        raise UnsupportedModelError(f"GGUF rope scaling {get(f'{arch}.rope.scaling.type')!r} is not supported")
    tensors = {t.name: t for t in reader.tensors}
    if name is None:
        base, size = get("general.basename"), get("general.size_label")
        name = f"{base}-{size}".lower() if base and size else get("general.name", arch)
    D, H = int(get(f"{arch}.embedding_length")), int(get(f"{arch}.attention.head_count"))
    vocab = get(f"{arch}.vocab_size") or int(tensors["token_embd.weight"].shape[-1])
    cfg = ModelConfig(
        name=name, arch=arch, vocab_size=int(vocab), dim=D, n_layers=int(get(f"{arch}.block_count")),
        n_heads=H, n_kv_heads=int(get(f"{arch}.attention.head_count_kv", H)),
        head_dim=int(get(f"{arch}.attention.key_length", D // H)),
        ffn_dim=int(get(f"{arch}.feed_forward_length")),
        norm_eps=float(f"{get(f'{arch}.attention.layer_norm_rms_epsilon'):.7g}"),  # stored as float32
        rope_theta=float(get(f"{arch}.rope.freq_base", 10000.0)), rope_scaling=None,
        max_seq_len=int(get(f"{arch}.context_length", 2048)),
        tie_embeddings="output.weight" not in tensors, qk_norm=arch == "qwen3")
    if "rope_freqs.weight" in tensors:
        cfg = dataclasses.replace(cfg, rope_scaling=_llama3_from_rope_freqs(tensors["rope_freqs.weight"].data, cfg))
    return cfg.validate()


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical weight name -> shape (nn.Linear layout [out, in]) per docs/DESIGN.md."""
    D, F, V, hd = cfg.dim, cfg.ffn_dim, cfg.vocab_size, cfg.head_dim
    shapes = {"tok_embeddings": (V, D), "norm": (D,), "lm_head": (V, D)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({p + "attn_norm": (D,), p + "wq": (cfg.n_heads * hd, D), p + "wk": (cfg.n_kv_heads * hd, D),
                       p + "wv": (cfg.n_kv_heads * hd, D), p + "wo": (D, cfg.n_heads * hd), p + "ffn_norm": (D,),
                       p + "w_gate": (F, D), p + "w_up": (F, D), p + "w_down": (D, F)})
        if cfg.qk_norm:
            shapes.update({p + "q_norm": (hd,), p + "k_norm": (hd,)})
    return shapes


def canonical_name(name: str, global_map: dict, layer_pattern: str, layer_map: dict) -> str | None:
    """A checkpoint's tensor name -> its canonical name (docs/DESIGN.md "Weights"), None if unknown: a global
    tensor through ``global_map``; a per-layer one when ``layer_pattern`` (a regex with groups (layer index,
    suffix)) matches it fully and ``layer_map`` knows the suffix -> ``layers.{i}.<canonical>``. The GGUF and
    HF loaders differ only in their maps and pattern."""
    if name in global_map:
        return global_map[name]
    m = re.fullmatch(layer_pattern, name)
    if m and m.group(2) in layer_map:
        return f"layers.{m.group(1)}.{layer_map[m.group(2)]}"
    return None


def check_weights(cfg: ModelConfig, weights: dict, source) -> None:
    """Raise ModelFileError when `weights` lacks a canonical tensor or one has the wrong shape."""
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise ModelFileError(f"{source}: tensor {name!r} is missing; the checkpoint is incomplete, re-download it")
        if tuple(weights[name].shape) != shape:
            raise ModelFileError(f"{source}: tensor {name!r} has shape {tuple(weights[name].shape)}, "
                                 f"expected {shape} from the config; the checkpoint is inconsistent")
