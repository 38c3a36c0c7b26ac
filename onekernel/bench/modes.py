"""Per-step decode latency of every mode on one model, batch and context, in one process.

Each record: model, batch, context, mode, runner (the class that ran it: the megakernel's backend), gemv (the
GEMV path of a onekernel mode's graph: "fma" CUDA cores or "mma" tensor cores; None for PyTorch), ms_per_step (median of ``steps`` CUDA-event-timed steps after
warm-up), p10/p90, tokens_per_s, floor_ms (weight + KV bytes / copy bandwidth measured in the same run),
pct_of_floor (floor / measured, %), ratio_to_torch_graph (measured / PyTorch + CUDA graph), and a correctness
check of the mode's first step against the PyTorch reference step on the same input: rel_err_vs_torch (relative
L2 error of the logits) and argmax_agree ("agreeing rows/batch"). The timing keys
are always present: None when the mode failed (then "error" says why) or torch+graph was not measured.
The cache holds random K/V and every sequence sits at position ``context - 1``; steps do not advance it, so
every timed step reads the same ``context`` positions.
"""
from __future__ import annotations

import torch

from onekernel.bench.baselines import TorchCompileRunner, TorchGraphRunner
from onekernel.bench.timing import floor_ms, median_ms, step_bytes
from onekernel.errors import InputError
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner
from onekernel.runtime.runners import make_step_runner

BASELINES = {"torch": ReferenceRunner, "torch+graph": TorchGraphRunner, "torch+compile": TorchCompileRunner}
# Bench rows that run a mode with fixed options: the Triton megakernel beside "megakernel" (which takes the
# streaming Gluon kernel where exec.megakernel_class's "auto" does), the streaming kernel where "auto" keeps the
# Triton one (small models: stream_support.prefer_stream), graph / pdl on the streaming kernel's Gluon bodies, one
# kernel per op (exec.stream_segments), and pdl on the Triton per-op kernels where "auto" takes the Gluon bodies
# (tensor-core steps: exec.pdl_streams); pdl-triton-wait triggers each kernel's dependent launch right after its
# ``gdc_wait`` instead of after its body (exec/codegen.eager_source's TRIGGER, a study row); graph-mma, pdl-mma and
# pdl-triton-mma run a small model's separate kernels on the tensor cores, where its default path is the CUDA cores
# (models.decode_graph.default_gemv).
MODE_VARIANTS = {"megakernel-triton": ("megakernel", {"backend": "triton"}),
                 "megakernel-gluon": ("megakernel", {"backend": "gluon"}),
                 "graph-gluon": ("graph", {"backend": "gluon"}), "pdl-gluon": ("pdl", {"backend": "gluon"}),
                 "pdl-triton": ("pdl", {"backend": "triton"}),
                 "pdl-triton-wait": ("pdl", {"backend": "triton", "trigger": "wait"}),
                 "pdl-gluon-layer": ("pdl", {"backend": "gluon", "segment": "layer"}),
                 "graph-mma": ("graph", {"gemv": "mma"}), "pdl-mma": ("pdl", {"gemv": "mma"}),
                 "pdl-triton-mma": ("pdl", {"backend": "triton", "gemv": "mma"})}


def variant_options(mode: str, opts: dict) -> tuple[str, dict]:
    """(mode, options) of a MODE_VARIANTS row run with the caller's ``opts`` (a plain mode: itself and ``opts``).
    Raises InputError when ``opts`` sets an option the row fixes (e.g. ``--gemv fma`` with ``graph-mma``)."""
    if mode not in MODE_VARIANTS:
        return mode, dict(opts)
    base, fixed = MODE_VARIANTS[mode]
    clash = sorted(k for k in fixed if k in opts)
    if clash:
        raise InputError(f"bench row {mode!r} fixes {', '.join(f'{k}={fixed[k]!r}' for k in clash)}; leave "
                         f"{', '.join(clash)} out, or time the mode {base!r} with it")
    return base, {**fixed, **opts}


def make_bench_runner(mode, model, cache, **opts):
    """A runner of ``mode``: one of the PyTorch baselines (BASELINES), a MODE_VARIANTS row (``variant_options``:
    InputError when ``opts`` sets an option the row fixes), or a mode of ``make_step_runner``."""
    if mode in BASELINES:
        return BASELINES[mode](model, cache, **opts)
    base, merged = variant_options(mode, opts)
    return make_step_runner(base, model, cache, **merged)


def runner_gemv(runner) -> str | None:
    """The GEMV path of a onekernel runner's decode step ("fma" | "mma", its graph's ``meta["gemv"]``; the
    tensor-parallel runners' too); None for a PyTorch runner (no ``bound`` step)."""
    bound = getattr(runner, "bound", None)
    return bound.graph.meta.get("gemv") if bound is not None else None


