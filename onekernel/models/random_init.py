"""Seeded random weights with a trained model's scale, generated directly on the target device."""
from __future__ import annotations

import torch

from onekernel.errors import UnsupportedModelError
from onekernel.models.config import ModelConfig, expected_shapes

MATRIX_STD = 0.02  # HF `initializer_range` default for Llama / Qwen3
NORM_NOISE = 0.02  # norm weights are 1 + N(0, NORM_NOISE^2): ~1 like trained RMSNorm gains, not exactly 1


def random_weights(cfg: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu",
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """Canonical weights (names/shapes of `config.expected_shapes`) drawn from one `torch.Generator` seeded
    with `seed` on `device`: matrices ~ N(0, 0.02^2) (HF `_init_weights` with initializer_range=0.02),
    norm vectors ~ 1 + N(0, 0.02^2). Tensors are generated in float32 on `device` (fast even for 8B models on
    a GPU) and cast to `dtype`. Same seed + device -> same weights. Tied configs get
    `lm_head is tok_embeddings`. Raises UnsupportedModelError for a non-floating dtype."""
    if not dtype.is_floating_point:
        raise UnsupportedModelError(f"random weights need a floating dtype, got {dtype}")
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(cfg).items():
        if name == "lm_head" and cfg.tie_embeddings:
            continue
        w = torch.empty(shape, dtype=torch.float32, device=device)
        if len(shape) == 1:
            w.normal_(1.0, NORM_NOISE, generator=gen)
        else:
            w.normal_(0.0, MATRIX_STD, generator=gen)
        weights[name] = w.to(dtype)
    if cfg.tie_embeddings:
        weights["lm_head"] = weights["tok_embeddings"]
    return weights
