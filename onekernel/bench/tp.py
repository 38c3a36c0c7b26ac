"""Per-step latency of the tensor-parallel PyTorch decode step (``dist.tp_reference``; bench mode "torch" at
--tp N), timed on every rank of one group. The kernel modes and the torch+graph baseline at TP > 1 (NCCL
captured in a CUDA graph) come with issue 13's GPU part.

Each record (rank 0's): model, batch, context, mode "torch", tp, runner, ms_per_step (the slowest rank's median
of ``steps`` CUDA-event-timed steps), p10/p90 (rank 0's), tokens_per_s. The state is ``bench.modes``'s: random
K/V, every sequence at position ``context - 1``; the tokens are drawn from the whole vocabulary with one seed,
so every rank embeds the same ones.
"""
from __future__ import annotations

import torch

from onekernel.bench.modes import random_decode_state
from onekernel.bench.timing import median_ms


def bench_tp(model, group, batches: list[int], context: int, steps: int = 200) -> list[dict]:
    """Time ``group.step_runner("reference", model, cache)`` (``model``: the rank's ShardedModel on its GPU)
    at each batch size. Every rank calls it with the same arguments; returns the records (the same on every
    rank)."""
    records = []
    for b in batches:
        cache, _ = random_decode_state(model, b, context)
        g = torch.Generator(device=cache.k.device).manual_seed(0)
        tokens = torch.randint(0, group.config.vocab_size, (b,), device=cache.k.device, dtype=torch.int32,
                               generator=g)
        runner = group.step_runner("reference", model, cache)
        t = median_ms(lambda: runner.step(tokens), steps=steps, warmup=10)
        slowest = torch.tensor([t["median_ms"]], device=cache.k.device)
        group.dist.all_reduce(slowest, op=group.dist.ReduceOp.MAX)
        ms = float(slowest)
        records.append({"model": group.config.name, "batch": b, "context": context, "mode": "torch",
                        "tp": group.shard.tp, "runner": type(runner).__name__, "ms_per_step": ms,
                        "p10_ms": t["p10_ms"], "p90_ms": t["p90_ms"], "tokens_per_s": b * 1e3 / ms})
    return records


def tp_table(records: list[dict]) -> str:
    """Markdown table of ``bench_tp``'s records."""
    lines = ["| model | tp | batch | mode | ms/step | tokens/s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['tp']} | {r['batch']} | {r['mode']} | {r['ms_per_step']:.3f} | "
              f"{r['tokens_per_s']:,.0f} |" for r in records]
    return "\n".join(lines)