def random_decode_state(model, batch: int, context: int, lens: list[int] | None = None, seed: int = 0):
    """A KV cache of ``context`` positions holding random K/V, every sequence at position ``context - 1`` (or
    at ``lens[b]``), and random tokens [B] (int32): the state every timed step starts from (seeded, so each mode
    of one run sees the same numbers)."""
    cfg = model.config
    cache = KVCache(cfg, batch, context, model.weights["tok_embeddings"].dtype, "cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    if lens is None:
        cache.seq_lens.fill_(context - 1)
    else:
        cache.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device="cuda", dtype=torch.int32, generator=g)
    return cache, tokens


def step_on_copy(model, mode: str, cache, tokens, **options):
    """One step of ``mode`` (runner ``options``) from a copy of ``cache``: (logits, next_tokens, the copy after
    the step, the runner); the device error word is checked. Several modes compared on one state each start
    from the same numbers."""
    c = KVCache(model.config, cache.k.shape[1], cache.k.shape[3], cache.k.dtype, cache.k.device)
    for dst, src in ((c.k, cache.k), (c.v, cache.v), (c.seq_lens, cache.seq_lens)):
        dst.copy_(src)
    r = make_bench_runner(mode, model, c, **options)
    logits, nxt = r.step(tokens)
    torch.cuda.synchronize()
    r.check()
    return logits.clone(), nxt.clone(), c, r


def bench_modes(model, name: str, batch: int, context: int, modes: list[str], bw_gbs: float,
                steps: int = 200, options: dict | None = None, progress=None, started=None,
                fill: int | None = None) -> list[dict]:
    """Time ``modes`` (plus any of "torch", "torch+graph", "torch+compile") on one shared cache. Returns one
    record per mode; a mode that fails gets {"error": message} and None timings.
    options: mode -> keyword options of its runner. started(mode) / progress(record): called before / after
    each mode. ``fill``: positions each sequence has written (it writes position fill - 1 and attends over fill
    positions) in a cache of ``context`` positions (default: context; the floor counts the K/V bytes of fill)."""
    cfg = model.config
    fill = context if fill is None else fill
    if not 1 <= fill <= context:
        raise ValueError(f"fill must be between 1 and the context ({context}), got {fill}")
    cache, tokens = random_decode_state(model, batch, context, None if fill == context else [fill - 1] * batch)
    wb, kvb = step_bytes(cfg, batch, fill, model.weights["tok_embeddings"].element_size())
    floor = floor_ms(wb, kvb, bw_gbs)
    # The reference step's output, to check every timed mode on the same input (a step is idempotent: it
    # rewrites the same KV row with the same values, so the order of the modes does not matter).
    ref_logits, ref_next = (x.clone() for x in ReferenceRunner(model, cache).step(tokens))
    records = []
    for mode in modes:
        rec = {"model": name, "batch": batch, "context": context, "fill": fill, "mode": mode, "floor_ms": floor,
               "weight_bytes": wb, "kv_bytes": kvb, "ms_per_step": None, "tokens_per_s": None,
               "pct_of_floor": None, "ratio_to_torch_graph": None}
        if started:
            started(mode)
        try:
            opts = dict((options or {}).get(mode, {}))
            r = make_bench_runner(mode, model, cache, **opts)
            rec["runner"] = type(r).__name__
            rec["gemv"] = runner_gemv(r)
            lg, nt = r.step(tokens)
            r.check()
            rec.update(rel_err_vs_torch=float((lg.float() - ref_logits.float()).norm() / ref_logits.float().norm()),
                       argmax_agree=f"{int((nt.view(-1) == ref_next.view(-1)).sum())}/{batch}")
            t = median_ms(lambda: r.step(tokens), steps=steps, warmup=10)
            r.check()
            rec.update(ms_per_step=t["median_ms"], p10_ms=t["p10_ms"], p90_ms=t["p90_ms"], steps=t["steps"],
                       tokens_per_s=batch * 1e3 / t["median_ms"], pct_of_floor=100 * floor / t["median_ms"])
            del r
        except Exception as e:  # noqa: BLE001 - one failing mode must not hide the others
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
        records.append(rec)
        if progress:
            progress(rec)
    base = next((r["ms_per_step"] for r in records if r["mode"] == "torch+graph" and r["ms_per_step"]), None)
    for r in records:
        if base and r["ms_per_step"]:
            r["ratio_to_torch_graph"] = r["ms_per_step"] / base
    return records
