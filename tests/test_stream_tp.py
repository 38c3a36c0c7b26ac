"""The streaming (Gluon) megakernel at tensor-parallel size 2, on the CPU: its plan (exec/stream_plan.py) of each
rank's TP graph (``decode_graph(tp=(rank, 2))``), the records' remote waits and system-scope signals, the
identity of the ranks' plans, a two-rank simulation of the queues (no cross-rank deadlock), the backend choice
of dist/tp_megakernel.py, and the sm_90a compile of the TP kernel. The Gluon kernel runs on GPUs only
(scripts/tp_check.py --modes megakernel-gluon).
"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from onekernel.dist.sharding import shard_config
from onekernel.errors import InputError
from onekernel.exec import stream_base as sd
from onekernel.exec.stream_pack import arg_table, scratch_tensors
from onekernel.exec.stream_plan import make_plan, task_bound
from onekernel.exec.stream_records import fingerprint, records, remote_wait_list
from onekernel.graph.deps import merged_dependencies
from onekernel.graph.schedule import validate
from onekernel.models.config import get_config
from onekernel.models.decode_graph import build_decode_step, decode_graph
from onekernel.models.random_init import random_weights
from onekernel.ops.tiling import Tiling
from onekernel.runtime.kv_cache import KVCache
from stream_sim import PullRouting, simulate

ROOT = Path(__file__).resolve().parents[1]
# every local size even across 2 ranks; K of 64 / 128 / 192 (256-column chunks, zero padded), 32-row groups
CFG = dataclasses.replace(get_config("tiny"), name="stream-tp-test", vocab_size=300, dim=128, n_heads=4, n_kv_heads=2,
                          head_dim=64, ffn_dim=384)
W = 8


def _plan(rank, batch=2, gemv=None):
    local = shard_config(CFG, 2, rank).config
    g, _, _ = decode_graph(local, batch, 48, torch.bfloat16, tiling=Tiling(W, "fit"), tp=(rank, 2), gemv=gemv)
    return g, make_plan(SimpleNamespace(graph=g, batch=batch, device=torch.device("cpu")), W)


def _positions(plan):
    return [t for q in plan.schedule.queues for t in q]


@pytest.mark.parametrize("gemv", ["fma", "mma"])
def test_records_carry_remote_waits_of_every_allreduce_task_and_only_those(gemv):
    """On either GEMV body (MMA: the tensor-core one, the same tasks and records): every all-reduce task waits
    remotely on exactly the peer's re-tiled producers of its columns (the same ids on every rank), its record points
    at them; no other task has a remote wait; F_SYS is set exactly on the producers of remotely read events; F_RES
    says whether the residual is added (not for embed.ar)."""
    g0, plan = _plan(0, gemv=gemv)
    g, ev = plan.graph, plan.events
    assert plan.consts["TP"] and plan.consts["NR"] == 2 and plan.consts["MMA"] == (gemv == "mma")
    qrec, wl = records(plan)
    rwl = remote_wait_list(plan).tolist()
    peers = g.meta["peers"]
    n_ar = 0
    for row, t in zip(qrec[:-1].tolist(), _positions(plan)):
        task = g.tasks[t]
        op = g.ops[task.op]
        sig = ev.signal[t]
        assert row[sd.F_SYS.value] == int(sig >= 0 and ev.sys_signal[sig])
        if op.kind.name != "allreduce":
            assert ev.remote_waits[t] == [], op.name
            continue
        n_ar += 1
        assert row[sd.F_KIND.value] == sd.K_ALLREDUCE.value
        assert row[sd.F_RES.value] == int(op.name != "embed.ar")
        got = rwl[row[sd.F_RWB.value]:row[sd.F_RWE.value]]
        assert got and got == [[e, ev.expected[e], p] for p, e in ev.remote_waits[t]]
        # the producers, found again from the regions: writers of the peer buffer's source rows, on rank 1
        (name,) = [r.buffer for r in task.reads if r.buffer in peers]
        peer, src = peers[name]
        cols = task.writes[0].box
        writers = [w.id for w in g.tasks if w.id < t and any(
            r.buffer == src and all(a < d and c < b for (a, b), (c, d) in zip(r.box, cols)) for r in w.writes)]
        assert peer == 1 and writers
        assert sorted({e for _, e in ev.remote_waits[t]}) == sorted({ev.signal[w] for w in writers})
        for e in {e for _, e in ev.remote_waits[t]}:  # an event read remotely has only those producers
            assert set(ev.producers[e]) <= set(writers)
    assert n_ar == sum(len(op.task_ids) for op in g.ops if op.kind.name == "allreduce") > 0
    assert sum(r[sd.F_RWE.value] - r[sd.F_RWB.value] for r, t in zip(qrec[:-1].tolist(), _positions(plan))
               if g.tasks[t].op in {o.index for o in g.ops if o.kind.name == "allreduce"}) == len(rwl)
    remote_events = {e for rw in ev.remote_waits for _, e in rw}
    assert {e for e, s in enumerate(ev.sys_signal) if s} == remote_events
    assert len(g.tasks) <= task_bound(g0, W) and ev.n_events <= task_bound(g0, W)
    validate(plan.schedule, g, merged_dependencies(
        [[p for e in ws for p in ev.producers[e]] for ws in ev.waits],
        [[(p, d) for p, e in rw for d in ev.producers[e]] for rw in ev.remote_waits]))


def test_both_ranks_build_the_same_plan():
    """Same tasks, queues, events, records and constants on both ranks (fingerprints equal); the remote wait
    lists differ only in the peer rank; a plan of another worker count has another fingerprint."""
    _, p0 = _plan(0)
    _, p1 = _plan(1)
    assert fingerprint(p0) == fingerprint(p1)
    q0, w0 = records(p0)
    q1, w1 = records(p1)
    assert torch.equal(q0, q1) and torch.equal(w0, w1)
    r0, r1 = remote_wait_list(p0), remote_wait_list(p1)
    assert torch.equal(r0[:, :2], r1[:, :2])
    assert set(r0[:, 2].tolist()) == {1} and set(r1[:, 2].tolist()) == {0}
    assert p0.consts == p1.consts
    local = shard_config(CFG, 2, 0).config
    g, _, _ = decode_graph(local, 2, 48, torch.bfloat16, tiling=Tiling(W, "fit"), tp=(0, 2))
    other = make_plan(SimpleNamespace(graph=g, batch=2, device=torch.device("cpu")), W - 1)
    assert fingerprint(other) != fingerprint(p0)


@pytest.mark.parametrize("gemv", ["fma", "mma"])
@pytest.mark.parametrize("order", [(1, 0), (0, 1), 1, 2, 3])  # an int: random bursts with that seed
def test_two_ranks_run_their_queues_to_the_end(gemv, order):
    """Simulate both ranks' workers (tests/stream_sim.py: a position runs once its local waits and its remote waits
    on the peer's own counters are met, then signals; a rank starts its next step as soon as its own ends) for
    three steps (monotonic counters), in an adversarial order (one rank always served first, or seeded random
    bursts of one rank),
    on both GEMV paths: every task of both ranks runs (no cross-rank wait cycle), and every all-reduce reads its
    peer's rows of its own step, even while that peer runs a step ahead."""
    plans = [_plan(r, gemv=gemv)[1] for r in range(2)]
    routing = PullRouting(2, plans[0].events.n_events)
    simulate(plans, routing, **({"seed": order} if isinstance(order, int) else {"order": order}))
    assert all(c == routing.mem[0] for c in routing.mem) and max(routing.mem[0]) > 0


