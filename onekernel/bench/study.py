"""``onekernel bench --study``: measure what each cause contributes to the differences between graph, pdl and
megakernel mode, on one model, batch and context, in one process.

Variants (each a runner option of one mode, timed by ``bench_modes`` like every mode; one record each, with a
``variant`` field and the ``study`` letters it answers):

(a) startup overlap: ``graph``, ``pdl`` (prologue split: wait after the prologue; dependents launched after
    the body), ``pdl-nosplit`` (wait before the prologue), ``pdl-entrytrigger`` (dependents launched at
    entry), ``pdl-waittrigger`` (dependents launched right after the wait);
(b) prefetch: ``megakernel`` (next-task weight prefetch into L2) against ``megakernel-noprefetch``;
(c) dependency granularity: ``megakernel`` (tile-level events) against ``megakernel-opevents`` (one per op);
    task granularity: ``megakernel-covertiles`` (the separate kernels' 1-2 tiles per SM per op instead of
    at most one per worker);
(d) workers: ``megakernel-w132``, ``-w128``, ``-w96``, ``-w66`` (the default ``megakernel`` runs one worker
    per SM and stands for the entry equal to the SM count); ``megakernel-roundrobin`` (round-robin schedule
    instead of the critical-path list scheduler); ``megakernel-8warps`` (8 warps per worker: one worker per SM
    by registers, and twice the threads issuing loads);
(e) launch gaps: one profiled step (``profile=True``) in graph, pdl and pdl-nosplit mode; from the per-task
    timestamps: the time between one op's last tile end and the next op's first tile start (launch gaps,
    ``profile.trace.breakdown``) and its first tile's body start (ready gaps), summed over the boundaries.

Every number is measured in this run; ``bench.report.study_report`` turns the records into the report.
"""
from __future__ import annotations

from onekernel.bench.modes import bench_modes
from onekernel.errors import InputError

WORKERS = (132, 128, 96, 66)
GAP_VARIANTS = (("gaps-graph", "graph", {}), ("gaps-pdl", "pdl", {"backend": "triton"}),
                ("gaps-pdl-nosplit", "pdl", {"prologue_split": False}))


def study_variants(n_sm: int) -> list[tuple[str, str, dict, str]]:
    """(variant, mode, runner options, study letters) of every timed variant."""
    v = [("graph", "graph", {}, "a"), ("pdl", "pdl", {"backend": "triton"}, "a"),
         ("pdl-nosplit", "pdl", {"prologue_split": False}, "a"),
         ("pdl-entrytrigger", "pdl", {"trigger": "entry"}, "a"),
         ("pdl-waittrigger", "pdl", {"trigger": "wait"}, "a"),
         ("megakernel", "megakernel", {}, "bcd"),
         ("megakernel-noprefetch", "megakernel", {"prefetch": False}, "b"),
         ("megakernel-opevents", "megakernel", {"events": "op"}, "c"),
         ("megakernel-covertiles", "megakernel", {"tiles": "cover"}, "c"),
         ("megakernel-roundrobin", "megakernel", {"policy": "round_robin"}, "d")]
    # Fewer workers run the default's graph (tiled for n_sm SMs), so only the worker count varies.
    v += [(f"megakernel-w{w}", "megakernel", {"n_workers": w}, "d") for w in WORKERS if w != n_sm]
    v += [("megakernel-8warps", "megakernel", {"num_warps": 8}, "d")]
    return v


def boundary_gaps(graph, prof) -> dict:
    """From per-task timestamps (ns, ``prof[task] = (start, ready, end, sm)``), summed over consecutive ops
    of ``graph.ops``: launch gaps (next op's first start - this op's last end, clipped at 0, as
    ``profile.trace.breakdown``) and ready gaps (next op's first ready - this op's last end, clipped at 0)."""
    p = prof.detach().cpu().tolist()
    first_start, first_ready, last_end = {}, {}, {}
    for task, (s, r, e, _) in zip(graph.tasks, p):
        i = task.op
        first_start[i] = min(first_start.get(i, s), s)
        first_ready[i] = min(first_ready.get(i, r), r)
        last_end[i] = max(last_end.get(i, e), e)
    ops = sorted(first_start)
    launch = sum(max(first_start[b] - last_end[a], 0) for a, b in zip(ops, ops[1:])) / 1e3
    ready = sum(max(first_ready[b] - last_end[a], 0) for a, b in zip(ops, ops[1:])) / 1e3
    return {"launch_gaps_us": launch, "ready_gaps_us": ready, "boundaries": max(len(ops) - 1, 0)}


