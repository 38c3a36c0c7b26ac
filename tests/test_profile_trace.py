"""profile.trace: the time breakdown (computing / waiting / idle per SM, each SM's time counted once), the
launch gaps, the Perfetto JSON and the timeline PNG, on random per-task timestamps checked against a
brute-force reference (a per-nanosecond occupancy bitmap per SM)."""
import json

import numpy as np
import pytest
import torch

from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.tiling import Tiling
from onekernel.profile.trace import breakdown, perfetto, publish_of, sm_of, timeline_png


def _fake_profile(graph, n_sm, seed):
    """int64 [T, 4] (start, ready, end, sm) in ns: ops in program order, tiles spread over SMs, several CTAs
    per SM overlapping (as separate kernels and PDL do); some tasks with no wait at all."""
    g = torch.Generator().manual_seed(seed)
    prof = torch.zeros(len(graph.tasks), 4, dtype=torch.int64)
    t = 1000
    for op in graph.ops:
        for tid in op.task_ids:
            s = t + int(torch.randint(0, 400, (), generator=g))
            r = s + int(torch.randint(0, 2, (), generator=g)) * int(torch.randint(1, 300, (), generator=g))
            e = r + int(torch.randint(1, 500, (), generator=g))
            prof[tid] = torch.tensor([s, r, e, int(torch.randint(0, n_sm, (), generator=g))])
        t = int(prof[op.task_ids, 2].max()) + int(torch.randint(0, 200, (), generator=g))
    return prof


def _reference(graph, prof, n_sm):
    p = prof.numpy()
    t0, t1 = p[:, 0].min(), p[:, 2].max()
    comp = np.zeros((n_sm, t1 - t0), bool)
    busy = np.zeros((n_sm, t1 - t0), bool)
    for s, r, e, sm in p:
        comp[sm, r - t0:e - t0] = True
        busy[sm, s - t0:e - t0] = True
    c, b = comp.sum() / 1e3, busy.sum() / 1e3
    span = (t1 - t0) / 1e3
    return span, c, b - c, span * n_sm - b


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_breakdown_counts_each_sm_once(seed):
    graph, _, _ = decode_graph(get_config("tiny"), 2, 32, torch.float32, tiling=Tiling(4))
    n_sm = 3  # more tiles than SMs: CTAs share SMs and overlap
    prof = _fake_profile(graph, n_sm, seed)
    bd = breakdown(graph, prof, n_sm)
    span, comp, wait, idle = _reference(graph, prof, n_sm)
    assert bd["span_us"] == pytest.approx(span)
    assert bd["computing_us"] == pytest.approx(comp)
    assert bd["waiting_us"] == pytest.approx(wait)
    assert bd["idle_us"] == pytest.approx(idle)
    assert bd["computing_pct"] + bd["waiting_pct"] + bd["idle_pct"] == pytest.approx(100.0)
    assert 0 <= bd["waiting_pct"] <= 100 and 0 <= bd["computing_pct"] <= 100
    p = prof.numpy()
    by_kind = {}
    for op in graph.ops:
        by_kind[op.kind.name] = by_kind.get(op.kind.name, 0.0) + sum((p[t, 2] - p[t, 1]) / 1e3 for t in op.task_ids)
    assert bd["computing_by_kind_us"] == pytest.approx(by_kind)
    gaps = sum(max(p[b.task_ids, 0].min() - p[a.task_ids, 2].max(), 0) / 1e3
               for a, b in zip(graph.ops, graph.ops[1:]))
    assert bd["launch_gaps_us"] == pytest.approx(gaps)


@pytest.mark.parametrize("seed", [3, 4])
def test_breakdown_reads_the_sm_under_the_streaming_kernels_publish_bits(seed):
    """The streaming megakernel packs each task's publish (ns at its last barrier << 16, ns of the whole publish
    << 40; exec.stream_device) into the SM column: the breakdown must count the same SMs and times as without."""
    graph, _, _ = decode_graph(get_config("tiny"), 2, 32, torch.float32, tiling=Tiling(4))
    n_sm = 3
    prof = _fake_profile(graph, n_sm, seed)
    g = torch.Generator().manual_seed(seed + 100)
    bar = torch.randint(0, 1 << 20, (len(prof),), generator=g)
    pub = torch.randint(1, 1 << 20, (len(prof),), generator=g)
    packed = prof.clone()
    packed[:, 3] += (bar << 16) + (pub << 40)
    assert (packed[:, 3] >= n_sm).all()
    assert breakdown(graph, packed, n_sm) == breakdown(graph, prof, n_sm)
    assert [sm_of(c) for c in packed[:, 3].tolist()] == prof[:, 3].tolist()
    assert [publish_of(c) for c in packed[:, 3].tolist()] == list(zip(bar.tolist(), pub.tolist()))


def test_perfetto_and_png(tmp_path):
    graph, _, _ = decode_graph(get_config("tiny"), 1, 16, torch.float32, tiling=Tiling(4))
    prof = _fake_profile(graph, 4, 7)
    perfetto(graph, prof, tmp_path / "t.json", "graph")
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    bodies = [e for e in ev if e.get("ph") == "X" and e["cat"] != "wait"]
    assert sorted(e["args"]["task"] for e in bodies) == list(range(len(graph.tasks)))
    p = prof.numpy()
    for e in bodies:
        s, r, end, sm = p[e["args"]["task"]]
        assert e["tid"] == sm and e["ts"] == pytest.approx((r - p[:, 0].min()) / 1e3)
        assert e["dur"] == pytest.approx(max((end - r) / 1e3, 1e-3))
    waits = [e for e in ev if e.get("cat") == "wait"]
    assert len(waits) == int((p[:, 1] > p[:, 0]).sum())
    timeline_png(graph, prof, tmp_path / "t.png", "tiny")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
