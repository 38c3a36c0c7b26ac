"""One rank of the tensor-parallel tests (tests/test_tp.py starts it with torchrun's variables).

argv[1]: JSON {"model": config name, "vocab": vocab size override or null, "tp": N, "seed": S, "prompts": [[ids]],
"steps": decode steps, "out": path, "mode": optional, default "reference" (a kernel mode runs in the Triton
interpreter: the test sets TRITON_INTERPRET=1), "gemv": a kernel mode's GEMV path (optional, default the model's)}.
Random fp32 weights of ``seed``; the rank's shard; prefill, then greedy decode steps fed with the rank's own tokens.
Rank 0 saves the gathered logits, the distributed-argmax tokens, its KV cache and the GEMV path its step took (None
for the reference mode) to ``out`` (torch.save).
"""
import dataclasses
import json
import sys

import torch

import fast_interpreter
from onekernel.dist.process import close_rank, init_rank
from onekernel.dist.sharding import ShardedModel, shard_config, shard_weights
from onekernel.dist.tp_reference import TPGroup
from onekernel.models.config import get_config
from onekernel.models.random_init import random_weights
from onekernel.models.tokenizer import Tokenizer
from onekernel.runtime.kv_cache import KVCache

fast_interpreter.install()  # as in tests/conftest.py: the kernel modes run in the interpreter here too


def rank_state(a: dict):
    """(RankInfo, the rank's ShardedModel, its TPGroup, its fp32 CPU KVCache for ``a["prompts"]`` + ``a["steps"]``)
    after joining the gloo group: the setup every TP test rank shares (``a``: the module doc's keys)."""
    info = init_rank(a["tp"], "cpu")
    cfg = get_config(a.get("model") or "tiny")
    if a.get("vocab"):
        cfg = dataclasses.replace(cfg, vocab_size=a["vocab"])
    shard = shard_config(cfg, a["tp"], info.rank)
    model = ShardedModel(shard.config, shard_weights(shard, random_weights(cfg, torch.float32, "cpu", a["seed"])),
                         Tokenizer.byte_level(), cfg.name, shard)
    prompts = a["prompts"]
    cache = KVCache(shard.config, len(prompts), max(map(len, prompts)) + a["steps"], torch.float32, "cpu")
    return info, model, TPGroup(shard), cache


def greedy(runner, cache, prompts: list[list[int]], steps: int, check: bool = False):
    """Prefill, then ``steps`` greedy steps fed with the runner's own tokens (``check``: ``runner.check()`` after
    each): (logits float32 [steps + 1, B, V], tokens int32 [steps + 1, B]), copied out of the runner's buffers
    (a kernel runner overwrites them at its next step)."""
    logits = [runner.prefill(prompts)]
    tokens = [logits[0].argmax(-1).to(torch.int32)]
    for _ in range(steps):
        lg, nxt = runner.step(tokens[-1])
        if check:
            runner.check()
        cache.seq_lens += 1
        logits.append(lg.clone())
        tokens.append(nxt.clone())
    return torch.stack(logits), torch.stack(tokens)


def main(a: dict) -> None:
    info, model, group, cache = rank_state(a)
    prompts = a["prompts"]
    mode = a.get("mode", "reference")
    runner = group.step_runner(mode, model, cache, **({"interpret": True, "gemv": a.get("gemv")}
                                                      if mode != "reference" else {}))
    logits, tokens = greedy(runner, cache, prompts, a["steps"])
    if info.rank == 0:
        gemv = runner.bound.graph.meta["gemv"] if mode != "reference" else None
        torch.save({"logits": logits, "tokens": tokens, "k": cache.k, "v": cache.v, "gemv": gemv}, a["out"])
    close_rank()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