def test_allreduce_argument_table_holds_the_ranks_in_order(seed):
    """argtab row of an all-reduce: in0..in7 = rank 0's and rank 1's partials (this rank's own buffer at its
    rank, the peer's mapping at the other; unused slots repeat in0), then res and out."""
    rank = 1
    local = shard_config(CFG, 2, rank).config
    w = random_weights(local, torch.bfloat16, "cpu", seed)
    step = build_decode_step(local, w, KVCache(local, 1, 48, torch.bfloat16, "cpu"), tiling=Tiling(W, "fit"),
                             tp=(rank, 2))
    plan = make_plan(step, W)
    g = plan.graph
    bases = {dt: torch.zeros(8, dtype=dt) for dt in (torch.bfloat16, torch.float32, torch.int32)}
    tensors = dict(step.tensors, **scratch_tensors(plan, "cpu"))
    tab = arg_table(plan, tensors, bases)
    op = next(o for o in g.ops if o.name == "down.0.ar")
    ptr = [int(tab[op.index, j]) * 16 + bases[torch.bfloat16].data_ptr() for j in range(10)]
    want = ["peer0.down.0.out", "down.0.out"] + ["peer0.down.0.out"] * 6 + [op.args["res"], "down.0.ar.out"]
    assert ptr == [tensors[n].data_ptr() for n in want]
    assert op.args["res"] == "o_proj.0.ar.out"


