"""Load a llama.cpp GGUF file (arch llama or qwen3) into canonical weights (docs/DESIGN.md "Weights")."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from tqdm import tqdm

from onekernel.errors import ModelFileError, UnsupportedModelError
from onekernel.models import config
from onekernel.models.config import ModelConfig, check_weights, config_from_gguf
from onekernel.models.gguf_file import FIX, GGUFModel, open_gguf

_GLOBAL = {"token_embd.weight": "tok_embeddings", "output_norm.weight": "norm", "output.weight": "lm_head"}
_LAYER = {"attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo",
          "attn_q_norm": "q_norm", "attn_k_norm": "k_norm", "ffn_norm": "ffn_norm", "ffn_gate": "w_gate",
          "ffn_up": "w_up", "ffn_down": "w_down"}
_SKIP = {"rope_freqs.weight"}  # folded into cfg.rope_scaling by config_from_gguf


def _supported_types():
    import gguf
    T = gguf.GGMLQuantizationType
    return {T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K}


def canonical_name(gguf_name: str) -> str | None:
    """Map a GGUF tensor name (`blk.3.attn_q.weight`) to its canonical name (`layers.3.wq`); None if unknown."""
    return config.canonical_name(gguf_name, _GLOBAL, r"blk\.(\d+)\.(\w+)\.weight", _LAYER)


def permute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The row permutation llama.cpp applies to q/k weights of arch llama, verbatim from convert_hf_to_gguf.py
    `LlamaModel.permute`: rows [n_head * hd, ...] go from HF's rotate_half order to interleaved pairs.
    `n_head` is n_heads for attn_q and n_kv_heads for attn_k. Used by tests and writers."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of `permute_qk`: [n_head * hd, ...] (any dtype) back to HF's rotate_half row order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _opened(path) -> GGUFModel:
    return path if isinstance(path, GGUFModel) else open_gguf(path)


def read_gguf_config(path) -> ModelConfig:
    """The ModelConfig of a GGUF model from its metadata and tensor list only (no tensor is dequantized).
    `path`: a .gguf file (any shard of a split model) or a `GGUFModel` from `gguf_file.open_gguf`. Raises
    ModelFileError (see `open_gguf`; metadata missing or mangled) and UnsupportedModelError (architecture)."""
    return _config(_opened(path))


def _config(model: GGUFModel) -> ModelConfig:
    try:
        return config_from_gguf(model, name=None)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise ModelFileError(f"{model.path} lacks or mangles required metadata ({type(e).__name__}: {e}); "
                             "re-download or re-convert the file") from e


def load_gguf(path, dtype: torch.dtype = torch.float32, device="cpu",
              progress: bool | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read config + all weights of a GGUF model: one file, or every shard of a gguf-split model when `path`
    is any of its shards, in either byte order (`path` may also be a `GGUFModel` from `gguf_file.open_gguf`).
    Tensors are dequantized on the host (`GGUFModel.values`: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K;
    big-endian ones byte-swapped) to float32, then cast to `dtype` and moved to `device`; attn_q/attn_k of
    arch llama are un-permuted (`unpermute_qk`). Qwen3 GGUFs are not permuted by the converter. Tied models
    (no `output.weight` in any shard) get `lm_head is tok_embeddings`.

    Returns (config, {canonical name: tensor [out, in] or [n]}). Raises ModelFileError (missing, truncated,
    corrupt, wrong shapes, a shard missing or misplaced) and UnsupportedModelError (architecture, unknown
    tensor, tensor type)."""
    model = _opened(path)
    cfg, path = _config(model), model.path
    supported = _supported_types()
    weights: dict[str, torch.Tensor] = {}
    show = sys.stderr.isatty() if progress is None else progress
    for t in tqdm(model.tensors, desc=f"loading {Path(path).name}", unit="tensor", file=sys.stderr,
                  disable=not show):
        if t.name in _SKIP:
            continue
        name = canonical_name(t.name)
        if name is None:
            raise UnsupportedModelError(f"{path}: tensor {t.name!r} is not part of a {cfg.arch} model onekernel "
                                        "supports")
        if t.tensor_type not in supported:
            raise UnsupportedModelError(f"{path}: tensor {t.name!r} has type {t.tensor_type.name}, which is not "
                                        "supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K); use another "
                                        "quantization of the model")
        try:
            w = torch.from_numpy(model.values(t))
        except ValueError as e:
            raise ModelFileError(f"{path}: tensor {t.name!r} is truncated or corrupt ({e}); {FIX}") from e
        if cfg.arch == "llama" and name.endswith((".wq", ".wk")):
            w = unpermute_qk(w, cfg.n_heads if name.endswith(".wq") else cfg.n_kv_heads)
        weights[name] = w.to(dtype=dtype, device=device).contiguous()
    if cfg.tie_embeddings and "tok_embeddings" in weights:
        weights["lm_head"] = weights["tok_embeddings"]
    check_weights(cfg, weights, path)
    return cfg, weights
