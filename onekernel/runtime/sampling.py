"""Token sampling: greedy, temperature, top-k, top-p (nucleus), with a seeded generator per sequence.

``Sampler`` samples each sequence's row with that sequence's own parameters and its own generator (seeded with
its seed), so a sequence's tokens depend only on its logits, seed and parameters, never on what else is in the
batch or on its row (as serving engines do, e.g. vLLM's per-request generators).

Semantics and order follow HF transformers' logits warpers: temperature, then TopKLogitsWarper, then
TopPLogitsWarper (sort ascending, drop tokens while the cumulative probability is <= 1 - top_p, always keep
the most likely token), then softmax and ``torch.multinomial``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from onekernel.errors import InputError
from onekernel.models.random_init import check_seed


MIN_TEMPERATURE = 1e-3  # below this, logits / temperature overflow float32
@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 -> greedy (argmax). top_k 0/None -> off. top_p 1.0 -> off. seed seeds the generator."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or not (t == 0 or MIN_TEMPERATURE <= t):
            raise InputError(f"temperature (--temperature) must be 0 (greedy) or a finite number >= "
                             f"{MIN_TEMPERATURE}, got {t}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise InputError(f"top_k (--top-k) must be an integer >= 0 (0 means off), got {self.top_k}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p (--top-p) must be in (0, 1], got {self.top_p}")
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``params.seed``."""
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(params.seed)
    return g


def top_k_filter(scores: torch.Tensor, k: int) -> torch.Tensor:
    """HF TopKLogitsWarper: scores below the k-th largest of each row -> -inf. scores: float [B, V]."""
    k = min(k, scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[..., -1, None]
    return scores.masked_fill(scores < kth, float("-inf"))


def top_p_filter(scores: torch.Tensor, top_p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """HF TopPLogitsWarper: keep the smallest set of most likely tokens whose probability sum is >= top_p."""
    sorted_logits, sorted_idx = torch.sort(scores, descending=False, dim=-1)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - top_p)
    remove_sorted[..., -min_tokens_to_keep:] = False
    remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row, every row with ``params`` and drawing from the one ``generator`` (so a row's
    draw depends on the rows before it: ``Sampler`` calls this per sequence with [1, V] logits).

    Args:
        logits: float32 [B, V].
        params: SamplingParams.
        generator: torch.Generator on logits.device (make_generator); None uses the global RNG.
    Returns:
        int32 [B] token ids on logits.device.
    """
    if params.greedy:
        return logits.argmax(dim=-1).to(torch.int32)
    scores = logits.float() / params.temperature
    if params.top_k:
        scores = top_k_filter(scores, params.top_k)
    if params.top_p < 1.0:
        scores = top_p_filter(scores, params.top_p)
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0].to(torch.int32)


class Sampler:
    """Per-sequence sampling for a batch: row b uses ``params[b]`` and its own generator on ``device``, seeded
    with ``params[b].seed`` (greedy rows need none). Calling it on logits float32 [B, V] (and optionally the
    runner's greedy tokens int32 [B], used for the greedy rows) returns new int32 [B] tokens on the device,
    without a host sync. ``greedy``: every row is greedy (the caller then uses the runner's argmax as is)."""

    def __init__(self, params: list[SamplingParams], device: torch.device | str):
        self.params = list(params)
        self.generators = [None if p.greedy else make_generator(p, device) for p in self.params]
        self.sampled = [b for b, p in enumerate(self.params) if not p.greedy]

    @property
    def greedy(self) -> bool:
        return not self.sampled

    def __call__(self, logits: torch.Tensor, greedy: torch.Tensor | None = None) -> torch.Tensor:
        tokens = greedy.clone() if greedy is not None else logits.argmax(dim=-1).to(torch.int32)
        for b in self.sampled:
            tokens[b] = sample(logits[b:b + 1], self.params[b], self.generators[b])[0]
        return tokens
