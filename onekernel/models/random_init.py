"""Seeded random weights with a trained model's scale, generated directly on the target device."""
from __future__ import annotations

import torch

from onekernel.errors import InputError, UnsupportedModelError
from onekernel.models.config import ModelConfig, expected_shapes

SEED_RANGE = (-2**63, 2**64 - 1)  # what torch.Generator.manual_seed accepts


def check_seed(seed) -> int:
    """``seed`` if it is an integer torch can seed a generator with, else InputError naming --seed (used for
    random weights here and for sampling in runtime.sampling)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise InputError(f"seed (--seed) must be an integer between -2**63 and 2**64-1, got {seed!r}")
    return seed

MATRIX_STD = 0.02  # HF `initializer_range` default for Llama / Qwen3
NORM_NOISE = 0.02  # norm weights are 1 + N(0, NORM_NOISE^2): ~1 like trained RMSNorm gains, not exactly 1


def random_weights(cfg: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu",
                   seed: int = 0, keep=None) -> dict[str, torch.Tensor]:
    """Canonical weights (names/shapes of `config.expected_shapes`) drawn from one `torch.Generator` seeded
    with `seed` on `device`: matrices ~ N(0, 0.02^2) (HF `_init_weights` with initializer_range=0.02),
    norm vectors ~ 1 + N(0, 0.02^2). Tensors are generated in float32 on `device` (fast even for 8B models on
    a GPU) and cast to `dtype`. Same seed + device -> same weights. Tied configs get
    `lm_head is tok_embeddings`. Raises UnsupportedModelError for a non-floating dtype.

    ``keep(name, w) -> tensor`` (optional): the part of each drawn float32 tensor to keep (a tensor-parallel
    rank's slice: ``dist.sharding``); it is copied (contiguous, cast to `dtype`) and the full tensor freed before
    the next one is drawn, so at most one full tensor exists at a time beside the kept parts. Every tensor is
    still drawn in full and in the same order, so the kept parts are exactly the slices of the weights drawn
    without ``keep``."""
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
        part = w if keep is None else keep(name, w)
        if part is not w:  # a slice: its own storage (a view would keep the full tensor alive)
            part = part.to(dtype, memory_format=torch.contiguous_format, copy=True)
        weights[name] = part.to(dtype)
        del w, part
    if cfg.tie_embeddings:
        weights["lm_head"] = weights["tok_embeddings"]
    return weights
