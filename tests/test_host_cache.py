"""The host-side products cache (exec/host_cache.py, issue 12 warm start): a warm start loads exactly what a cold
one computes, a changed input misses, and a bad file is recomputed with a warning, never trusted.

Each test gets its own cache folder (``ONEKERNEL_CACHE``), so the first build is a store and the second a hit.
"""
import dataclasses
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from onekernel.cli import main
from onekernel.dist.sharding import shard_config
from onekernel.exec import host_cache
from onekernel.exec.megakernel import host_products
from onekernel.exec.stream_plan import make_plan
from onekernel.exec.stream_records import records, remote_wait_list
from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.tiling import Tiling

CFG = dataclasses.replace(get_config("tiny"), name="host-cache-test", vocab_size=300, dim=128, n_heads=4, n_kv_heads=2,
                          head_dim=64, ffn_dim=384)
W = 8


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ONEKERNEL_CACHE", str(tmp_path / "gen"))
    monkeypatch.setenv("ONEKERNEL_HOST_CACHE", "1")
    return tmp_path / "gen" / "host"


def _graph(batch=2, tp=None, cfg=CFG):
    if tp:
        cfg = shard_config(cfg, tp[1], tp[0]).config
    return decode_graph(cfg, batch, 48, torch.bfloat16, tiling=Tiling(W, "fit"), tp=tp)[0]


def _step(g):
    return SimpleNamespace(graph=g, batch=g.buffers["tokens"].shape[0], device=torch.device("cpu"))


def _uncached(monkeypatch, fn):
    monkeypatch.setenv("ONEKERNEL_HOST_CACHE", "0")
    try:
        return fn()
    finally:
        monkeypatch.setenv("ONEKERNEL_HOST_CACHE", "1")


def _same_plan(a, b):
    assert a.events == b.events and a.schedule == b.schedule and a.units == b.units and a.kinds == b.kinds
    assert a.consts == b.consts
    for k in ("qrec", "wl", "rwl"):
        assert a.tables[k].dtype == b.tables[k].dtype == torch.int32 and torch.equal(a.tables[k], b.tables[k]), k


@pytest.mark.parametrize("tp", [None, (1, 2)])
def test_stream_plan_from_the_cache_equals_the_recomputed_one(tp, monkeypatch, private_cache):
    g = _graph(tp=tp)
    ref = _uncached(monkeypatch, lambda: make_plan(_step(g), W))
    assert not ref.cache_hit and not private_cache.exists()
    cold = make_plan(_step(g), W)
    warm = make_plan(_step(_graph(tp=tp)), W)  # another graph object of the same step, as in a new process
    assert not cold.cache_hit and warm.cache_hit
    assert len(list(private_cache.glob("stream-*.okh"))) == 1
    for p in (cold, warm):
        _same_plan(p, ref)
        qrec, wl = records(p)  # the stored tables are what the plan's own records give
        assert torch.equal(qrec, p.tables["qrec"]) and torch.equal(wl, p.tables["wl"])
        assert torch.equal(remote_wait_list(p), p.tables["rwl"])
    if tp:
        assert any(warm.events.remote_waits) and any(warm.events.sys_signal)


@pytest.mark.parametrize("tp,options", [(None, {}), (None, {"events": "op"}), (None, {"policy": "round_robin"}),
                                        ((0, 2), {}), ((0, 2), {"comm_workers": 2})])
def test_triton_products_from_the_cache_equal_the_recomputed_ones(tp, options, monkeypatch):
    g = _graph(tp=tp)
    ref, hit = _uncached(monkeypatch, lambda: host_products(g, n_workers=W, **options))
    assert not hit
    cold, hit0 = host_products(g, n_workers=W, **options)
    warm, hit1 = host_products(_graph(tp=tp), n_workers=W, **options)
    assert (hit0, hit1) == (False, True)
    assert cold == ref and warm == ref  # deps, remote deps, events (every field), schedule
    assert [type(x) for x in warm[2].sys_signal] == [type(x) for x in ref[2].sys_signal]


