"""Megatron-style tensor-parallel sharding of a ModelConfig and its canonical weights (Shoeybi et al. 2019,
"Megatron-LM", section 3: column-parallel first and row-parallel second linear of each block, so each block
needs one all-reduce; vocabulary-parallel embedding and output layer).

For rank r of TP size t (weights in nn.Linear layout [out, in], docs/DESIGN.md "Weights"):

    wq [Hq*hd, D]        column-parallel by heads: rows of q heads r*Hq/t .. (r+1)*Hq/t - 1
    wk, wv [Hkv*hd, D]   column-parallel by heads: rows of KV heads r*Hkv/t .. (r+1)*Hkv/t - 1 (the KV heads
                         its q heads read under GQA, since Hq/t = (Hq/Hkv) * Hkv/t)
    wo [D, Hq*hd]        row-parallel: the columns of its q heads (partial sums, all-reduced)
    w_gate, w_up [F, D]  column-parallel: rows r*F/t .. (r+1)*F/t - 1
    w_down [D, F]        row-parallel: the same columns (partial sums, all-reduced)
    tok_embeddings, lm_head [V, D]   vocabulary-parallel: the contiguous rows ``vocab_range(V, t, r)`` (a
                         vocabulary that t does not divide gives the first V % t ranks one row more)
    norms, q_norm, k_norm            replicated

The rank's ``Shard.config`` is the model's config with the local sizes (n_heads, n_kv_heads, ffn_dim,
vocab_size), so ``config.expected_shapes(shard.config)`` are exactly the shard's weight shapes and a KVCache built
from it holds the rank's KV heads.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from onekernel.errors import DeviceError, InputError, UnsupportedModelError
from onekernel.models.config import ModelConfig
from onekernel.models.load import LoadedModel, ModelFiles


def valid_tp_sizes(cfg: ModelConfig) -> list[int]:
    """The TP sizes ``cfg`` can be sharded over: the divisors of gcd(n_heads, n_kv_heads, ffn_dim)."""
    g = math.gcd(cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim)
    return [t for t in range(1, g + 1) if g % t == 0]


def check_tp(cfg: ModelConfig, tp, device="cpu") -> int:
    """``tp`` if ``cfg`` can be sharded over ``tp`` ranks on ``device`` ("cpu" or "cuda"); call it before
    anything loads.

    Raises InputError (``tp`` not an integer >= 1), UnsupportedModelError (``tp`` does not divide n_heads,
    n_kv_heads or ffn_dim: the message names the counts and the valid sizes), DeviceError (on "cuda", more ranks
    than GPUs: one process per GPU)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"the tensor-parallel size (--tp) must be an integer >= 1, got {tp!r:.40}")
    counts = {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "ffn_dim": cfg.ffn_dim}
    bad = [f"{k}={v}" for k, v in counts.items() if v % tp]
    if bad:
        raise UnsupportedModelError(
            f"{cfg.name}: tensor-parallel size {tp} does not divide {', '.join(bad)}; every rank must get the same "
            f"number of q heads, KV heads and FFN rows; valid TP sizes for this model: "
            f"{', '.join(map(str, valid_tp_sizes(cfg)))}")
    if torch.device(device).type == "cuda" and tp > torch.cuda.device_count():
        raise DeviceError(f"--tp {tp} needs {tp} GPUs (one process per GPU), but {torch.cuda.device_count()} "
                          f"are visible; use --tp {max(1, torch.cuda.device_count())} or fewer")
    return tp


