"""Stream-K GEMV tasks of the streaming megakernel on the CPU (exec/stream_splitk.py, stream_plan.make_plan): which
ops the default rule cuts on the models' real shapes, the runs and pieces, and the dependencies: every reader of a
split unit's rows waits for every task holding a piece of it (whichever arrives last writes them), and the pieces'
tasks wait for no task of their own op. The packed stream and the kernel's walk and combine, emulated:
tests/test_stream_pack.py; the kernel itself runs on a GPU only (tests/test_stream_gpu.py)."""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from onekernel.dist.sharding import shard_config
from onekernel.exec import stream_base as sd
from onekernel.exec import stream_plan, stream_splitk
from onekernel.exec.stream_plan import make_plan
from onekernel.exec.stream_splitk import pieces, split_tasks, unit_slots
from onekernel.graph.ir import Region
from onekernel.graph.schedule import validate
from onekernel.models.config import get_config
from onekernel.models.decode_graph import build_decode_step, decode_graph
from onekernel.models.random_init import random_weights
from onekernel.ops.tiling import Tiling
from onekernel.runtime.kv_cache import KVCache

# CK 512 (K = 1024 and 1536): qkv_rope and gate_up two k-chunks a unit
CFGK = dataclasses.replace(get_config("tiny"), name="splitk-test", vocab_size=300, dim=1024, n_heads=8, n_kv_heads=2,
                           head_dim=128, ffn_dim=1536, n_layers=2)


def _graph_plan(cfg, workers, batch=1, seq=48):
    from types import SimpleNamespace
    g, _, _ = decode_graph(cfg, batch, seq, torch.bfloat16, tiling=Tiling(workers, "fit"), gemv="mma")
    return make_plan(SimpleNamespace(graph=g, batch=batch, device=torch.device("cpu")), workers)


def _split_kinds(plan):
    return {plan.graph.ops[plan.graph.tasks[t].op].kind.name for t, k in enumerate(plan.ksplit) if k[3]}


@pytest.mark.parametrize("name,tp,want", [
    ("llama-3.1-70b", 8, {"qkv_rope", "gate_up"}),   # CK 512 (down's K 3584): 80 qkv units, 224 gate_up units
    ("llama-3.1-70b", 4, {"qkv_rope"}),              # CK 1024, RG 8: 320 qkv units (1.24x); gate_up 896 (1.03x)
    ("llama-3.1-8b", 8, {"qkv_rope", "gate_up"}),    # CK 256: 24 qkv units of 16 k-chunks, 56 gate_up units
    ("smollm2-135m", 1, {"gate_up"}),                # CK 512: 96 gate_up units of 2 k-chunks (1.375x); qkv: 60
                                                     # units, 120 positions, fewer than the workers
    ("llama-3.1-8b", 2, set()),                      # 384, 896: the largest task streams 1.03x the mean
    ("llama-3.1-8b", 1, set()),                      # 768, 1792
    ("llama-3.2-1b", 1, set()),                      # 384, 1024
    ("qwen3-8b", 1, set()),                          # q/k norm: whole heads; gate_up 1536
])
def test_default_rule_on_the_models_shapes(name, tp, want):
    """STREAM_SPLIT_K=auto cuts an op when its largest task of whole units would stream >= 1.1x the mean (one layer of
    each model, rank 0's shard at TP > 1, 132 workers)."""
    cfg = dataclasses.replace(get_config(name), n_layers=1)
    if tp > 1:
        cfg = shard_config(cfg, tp, 0).config
    plan = _graph_plan(cfg, 132)
    assert _split_kinds(plan) == want
    assert plan.consts["SPLITK"] == bool(want)


@pytest.mark.parametrize("units,nkb,workers", [(80, 16, 132), (224, 16, 132), (3, 2, 5), (7, 5, 7), (192, 2, 132)])
def test_runs_are_equal_and_every_piece_has_one_slot(units, nkb, workers):
    """Task w's positions [p_w, p_{w+1}) differ in length by at most one; its pieces (at most two cut units, streamed
    first, then its whole units) cover them exactly once; each cut unit's pieces, in k order, are unit_slots'
    slots, each slot written by exactly one piece."""
    tasks = split_tasks(units, nkb, workers)
    total, lens, writer = units * nkb, [], {}
    pos = 0
    for w, (u0, nu, ks, ke) in enumerate(tasks):
        assert u0 * nkb + ks == pos
        cover = []
        for a, b, k0, k1, slot in pieces(u0, nu, ks, ke, nkb):
            assert (slot >= 0) == (k1 - k0 < nkb) and (slot < 0 or b == a + 1)
            cover += [u * nkb + k for u in range(a, b) for k in range(k0, k1)]
            if slot >= 0:
                assert 2 * w + slot not in writer
                writer[2 * w + slot] = a
        assert sorted(cover) == list(range(pos, pos + len(cover)))
        assert [p[4] for p in pieces(u0, nu, ks, ke, nkb)] in ([], [-1], [0], [1], [0, 1], [0, -1], [1, -1], [0, 1, -1])
        pos += len(cover)
        lens.append(len(cover))
    assert pos == total and max(lens) - min(lens) <= 1
    for s, u in writer.items():
        assert s in unit_slots(u, nkb, total, workers)
    for u in set(writer.values()):
        assert sorted(unit_slots(u, nkb, total, workers)) == sorted(s for s, v in writer.items() if v == u)


def _reads(task, buf):
    return [r for r in task.reads if r.buffer == buf]