def profile_gaps(model, batch: int, context: int, mode: str, options: dict, steps: int = 5) -> dict:
    """One profiled runner of ``mode`` on a random cache at position ``context - 1``: the last of ``steps``
    steps' span, time shares (``profile.trace.breakdown``) and boundary gaps."""
    import torch

    from onekernel.bench.modes import random_decode_state
    from onekernel.profile.trace import breakdown
    from onekernel.runtime.runners import make_step_runner

    cache, tokens = random_decode_state(model, batch, context)
    r = make_step_runner(mode, model, cache, profile=True, **options)
    for _ in range(steps):
        r.step(tokens)
    torch.cuda.synchronize()
    bd = breakdown(r.graph, r.prof, torch.cuda.get_device_properties(0).multi_processor_count)
    out = {k: bd[k] for k in ("span_us", "computing_pct", "waiting_pct", "idle_pct")}
    out.update(boundary_gaps(r.graph, r.prof))
    out["breakdown_launch_gaps_us"] = bd["launch_gaps_us"]
    return out


def variant_names(n_sm: int) -> list[str]:
    """Every variant name of the study, timed ones first, in run order."""
    return [v for v, *_ in study_variants(n_sm)] + [v for v, *_ in GAP_VARIANTS]


def pick_variants(spec: str | None, n_sm: int) -> set[str] | None:
    """Parse ``--variants`` (comma-separated names of ``variant_names``; None = all). Raises
    onekernel.errors.InputError when it names no variant, or naming the unknown ones and the valid names."""
    if spec is None:
        return None
    want = [v.strip() for v in spec.split(",") if v.strip()]
    known = variant_names(n_sm)
    if not want:
        raise InputError(f"--variants is empty; leave it out for the whole study, or name some of {', '.join(known)}")
    bad = [v for v in want if v not in known]
    if bad:
        raise InputError(f"unknown study variant(s) {bad} in --variants; choose from {', '.join(known)}")
    return set(want)


def run_study(model, name: str, batches: list[int], context: int, bw_gbs: float, *, steps: int = 200,
              n_sm: int = 132, started=None, progress=None, only: set[str] | None = None) -> list[dict]:
    """Every variant of (a)-(d) timed, and (e) profiled, for each batch size (``only``: just these variant
    names). Returns the records (without the run's metadata; the caller adds gpu, versions, commit and date).
    started(label) / progress(record) are called around each case."""
    records = []
    for b in batches:
        for variant, mode, opts, letters in study_variants(n_sm):
            if only is not None and variant not in only:
                continue
            rec, = bench_modes(model, name, b, context, [mode], bw_gbs, steps=steps, options={mode: opts},
                               started=lambda m, v=variant: started and started(f"batch {b}: {v}"))
            rec.update(variant=variant, study=letters, options=opts)
            if mode == "megakernel":
                rec["workers"] = opts.get("n_workers", n_sm)
            records.append(rec)
            if progress:
                progress(rec)
        for variant, mode, opts in GAP_VARIANTS:
            if only is not None and variant not in only:
                continue
            if started:
                started(f"batch {b}: {variant} (profiled)")
            rec = {"model": name, "batch": b, "context": context, "mode": mode, "variant": variant, "study": "e",
                   "options": opts, "profiled": True, "ms_per_step": None}
            try:
                rec.update(profile_gaps(model, b, context, mode, opts))
            except Exception as e:  # noqa: BLE001 - one failing variant must not hide the others
                rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            records.append(rec)
            if progress:
                progress(rec)
    return records