def vocab_range(vocab_size: int, tp: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous vocabulary rows [start, stop) of ``vocab_size`` split over ``tp`` ranks: sizes
    differ by at most one, larger first (``torch.tensor_split``'s rule); ascending in rank."""
    base, extra = divmod(vocab_size, tp)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``tp``: ``full`` is the model's config, ``config`` the local one (n_heads, n_kv_heads and
    ffn_dim divided by tp, vocab_size = vocab_stop - vocab_start), ``vocab_start/vocab_stop`` its rows of the
    embedding and LM head."""

    tp: int
    rank: int
    full: ModelConfig
    config: ModelConfig
    vocab_start: int
    vocab_stop: int


def shard_config(cfg: ModelConfig, tp: int, rank: int) -> Shard:
    """The Shard of rank ``rank`` (0 <= rank < tp). Raises what ``check_tp`` raises, and InputError for a rank
    outside [0, tp)."""
    check_tp(cfg, tp)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < tp:
        raise InputError(f"rank must be an integer in [0, {tp}), got {rank!r:.40}")
    v0, v1 = vocab_range(cfg.vocab_size, tp, rank)
    local = dataclasses.replace(cfg, name=f"{cfg.name}[tp{tp}.{rank}]", n_heads=cfg.n_heads // tp,
                                n_kv_heads=cfg.n_kv_heads // tp, ffn_dim=cfg.ffn_dim // tp, vocab_size=v1 - v0)
    return Shard(tp, rank, cfg, local.validate(), v0, v1)


def _slices(shard: Shard) -> dict[str, tuple[int, slice]]:
    """Suffix of a canonical name -> (dim, slice) of the rank's part; names not listed are replicated."""
    c, r, hd = shard.config, shard.rank, shard.config.head_dim
    q = slice(r * c.n_heads * hd, (r + 1) * c.n_heads * hd)
    kv = slice(r * c.n_kv_heads * hd, (r + 1) * c.n_kv_heads * hd)
    f = slice(r * c.ffn_dim, (r + 1) * c.ffn_dim)
    vocab = slice(shard.vocab_start, shard.vocab_stop)
    return {"wq": (0, q), "wk": (0, kv), "wv": (0, kv), "wo": (1, q), "w_gate": (0, f), "w_up": (0, f),
            "w_down": (1, f), "tok_embeddings": (0, vocab), "lm_head": (0, vocab)}


def shard_part(shard: Shard):
    """``part(name, w) -> tensor``: the rank's part of the full canonical tensor ``name`` (a narrowed view of a
    split weight, ``w`` itself for a replicated one). ``models.random_init.random_weights(keep=part)`` draws a
    rank's shard this way, one full tensor at a time."""
    parts = _slices(shard)

    def part(name: str, w: torch.Tensor) -> torch.Tensor:
        dim, sl = parts.get(name.rsplit(".", 1)[-1], (None, None))
        return w if dim is None else w.narrow(dim, sl.start, sl.stop - sl.start)
    return part


def shard_weights(shard: Shard, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The rank's part of the canonical ``weights`` of ``shard.full`` (same dtype and device): sliced tensors
    copied (contiguous, so the full tensors can be freed), replicated ones shared. A tied LM head stays the same
    tensor as the embedding shard. Shapes are ``config.expected_shapes(shard.config)``."""
    part = shard_part(shard)
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if name == "lm_head" and shard.full.tie_embeddings:
            continue
        p = part(name, w)
        out[name] = w if p is w else p.contiguous().clone()
    if shard.full.tie_embeddings:
        out["lm_head"] = out["tok_embeddings"]
    return out


@dataclass
class ShardedModel(LoadedModel):
    """A rank's model: ``config`` is the local config (``shard.config``: the weights' shapes), ``weights`` the
    rank's shard, ``tokenizer`` and ``source`` the model's, ``shard`` the Shard (``shard.full``: the model's
    config). Run it through ``dist.tp_reference`` (its collectives), not the single-device runners."""

    shard: Shard = None


def load_shard(files: ModelFiles, shard: Shard, *, random_weights: bool, dtype: torch.dtype, device,
               seed: int) -> ShardedModel:
    """Load the rank's shard of ``files`` (from ``models.load.open_model``; arguments as ``ModelFiles.load``) on
    ``device``. Each rank loads once and keeps only its shard.

    Random weights: every full tensor is drawn on ``device`` in the TP=1 order from the one seed (so the shard is
    exactly the slice of TP=1's weights, the same on every rank), its slice kept and the tensor freed before the
    next one (``random_init.random_weights(keep=shard_part(shard))``): a rank holds its shard plus one full
    float32 tensor (Llama-3.1-70B at TP=8: 17.6 GB + at most the 4.2 GB embedding), never the whole model.
    A checkpoint: today the full tensors are read and sliced, then freed (fine up to 8B-class models). A
    streaming loader will read only the shard's bytes: the row slices (column-parallel weights, the vocabulary
    rows) are contiguous ranges of a safetensors / GGUF tensor, the column slices (wo, w_down) one range per
    row, so a rank never holds more than its shard. Raises what ``ModelFiles.load`` raises."""
    if random_weights:
        from onekernel.models.random_init import check_seed
        from onekernel.models.random_init import random_weights as draw

        weights = draw(files.config, dtype, device, check_seed(seed), keep=shard_part(shard))
        return ShardedModel(shard.config, weights, files.tokenizer, files.source, shard)
    full = files.load(random_weights=random_weights, dtype=dtype, device=device, seed=seed)
    weights = shard_weights(shard, full.weights)
    del full
    return ShardedModel(shard.config, weights, files.tokenizer, files.source, shard)