def test_tp_runner_backend_choice():
    """dist/tp_megakernel.py: the default is "auto" (the streaming kernel where the model takes it; both backends
    ran on two H200s in run 8); off a GPU every backend but an explicit "gluon" is "triton"; options of one
    backend refuse the other."""
    from onekernel.dist import tp_megakernel as tpm

    assert tpm.DEFAULT_BACKEND == "auto"
    pick = tpm.TPMegakernelRunner._pick
    assert pick("auto", None, True, {}, None, 8) == "triton"
    assert pick("triton", None, True, {}, 5, 8) == "triton"
    with pytest.raises(InputError, match="wait_ms"):
        pick("triton", None, True, {"wait_ms": 5}, None, 8)
    _, plan = _plan(0)
    step = SimpleNamespace(graph=plan.graph, batch=2, device=torch.device("cpu"))
    with pytest.raises(InputError, match="CUDA device"):
        pick("gluon", step, False, {}, None, 8)


def test_tp_runner_auto_profiles_on_the_streaming_kernel(monkeypatch):
    """"auto" with profile=True takes the streaming kernel where it takes it without (its TP stamps hold the local
    waits apart: profile.tp_trace.stream_rows); a Triton-only option still makes it "triton", and a Gluon-only one
    beside it is still refused. The Hopper check is the only part of the decision that needs a GPU: it passes here."""
    from onekernel.dist import tp_megakernel as tpm
    from onekernel.exec import stream_support

    monkeypatch.setattr(stream_support, "unsupported_device", lambda dev: None)
    g, _ = _plan(0, gemv="mma")
    step = SimpleNamespace(graph=g, batch=2, device=torch.device("cpu"))
    pick = tpm.TPMegakernelRunner._pick
    assert pick("auto", step, False, {}, None, W) == "gluon"
    assert pick("auto", step, False, {"profile": True}, None, W) == "gluon"
    assert pick("gluon", step, False, {"profile": True}, None, W) == "gluon"
    assert pick("auto", step, False, {"profile": True, "comm_workers": 2}, None, W) == "triton"
    with pytest.raises(InputError, match="wait_ms"):
        pick("auto", step, False, {"profile": True, "comm_workers": 2, "wait_ms": 5}, None, W)
    assert pick("auto", step, True, {"profile": True}, None, W) == "triton"  # off a GPU: the interpreter's