def test_a_changed_input_misses(monkeypatch, private_cache):
    g = _graph()
    host_products(g, n_workers=W)
    assert host_products(g, n_workers=W)[1]
    assert not host_products(g, n_workers=W - 1)[1]                    # worker count
    assert not host_products(g, n_workers=W, policy="round_robin")[1]  # an option
    assert not host_products(_graph(batch=3), n_workers=W)[1]         # the batch
    g2 = _graph()
    g2.tasks[5].bytes += 1                                             # one task's cost (the schedule's input)
    assert host_products(g2, n_workers=W)[1] is False
    g3 = _graph()
    r = g3.tasks[7].reads[0]
    box = ((r.box[0][0], r.box[0][1] + 1),) + r.box[1:]
    g3.tasks[7].reads = (dataclasses.replace(r, box=box),) + g3.tasks[7].reads[1:]  # one region
    assert host_products(g3, n_workers=W)[1] is False
    monkeypatch.setattr(host_cache, "source_digest", lambda: "another onekernel")  # a code change
    assert host_products(g, n_workers=W)[1] is False


def test_a_hit_really_loads_the_file(monkeypatch):
    """The comparisons above could not fail if a 'hit' recomputed: a valid file holding another schedule is
    what a hit returns (the key is the only guard against that, by design)."""
    g = _graph()
    (deps, remote, ev, sched), _ = host_products(g, n_workers=W)
    k = host_cache.key("triton", g, n_workers=W, policy="critical_path", events="tile", comm_workers=0)
    a = host_cache.load("triton", k)
    a["sched.v"] = a["sched.v"][::-1].copy()
    host_cache.store("triton", k, a)
    (_, _, _, sched2), hit = host_products(g, n_workers=W)
    assert hit and sched2.queues != sched.queues
    assert [t for q in sched2.queues for t in q] == [t for q in sched.queues for t in q][::-1]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage", "misfit"])
def test_a_bad_file_is_recomputed_with_a_warning(damage, caplog, private_cache):
    g = _graph()
    ref = make_plan(_step(g), W)
    (path,) = private_cache.glob("stream-*.okh")
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage":  # a valid checksum over a body that is no archive
        body = b"not an npz archive"
        import hashlib
        path.write_bytes(host_cache.MAGIC + hashlib.sha256(body).digest() + body)
    else:  # a valid archive of the wrong size (the arrays of another graph)
        a = host_cache.load("stream", path.stem.split("-", 1)[1])
        a["qrec"] = a["qrec"][:-3]
        a["ev.signal"] = a["ev.signal"][:-1]
        host_cache.store("stream", path.stem.split("-", 1)[1], a)
    with caplog.at_level(logging.WARNING, logger="onekernel"):
        again = make_plan(_step(g), W)
    assert not again.cache_hit
    assert any("host cache" in r.message and "recomputing" in r.message for r in caplog.records), caplog.text
    _same_plan(again, ref)
    assert make_plan(_step(g), W).cache_hit  # rewritten


def test_an_unwritable_cache_only_warns(tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("ONEKERNEL_CACHE", str(tmp_path / "gen"))
    monkeypatch.setattr(host_cache, "path_of", lambda what, k: tmp_path / "file" / "sub" / f"{what}.okh")
    with caplog.at_level(logging.WARNING, logger="onekernel"):
        (_, _, _, s), hit = host_products(_graph(), n_workers=W)
    assert not hit and s.n_workers == W and "cannot write" in caplog.text


def test_lists_round_trip():
    for lists in ([], [[]], [[1, 2], [], [3]], [[(0, 5), (1, 7)], []]):
        width = 2 if any(isinstance(v, tuple) for x in lists for v in x) else 0
        ptr, v = host_cache.pack_lists(lists, width)
        assert host_cache.unpack_lists(ptr, v, len(lists), tuples=bool(width)) == lists
    with pytest.raises(ValueError):
        host_cache.unpack_lists(np.array([0, 3, 2]), np.arange(2))


def test_warmup_fills_the_host_cache(capsys, tmp_path, private_cache):
    assert main(["warmup", "--model", "tiny", "--random-weights", "--batch", "2", "--mode", "megakernel",
                 "--interpret", "--max-seq-len", "16"]) == 0
    out = capsys.readouterr().out
    assert len(list(private_cache.glob("triton-*.okh"))) == 1 and str(private_cache) in out


def test_region_fast_path_gives_the_same_regions():
    from onekernel.graph.ir import Buffer, Region
    from onekernel.ops.tiling import region

    b = Buffer("x", (4, 8), torch.float32, "activation")
    for box in (((0, 1), (2, 8)), ((np.int64(0), 1), (2, 8)), ([0, 1], (2, 8)), ((True, 2), (0, 8)),
                ((torch.tensor(1).item(), 3),)):
        r = region(b, *box)
        assert r == Region("x", tuple((int(lo), int(hi)) for lo, hi in box))
        assert all(type(p) is tuple and type(p[0]) is int and type(p[1]) is int for p in r.box)
    with pytest.raises(ValueError):
        region(b, (0, 1, 2))
