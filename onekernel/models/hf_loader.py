"""Load a Hugging Face checkpoint folder (config.json + *.safetensors) into canonical weights."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from onekernel.errors import ModelFileError
from onekernel.models import config
from onekernel.models.config import ModelConfig, check_weights, config_from_hf

_GLOBAL = {"model.embed_tokens.weight": "tok_embeddings", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
_LAYER = {"self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv", "self_attn.o_proj": "wo",
          "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm", "input_layernorm": "attn_norm",
          "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "w_gate", "mlp.up_proj": "w_up",
          "mlp.down_proj": "w_down"}


def canonical_name(hf_name: str) -> str | None:
    """Map an HF tensor name (`model.layers.3.self_attn.q_proj.weight`) to `layers.3.wq`; None if unknown."""
    return config.canonical_name(hf_name, _GLOBAL, r"model\.layers\.(\d+)\.([\w.]+)\.weight", _LAYER)


def read_hf_config(folder) -> ModelConfig:
    """ModelConfig from `folder/config.json`. Raises ModelFileError when the folder or file is missing or the
    JSON is invalid, UnsupportedModelError for architectures other than LlamaForCausalLM / Qwen3ForCausalLM."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise ModelFileError(f"{folder} has no config.json; pass a Hugging Face checkpoint folder or a .gguf file")
    try:
        hf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path} is not valid JSON ({e}); re-download the checkpoint") from e
    if not isinstance(hf, dict):
        raise ModelFileError(f"{path} must hold a JSON object (the model's config), got {type(hf).__name__}; "
                             "re-download the checkpoint")
    try:
        return config_from_hf(hf, name=folder.name)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{path} lacks or mangles a required field ({type(e).__name__}: {e}); "
                             "re-download the checkpoint") from e


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise ModelFileError(f"{index} is corrupt ({e}); re-download the checkpoint") from e
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{folder} has no *.safetensors files; re-download the checkpoint")
    for f in files:
        if not f.is_file():
            raise ModelFileError(f"{f} (listed in {index.name}) is missing; re-download the checkpoint")
    return files


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it in fresh (aligned) memory when its data is not 16-byte aligned: safetensors hands
    out views into the mapped file, and a header of any length can put a tensor anywhere (the Triton kernels,
    the megakernel's above all, need 16-byte-aligned weights)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def load_hf(folder, dtype: torch.dtype = torch.float32, device="cpu",
            progress: bool | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read config + weights of an HF LlamaForCausalLM / Qwen3ForCausalLM folder with `safetensors`
    (one or several shards; `model.safetensors.index.json` optional). HF Linear weights are already
    [out, in] and q/k rows are in rotate_half order, so tensors are only renamed and cast to `dtype` on
    `device`, and copied when their data is not 16-byte aligned in the file (`_aligned`). When
    `tie_word_embeddings` is set or `lm_head.weight` is absent, `lm_head is tok_embeddings`. Unknown tensor
    names (e.g. `rotary_emb.inv_freq`) are ignored.

    Returns (config, {canonical name: tensor}). Raises ModelFileError (missing/corrupt files, missing
    tensors, wrong shapes) and UnsupportedModelError (architecture, biases, rope type)."""
    from safetensors import SafetensorError, safe_open
    folder = Path(folder)
    cfg = read_hf_config(folder)
    weights: dict[str, torch.Tensor] = {}
    show = sys.stderr.isatty() if progress is None else progress
    for f in tqdm(_shard_files(folder), desc=f"loading {folder.name}", unit="shard", file=sys.stderr,
                  disable=not show):
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    name = canonical_name(key)
                    if name is not None:
                        weights[name] = _aligned(sf.get_tensor(key).to(dtype=dtype, device=device).contiguous())
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:
            raise ModelFileError(f"{f} is truncated or corrupt ({e}); re-download the checkpoint") from e
    if "tok_embeddings" in weights and (cfg.tie_embeddings or "lm_head" not in weights):
        weights["lm_head"] = weights["tok_embeddings"]
        cfg = dataclasses.replace(cfg, tie_embeddings=True)
    check_weights(cfg, weights, folder)
    return cfg, weights
