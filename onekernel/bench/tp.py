"""Per-step latency of the tensor-parallel decode step in every mode that runs at --tp N, timed on every rank of
one group: "torch" (``dist.tp_reference``), "torch+graph" (``bench.tp_graph``: the same captured in a CUDA graph
with NCCL inside), the kernel modes eager, graph, pdl (``dist.tp_kernels``) with each all-reduce asked for
("nccl", "symm": ``dist.allreduce``), and the megakernel (``dist.tp_megakernel``: its all-reduces are tile tasks;
allreduce null): "megakernel" with the backend "auto" picks (the streaming Gluon kernel for bf16 Llama-family
shards on Hopper; the record's ``backend`` says which ran), "megakernel-triton" the Triton megakernel,
"megakernel-push" the streaming kernel with the push all-reduce (``push=True``: producers store their rows in the
peers' memory and signal there; the all-reduce tasks read and poll only their own GPU's).

Each record (rank 0's), the TP=1 bench's fields (``bench.modes``) plus ``tp`` and ``allreduce``: model, batch,
context, mode, allreduce (null for the torch modes: they all-reduce through NCCL), tp, runner, gemv (the GEMV path
of a onekernel mode's step, "fma" | "mma": the unsharded model's default unless ``gemv`` is given, as at TP=1; null
for the torch modes), ms_per_step (the slowest rank's median of ``steps`` CUDA-event-timed steps), p10/p90 (rank
0's), steps, tokens_per_s, floor_ms (the rank's weight + KV bytes / the copy bandwidth it measured: the TP floor,
communication excluded), weight_bytes, kv_bytes (per rank), pct_of_floor, ratio_to_torch_graph, rel_err_vs_torch
(relative L2 error of the first step's whole logits against the "torch" step's on the same input), argmax_agree,
and "error" when the mode failed (timings None). The state is ``bench.modes``'s: random K/V, every sequence at
position ``context - 1``, steps do not advance it; the tokens are drawn from the whole vocabulary with one seed, so
every rank embeds the same ones.
"""
from __future__ import annotations

import gc

import torch

from onekernel.bench.modes import random_decode_state, runner_gemv
from onekernel.bench.report import fill_ratios, md_table
from onekernel.bench.timing import copy_bandwidth_gbs, floor_ms, median_ms, step_bytes

TP_BENCH_MODES = ("torch", "torch+graph", "eager", "graph", "pdl", "megakernel", "megakernel-triton", "megakernel-push")
KERNEL_MODES = ("eager", "graph", "pdl")


def tp_runner(mode: str, model, cache, group, allreduce: str | None, gemv: str | None = None):
    """The rank's runner of a TP_BENCH_MODES ``mode`` (``allreduce`` for the kernel modes; ``gemv`` "fma" | "mma" |
    None (the model's path) for the onekernel modes)."""
    if mode == "torch+graph":
        from onekernel.bench.tp_graph import TPTorchGraphRunner
        return TPTorchGraphRunner(model, cache, group)
    if mode == "torch":
        return group.step_runner("reference", model, cache)
    if mode == "megakernel-push":
        return group.step_runner("megakernel", model, cache, backend="gluon", push=True, gemv=gemv)
    if mode in ("megakernel", "megakernel-triton"):
        return group.step_runner("megakernel", model, cache, backend="auto" if mode == "megakernel" else "triton",
                                 gemv=gemv)
    return group.step_runner(mode, model, cache, allreduce=allreduce, gemv=gemv)


def _slowest(group, ms: float, device) -> float:
    t = torch.tensor([ms], device=device)
    group.dist.all_reduce(t, op=group.dist.ReduceOp.MAX)
    return float(t)


def bench_tp(model, group, batches: list[int], context: int, modes=TP_BENCH_MODES, allreduces=("nccl",),
             steps: int = 200, progress=None, gemv: str | None = None) -> list[dict]:
    """Time each of ``modes`` (TP_BENCH_MODES; the kernel modes once per ``allreduces`` entry) at each batch
    size; ``model``: the rank's ShardedModel on its GPU; ``gemv``: the onekernel modes' GEMV path (None: the
    model's). Every rank calls it with the same arguments; returns the records (rank 0's are the ones to keep).
    ``progress(record)`` is called after each. A mode that fails on every rank gets its error recorded and the
    others still run."""
    records = []
    dev = model.weights["tok_embeddings"].device
    bw = copy_bandwidth_gbs()
    wb, _ = step_bytes(model.config, 1, context, model.weights["tok_embeddings"].element_size())
    for b in batches:
        cache, _ = random_decode_state(model, b, context)
        _, kvb = step_bytes(model.config, b, context, cache.k.element_size())
        g = torch.Generator(device=dev).manual_seed(0)
        tokens = torch.randint(0, group.config.vocab_size, (b,), device=dev, dtype=torch.int32, generator=g)
        ref_logits, ref_next = (x.clone() for x in tp_runner("torch", model, cache, group, None).step(tokens))
        floor = floor_ms(wb, kvb, bw)
        for mode in modes:
            for ar in (allreduces if mode in KERNEL_MODES else (None,)):
                rec = {"model": group.config.name, "batch": b, "context": context, "mode": mode, "allreduce": ar,
                       "tp": group.shard.tp, "floor_ms": floor, "weight_bytes": wb, "kv_bytes": kvb,
                       "ms_per_step": None, "tokens_per_s": None, "pct_of_floor": None, "ratio_to_torch_graph": None}
                try:
                    r = tp_runner(mode, model, cache, group, ar, gemv)
                    rec["runner"], rec["gemv"] = type(r).__name__, runner_gemv(r)
                    if hasattr(r, "backend"):
                        rec["backend"] = r.backend
                    lg, nt = r.step(tokens)
                    r.check()
                    rec.update(rel_err_vs_torch=float((lg - ref_logits).norm() / ref_logits.norm()),
                               argmax_agree=f"{int((nt == ref_next).sum())}/{b}")
                    t = median_ms(lambda: r.step(tokens), steps=steps, warmup=10)
                    ms = _slowest(group, t["median_ms"], dev)
                    rec.update(ms_per_step=ms, p10_ms=t["p10_ms"], p90_ms=t["p90_ms"], steps=t["steps"],
                               tokens_per_s=b * 1e3 / ms, pct_of_floor=100 * floor / ms)
                    del r
                    gc.collect()  # free the runner's weights copy and CUDA graphs before the next mode's
                except Exception as e:  # noqa: BLE001 - one failing mode must not hide the others
                    rec["error"] = f"{type(e).__name__}: {e}"[:2000]
                records.append(rec)
                if progress:
                    progress(rec)
    return fill_ratios(records)


def tp_table(records: list[dict]) -> str:
    """Markdown table of ``bench_tp``'s records."""
    def lead(r):
        how = ", ".join(x for x in (r.get("backend"), r.get("gemv")) if x)
        return r["model"], r["tp"], r["batch"], r["mode"] + (f" ({how})" if how else ""), r.get("allreduce") or "-"

    def cells(r):
        ratio = f"{r['ratio_to_torch_graph']:.2f}x" if r.get("ratio_to_torch_graph") else "-"
        return (f"{r['ms_per_step']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['pct_of_floor']:.0f}%", ratio,
                f"{r.get('rel_err_vs_torch', float('nan')):.1e}", r.get("argmax_agree", "-"))

    return md_table(["model", "tp", "batch", "mode", "allreduce", "ms/step", "tokens/s", "% of floor",
                     "vs torch+graph", "rel. err", "argmax"], records, lead, cells)