def test_tp_kernel_compiles_for_sm90_with_system_scope_waits():
    """scripts/tp_compile_check.py --backend gluon on Llama-3.2-1B rank 0 of 2, on the model's GEMV path (the
    ranks' default: tensor cores): at most 16 bytes of spills (as the TP=1 kernels), none inside the loops with
    tensor-core instructions (scripts/sass_loops.py), mma.sync in the PTX, and the TP kernel's PTX has
    ld.acquire.sys, a system-scope release, the all-reduce's volatile 16-bit loads; the TP=1 kernel of the same
    shard none of them."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, str(ROOT / "scripts/tp_compile_check.py"), "llama-3.2-1b", "1",
                          "--backend", "gluon"], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "stream_tp2_mma" in out.stdout and "ld.global.acquire.sys x0" in out.stdout
    assert out.stdout.count("(0 spill instructions in HMMA loops)") == 2, out.stdout


def test_tp_compile_check_refuses_bad_command_lines_with_one_line_and_status_2():
    """scripts/tp_compile_check.cli before anything compiles: an unknown model, a TP size that does not divide the
    heads (naming the valid sizes) or is below 2, a batch that is not an integer >= 1 (a superscript digit passes
    str.isdigit but not int), a flag without its value, --push without the streaming backend and a stray argument
    each give status 2 and one line naming the problem (one subprocess, cli() per command line)."""
    cases = [(["nosuch", "1"], "unknown model config 'nosuch'"),
             (["llama-3.2-1b", "1", "--tp", "3"], "valid TP sizes for this model: 1, 2, 4, 8"),
             (["llama-3.2-1b", "x"], "BATCH takes an integer >= 1 and --tp one >= 2, got 'x'"),
             (["llama-3.2-1b", "1", "--tp"], "--tp needs a value"),
             (["llama-3.2-1b", "1", "--push"], "--push needs --backend gluon"),
             (["llama-3.2-1b", "1", "--bogus"], "unexpected arguments ['--bogus']"),
             (["llama-3.2-1b", "1", "--tp", "1"], "--tp one >= 2, got '1' and '1'"),
             (["llama-3.2-1b", "\u00b2"], "BATCH takes an integer >= 1"),
             (["llama-3.2-1b", "-1"], "BATCH takes an integer >= 1")]
    code = ("import contextlib, io, json, sys; sys.path[:0] = [sys.argv[1]]; import tp_compile_check as t\n"
            "out = []\n"
            "for argv in json.loads(sys.argv[2]):\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        out.append([t.cli(argv), err.getvalue()])\n"
            "print(json.dumps(out))")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts"), json.dumps([c for c, _ in cases])],
                       capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for (argv, why), (rc, err) in zip(cases, json.loads(r.stdout.strip().splitlines()[-1])):
        assert rc == 2 and why in err and err.count("\n") == 1, (argv, rc, err)


def test_oneshot_kernel_compiles_for_sm90_once_for_every_rank():
    """scripts/tp_compile_check.py --oneshot --tp 4: the kernel modes' one-shot all-reduce kernel (dist/tp_oneshot.py)
    of every rank of Llama-3.2-1B, without and with PDL, has the flag posts (system-scope release exchange), the
    acquire polls and one volatile 16-bit load per rank's partial (B = 1), and the same PTX on every rank."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, str(ROOT / "scripts/tp_compile_check.py"), "llama-3.2-1b", "1", "--oneshot",
                          "--tp", "4"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if "_oneshot_tp4_rank" in ln]
    assert len(lines) == 8 and all("ld.volatile.global.b16 x4" in ln and "atom.sys.release.exch x0" not in ln for ln in lines), lines


def test_error_word_layout_is_the_triton_megakernels():
    """The streaming kernel's remote slot and stop code are the Triton kernel's, so ``PersistentRunner.check()``
    reads both the same way (the remote failure first)."""
    from onekernel.exec import mk_device

    assert int(sd.ERR_RSLOT) == int(mk_device.ERR_RSLOT) and int(sd.ERR_STOP) == int(mk_device.ERR_STOP)
    assert int(sd.ERR_RSLOT) >= 5


def test_qwen3_shards_stream_whole_heads():
    """Qwen3 at TP = 2 on the tensor cores: each rank's shard streams (its step is supported), every qkv task holds
    whole heads of the rank's heads (the q/k RMSNorm pass sums a head: stream_epilogue.qk_norm_head), QKN and TP are
    both on, and both ranks build the same plan (fingerprints equal)."""
    from onekernel.exec.stream_support import unsupported_graph

    cfg = dataclasses.replace(CFG, name="stream-tp-qwen3", qk_norm=True)
    plans = []
    for rank in (0, 1):
        local = shard_config(cfg, 2, rank).config
        g, _, _ = decode_graph(local, 2, 48, torch.bfloat16, tiling=Tiling(W, "fit"), tp=(rank, 2), gemv="mma")
        assert unsupported_graph(g, 2) is None
        p = make_plan(SimpleNamespace(graph=g, batch=2, device=torch.device("cpu")), W)
        assert p.consts["QKN"] and p.consts["TP"]
        ch = local.head_dim // p.consts["RG"]
        qkv = [op for op in p.graph.ops if p.kinds[op.index] == sd.K_QKV.value]
        assert qkv and all(p.units[t][0] % ch == 0 and p.units[t][1] % ch == 0 for op in qkv for t in op.task_ids)
        plans.append(p)
    assert fingerprint(plans[0]) == fingerprint(plans[1])