@pytest.mark.parametrize("op_events", [True, False])
@pytest.mark.parametrize("batch,workers", [(1, 7), (3, 100)])
def test_every_reader_of_a_split_unit_waits_for_all_its_pieces(op_events, batch, workers, seed, monkeypatch):
    """With STREAM_SPLIT_K=1 and either event granularity (one per op, or per task as tensor parallel keeps them):
    every task reading a row of a cut unit (gate_up's output row, a q / KV-cache head of qkv_rope) waits, through its
    events, for every task of the unit's pieces; no task of a split op waits for another of its op; the schedule is
    valid."""
    monkeypatch.setattr(stream_splitk, "SPLIT_K", "1")
    monkeypatch.setattr(stream_plan, "OP_EVENTS", op_events)
    w = random_weights(CFGK, torch.bfloat16, "cpu", seed)
    step = build_decode_step(CFGK, w, KVCache(CFGK, batch, 48, torch.bfloat16, "cpu"), tiling=Tiling(workers, "fit"),
                             gemv="mma")
    plan = make_plan(step, workers)
    g, ev = plan.graph, plan.events
    deps = [sorted({p for e in ev.waits[t] for p in ev.producers[e]}) for t in range(len(g.tasks))]
    validate(plan.schedule, g, deps)
    memo = {}

    def ancestors(t):
        if t not in memo:
            memo[t] = set(deps[t]).union(*(ancestors(p) for p in deps[t])) if deps[t] else set()
        return memo[t]

    checked = 0
    for op in g.ops:
        ks = [plan.ksplit[t] for t in op.task_ids]
        if not any(k[3] for k in ks):
            continue
        mine = set(op.task_ids)
        for t in op.task_ids:
            assert not ancestors(t) & mine, f"{op.name}: task {t} waits for a task of its own op"
        nkb, total, n = op.params["NKB"], ks[0][3], ks[0][2]
        rg = plan.consts["RG"]
        for u in {plan.units[t][0] for t in op.task_ids} | {sum(plan.units[t]) - 1 for t in op.task_ids}:
            slots = unit_slots(u, nkb, total, n)
            if len(slots) < 2:
                continue
            holders = {op.task_ids[s // 2] for s in slots}
            if op.kind.name == "gate_up":
                rows = Region(op.args["out"], ((0, batch), (u * rg, (u + 1) * rg)))
            else:
                h = u // (op.params["HD"] // rg)
                hq, hkv = op.params["HQ"], op.params["HKV"]
                buf, hh = ((op.args["q"], h) if h < hq else (op.args["k_cache"], h - hq) if h < hq + hkv
                           else (op.args["v_cache"], h - hq - hkv))
                rows = Region(buf, ((0, batch), (hh, hh + 1)) + tuple((0, d) for d in g.buffers[buf].shape[2:]))
            readers = [t for t in range(op.task_ids[-1] + 1, len(g.tasks))
                       if any(r.overlaps(rows) for r in _reads(g.tasks[t], rows.buffer))]
            assert readers, f"{op.name} unit {u}: no reader found"
            readers = readers[:1] + [t for t in readers if g.tasks[t].op == g.tasks[readers[0]].op]
            for t in readers:
                assert holders <= ancestors(t), f"{op.name} unit {u}: task {t} misses {holders - ancestors(t)}"
                checked += 1
    assert checked


def test_the_switch_is_checked_at_import():
    """STREAM_SPLIT_K other than auto / 1 / 0 is an InputError when exec.stream_splitk is imported (as
    STREAM_SS_PARTIALS: inside a runner's build, backend="auto" would fall back to the Triton megakernel on it)."""
    out = subprocess.run([sys.executable, "-c", "import onekernel.exec.stream_plan"], capture_output=True, text=True,
                         env=dict(os.environ, STREAM_SPLIT_K="yes"), timeout=300)
    assert out.returncode != 0
    assert "InputError: STREAM_SPLIT_K must be auto, 1 or 0, got 'yes'; unset it for the default (auto)" in out.stderr


def test_records_carry_the_pieces(seed, monkeypatch):
    """The records of a split op's tasks carry (KS, KE, W, T) (stream_base.F_KS..F_SKT); a task of whole units
    (0, NKB, 0, 0); other tasks zeros. Stream-K tasks exist only on the tensor-core path."""
    from onekernel.exec.stream_records import records
    monkeypatch.setattr(stream_splitk, "SPLIT_K", "1")
    w = random_weights(CFGK, torch.bfloat16, "cpu", seed)
    for gemv in ("mma", "fma"):
        step = build_decode_step(CFGK, w, KVCache(CFGK, 2, 48, torch.bfloat16, "cpu"), tiling=Tiling(12, "fit"),
                                 gemv=gemv)
        plan = make_plan(step, 12)
        qrec, _ = records(plan)
        for row in qrec[:-1].tolist():
            t = row[sd.F_TASK.value]
            op = plan.graph.ops[plan.graph.tasks[t].op]
            got = tuple(row[f.value] for f in (sd.F_KS, sd.F_KE, sd.F_SKW, sd.F_SKT))
            assert got == plan.ksplit[t]
            if op.kind.name in ("qkv_rope", "gate_up") and gemv == "mma":
                assert got[2:] == (12, op.params["NKB"] * _units(op, plan))
            elif "NKB" in op.params:
                assert got == (0, op.params["NKB"], 0, 0)
            else:
                assert got == (0, 0, 0, 0)
        assert plan.consts["SPLITK"] == (gemv == "mma")


def _units(op, plan):
    rg = plan.consts["RG"]
    if op.kind.name == "gate_up":
        return -(-op.params["N"] // rg)
    return (op.params["HQ"] + 2 * op.params["HKV"]) * op.params["HD"] // rg
