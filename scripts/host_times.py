"""Host-side cost of building a megakernel runner, on the CPU (issue 12: warm start <= 5 s).

    python scripts/host_times.py [--cases MODEL:BATCH,...] [--workers 132] [--ctx 512] [--profile PHASE]

Times, per case (bf16, ``Tiling(workers, "fit")``, no weights, nothing launched), each phase both megakernels
run at construction: the graph (``decode_graph``); the Triton megakernel's dependencies, reduction, events,
critical-path schedule, validation and queue records; the streaming megakernel's plan (``stream_plan.make_plan``:
re-tiling, dependencies, events, schedule, validation) and records. Then the same products through
``exec.host_cache`` in a private cache folder: ``*_store`` (computed and stored: a first start) and ``*_hit``
(loaded: a warm start; the graph digest that keys it included). Prints one JSON line per case.
The weight packing (a GPU copy of every GEMV weight) is not timed here.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class FakeStep:
    """What make_plan reads of a BoundStep: graph and batch (and device for nothing here)."""

    def __init__(self, graph):
        self.graph = graph
        self.batch = graph.buffers[graph.meta["io"]["tokens"]].shape[0]


def phases(model: str, batch: int, workers: int, ctx: int, prof: str | None) -> dict:
    import torch

    from onekernel.exec.codegen import variant_of
    from onekernel.exec.queue import build_queue
    from onekernel.exec.stream_plan import make_plan
    from onekernel.exec.stream_records import records, remote_wait_list
    from onekernel.graph.deps import derive_dependencies, derive_events, transitive_reduction
    from onekernel.graph.schedule import critical_path_list, validate
    from onekernel.models.config import get_config
    from onekernel.models.decode_graph import decode_graph
    from onekernel.ops.tiling import Tiling

    cfg = get_config(model)
    os.environ["ONEKERNEL_HOST_CACHE"] = "0"  # the phases as before the cache
    out, t = {}, time.perf_counter()

    def lap(name, fn):
        nonlocal t
        if prof == name:
            pr = cProfile.Profile()
            pr.enable()
        r = fn()
        if prof == name:
            pr.disable()
            pstats.Stats(pr, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
        now = time.perf_counter()
        out[name] = round(now - t, 3)
        t = now
        return r

    g, _, _ = lap("graph", lambda: decode_graph(cfg, batch, min(ctx, cfg.max_seq_len), torch.bfloat16,
                                                 tiling=Tiling(workers, "fit")))
    out["tasks"] = len(g.tasks)
    t = time.perf_counter()
    deps0 = lap("deps", lambda: derive_dependencies(g))
    deps = lap("reduce", lambda: transitive_reduction(deps0))
    ev = lap("events", lambda: derive_events(g, deps))
    sch = lap("schedule", lambda: critical_path_list(g, deps, workers))
    lap("validate", lambda: validate(sch, g, deps))
    op_var, vid = [], {}
    for op in g.ops:
        op_var.append(vid.setdefault(variant_of(g, op), len(vid)))
    t = time.perf_counter()
    lap("records", lambda: build_queue(g, sch, ev, op_var, lambda task: (0, 0)))
    out["triton_total"] = round(sum(out[k] for k in ("deps", "reduce", "events", "schedule", "validate", "records")), 3)
    step = FakeStep(g)
    t = time.perf_counter()
    plan = lap("stream_plan", lambda: make_plan(step, workers))
    lap("stream_records", lambda: (records(plan), remote_wait_list(plan)))
    out["stream_tasks"] = len(plan.graph.tasks)
    out["stream_total"] = round(out["stream_plan"] + out["stream_records"], 3)
    from onekernel.exec import host_cache
    from onekernel.exec.megakernel import host_products

    os.environ["ONEKERNEL_HOST_CACHE"] = "1"
    t = time.perf_counter()
    lap("digest", lambda: host_cache.graph_digest(g))
    for what in ("store", "hit"):
        (_, _, ev2, sch2), hit = lap(f"triton_{what}", lambda: host_products(g, n_workers=workers))
        assert hit == (what == "hit") and ev2 == ev and sch2 == sch
        p2 = lap(f"stream_{what}", lambda: make_plan(step, workers))
        assert p2.cache_hit == (what == "hit"), (what, p2.cache_hit)
        assert p2.schedule == plan.schedule, what
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="llama-3.2-1b:1,llama-3.2-1b:16,llama-3.1-8b:1,llama-3.1-8b:16")
    ap.add_argument("--workers", type=int, default=132)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--profile", default=None, help="cProfile this phase (stderr)")
    a = ap.parse_args()
    import tempfile

    os.environ["ONEKERNEL_CACHE"] = tempfile.mkdtemp(prefix="ok_host_times_")
    os.environ["ONEKERNEL_HOST_CACHE"] = "0"
    for c in a.cases.split(","):
        m, b = c.split(":")
        r = phases(m, int(b), a.workers, a.ctx, a.profile)
        print(json.dumps({"model": m, "batch": int(b), **r}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
