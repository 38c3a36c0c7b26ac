"""Tensor parallel on the CPU, without running ranks: the all-reduce op against its reference, the remote waits of
the records and schedules (random graphs with cross-rank reads, simulated ranks), the cross-step check, the
reserved all-reduce workers, the refusals of bad TP options and the TP profile's breakdown. Two ranks end to end:
tests/test_tp_megakernel.py."""
import random

import pytest
import torch

from onekernel.exec.codegen import launch_op
from onekernel.exec.queue import build_queue
from onekernel.graph.deps import (check_cross_step, derive_dependencies, derive_events, derive_remote_dependencies,
                                  merged_dependencies, transitive_reduction)
from onekernel.graph.ir import Graph, Op, Region, Task
from onekernel.graph.schedule import critical_path_list, round_robin, validate
from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.allreduce import ALLREDUCE, add_allreduce, add_peer_buffer
from onekernel.ops.base import run_reference
from onekernel.ops.tiling import Tiling

# -- the all-reduce op ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, res, dt", [(2, True, torch.float32), (3, False, torch.float32),
                                        (3, True, torch.bfloat16), (4, True, torch.bfloat16),
                                        (8, True, torch.float32), (8, False, torch.bfloat16)])
def test_allreduce_op_matches_reference(n, res, dt, seed):
    """N ranks' partials simulated with plain buffers (rank 1's view: rank 0 and 2 are peers); every element of
    the kernel's output equals the reference and the plain formula round(res + p_0 + ... + p_{n-1}) (fp32, in
    order), bitwise; outputs start poisoned."""
    B, D = 3, 80
    g = Graph()
    own = g.add_buffer("x.out", (B, D), dt, "activation")
    parts = [own if p == 1 else add_peer_buffer(g, own, p) for p in range(n)]
    r = g.add_buffer("res", (B, D), dt, "activation") if res else None
    out = add_allreduce(g, "x.ar", parts, residual=r, tiling=Tiling(n_sm=4))
    assert g.ops[0].n_tiles > 1 and g.meta["peers"] == {f"peer{p}.x.out": (p, "x.out") for p in range(n) if p != 1}
    gen = torch.Generator().manual_seed(seed)
    t = {name: torch.randn(b.shape, generator=gen).to(b.dtype) for name, b in g.buffers.items()}
    t[out.name] = torch.full((B, D), float("nan"), dtype=dt)
    want = {k: v.clone() for k, v in t.items()}
    run_reference(g, want)
    launch_op(g, g.ops[0], t)
    acc = t["res"].float() if res else torch.zeros(B, D)
    for p in parts:
        acc = acc + t[p.name].float()
    assert torch.equal(t[out.name], want[out.name])
    assert torch.equal(t[out.name], acc.to(dt))


def test_allreduce_builder_refuses_bad_inputs():
    g = Graph()
    a = g.add_buffer("a", (2, 16), torch.float32, "activation")
    b = g.add_buffer("b", (2, 32), torch.float32, "activation")
    with pytest.raises(ValueError, match="one \\[B, D\\] shape"):
        add_allreduce(g, "ar", [a, b])
    with pytest.raises(ValueError, match="1..8 ranks"):
        add_allreduce(g, "ar", [a] * 9)


# -- remote dependencies, events, records ------------------------------------------------------------------
def _tp_graph(rank, n=2, vocab=256):
    import dataclasses

    cfg = dataclasses.replace(get_config("tiny"), vocab_size=vocab)
    g, _, _ = decode_graph(cfg, 2, 16, torch.float32, tiling=Tiling(132, "fit"), tp=(rank, n))
    return g


def test_tp_graph_has_allreduce_ops_and_remote_waits():
    """decode_graph(tp=(r, 2)): an all-reduce after embed, every o_proj and down, reading the peer's copy; every
    all-reduce task waits remotely on exactly the peer's producers of its columns (the same task ids), through
    sys-scope events; the records carry them; the two ranks' graphs have the same events and waits."""
    graphs = [_tp_graph(r) for r in range(2)]
    g = graphs[0]
    names = [op.name for op in g.ops]
    L = get_config("tiny").n_layers
    assert [n for n in names if n.endswith(".ar")] == ["embed.ar"] + [f"{p}.{i}.ar" for i in range(L)
                                                                      for p in ("o_proj", "down")]
    assert names.index("embed.ar") == names.index("embed") + 1
    deps = transitive_reduction(derive_dependencies(g))
    remote = derive_remote_dependencies(g)
    ev = derive_events(g, deps, remote)
    for op in g.ops:
        for t in op.task_ids:
            if op.kind is not ALLREDUCE:
                assert remote[t] == [] and ev.remote_waits[t] == []
                continue
            src = op.args["in0"]  # rank 0's own partial
            cols = g.tasks[t].writes[0].box[1]
            writers = [w.id for w in g.tasks if any(r.buffer == src and r.overlaps(Region(src, ((0, 2), cols)))
                                                    for r in w.writes)]
            assert writers and remote[t] == [(1, w) for w in writers]
            assert {e for _, e in ev.remote_waits[t]} == {ev.signal[w] for w in writers}
            assert all(ev.sys_signal[e] for _, e in ev.remote_waits[t])
    assert sum(ev.sys_signal) == len({e for rw in ev.remote_waits for _, e in rw})
    sched = critical_path_list(g, merged_dependencies(deps, remote), 4)
    qrec, wl, rwl = build_queue(g, sched, ev, [0] * len(g.ops), lambda task: (0, 0), remote=True)
    from onekernel.exec.queue import FIELDS
    f = {k: i for i, k in enumerate(FIELDS)}
    for row in qrec[:-1].tolist():
        t = row[f["task"]]
        got = rwl[row[f["rwait_begin"]]:row[f["rwait_end"]]].tolist()
        assert got == [[e, ev.expected[e], p] for p, e in ev.remote_waits[t]]
        assert row[f["signal_sys"]] == int(ev.signal[t] >= 0 and ev.sys_signal[ev.signal[t]])
    other = graphs[1]
    d1 = transitive_reduction(derive_dependencies(other))
    r1 = derive_remote_dependencies(other)
    e1 = derive_events(other, d1, r1)
    assert (e1.signal, e1.waits, e1.expected) == (ev.signal, ev.waits, ev.expected)
    assert [[e for _, e in rw] for rw in e1.remote_waits] == [[e for _, e in rw] for rw in ev.remote_waits]
    assert {p for rw in r1 for p, _ in rw} == {0}
    check_cross_step(g, deps, remote)


def test_oneshot_ops_declare_the_same_graph_on_every_rank():
    """dist/tp_oneshot.oneshot_ops turns every all-reduce of a TP graph into ALLREDUCE_ONESHOT with its flag, count,
    pdelta (N + 1: the peers' distances, then the rank) and error buffers; every rank's ops get the same parameters
    (the rank is data, so one compiled kernel serves all ranks), the flag entries are tiles x N per op; a rank outside
    0..N-1 is refused before the graph changes."""
    from onekernel.dist.tp_oneshot import oneshot_ops
    from onekernel.ops.allreduce import ALLREDUCE_ONESHOT

    cfg = get_config("tiny")
    n = 2
    graphs = [decode_graph(cfg, 2, 16, torch.float32, tiling=Tiling(4, "fit"), tp=(r, n))[0] for r in range(n)]
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        oneshot_ops(graphs[0], 2, 100)
    assert not any(op.kind is ALLREDUCE_ONESHOT for op in graphs[0].ops) and "oneshot.pdelta" not in graphs[0].buffers
    totals = [oneshot_ops(g, r, 100) for r, g in enumerate(graphs)]
    ar = [[op for op in g.ops if op.kind is ALLREDUCE_ONESHOT] for g in graphs]
    assert len(ar[0]) == 1 + 2 * cfg.n_layers and totals[0] == totals[1] == sum(op.n_tiles * n for op in ar[0])
    for a0, a1 in zip(*ar):
        assert a0.params == a1.params and "RANK" not in a0.params and a0.params["SPIN"] == 100
        assert graphs[0].buffers[a0.args["flags"]].shape == (a0.n_tiles * n,)
        assert graphs[0].buffers[a0.args["mine"]].shape == (a0.n_tiles + 1,)
    assert graphs[0].buffers["oneshot.pdelta"].shape == (n + 1,)


def test_cross_step_check_refuses_an_unsafe_graph():
    """embed + its all-reduce and nothing after: a rank's next-step embed could overwrite its partial while the
    peer still reads it (no remote wait orders them), so the check names the buffer and the peer."""
    from onekernel.ops.embed import add_embed

    g = Graph()
    tokens = g.add_buffer("tokens", (2,), torch.int32, "input")
    x = add_embed(g, "embed", tokens, g.add_buffer("table", (10, 64), torch.float32, "weight"), block_d=16)
    add_allreduce(g, "embed.ar", [x, add_peer_buffer(g, x, 1)], tiling=Tiling(4, "fit"))
    deps = transitive_reduction(derive_dependencies(g))
    with pytest.raises(ValueError, match="buffer 'embed.out': rank 1 may still read it"):
        check_cross_step(g, deps, derive_remote_dependencies(g))


def _random_tp_graph(rnd, n_ops=10, n_ranks=2, rank=0):
    """Random ops on [8, 32] buffers: each op reads 1-2 earlier buffers (random column boxes), some of them a
    peer's copy, and writes its own buffer in random column tiles."""
    g = Graph()
    bufs = [g.add_buffer("in", (8, 32), torch.float32, "activation")]
    g.add_op(Op("in", ALLREDUCE, {}, {}), [Task(-1, 0, (), (Region("in", ((0, 8), (0, 32))),))])
    for i in range(n_ops):
        out = g.add_buffer(f"b{i}", (8, 32), torch.float32, "activation")
        tiles = rnd.choice([1, 2, 4, 8])
        w = 32 // tiles
        tasks = []
        srcs = rnd.sample(bufs, min(len(bufs), rnd.randint(1, 2)))
        peer = rnd.random() < 0.5
        for t in range(tiles):
            reads = []
            for s in srcs:
                a = rnd.randrange(0, 32, 4)
                box = ((0, 8), (a, min(32, a + rnd.choice([4, 8, 16, 32]))))
                reads.append(Region(s.name, box))
                if peer:
                    for p in range(n_ranks):
                        if p != rank:
                            reads.append(Region(add_peer_buffer(g, s, p).name, box))
            tasks.append(Task(-1, t, tuple(reads), (Region(out.name, ((0, 8), (t * w, (t + 1) * w))),)))
        g.add_op(Op(f"op{i}", ALLREDUCE, {}, {}), tasks)
        bufs.append(out)
    return g


def _simulate(graphs, deps, remote, sched, rnd) -> bool:
    """Every rank runs the same schedule; a worker runs its next task when its local dependencies are done on its
    rank and its remote ones on the peers (random order of worker steps). True when every task finished."""
    n = len(graphs[0].tasks)
    done = [[False] * n for _ in graphs]
    pos = [[0] * sched.n_workers for _ in graphs]
    left = len(graphs) * n
    while left:
        ready = []
        for r in range(len(graphs)):
            for w, q in enumerate(sched.queues):
                if pos[r][w] < len(q):
                    t = q[pos[r][w]]
                    rem = remote[r][t]
                    if all(done[r][d] for d in deps[r][t]) and all(done[p][d] for p, d in rem):
                        ready.append((r, w, t))
        if not ready:
            return False
        r, w, t = rnd.choice(ready)
        done[r][t] = True
        pos[r][w] += 1
        left -= 1
    return True


def _naive_remote(g):
    """derive_remote_dependencies by its definition: every earlier writer of the peer buffer's source whose region
    overlaps the read (Region.overlaps), one pair per (peer, writer)."""
    peers = g.meta.get("peers") or {}
    out = []
    for t in g.tasks:
        deps = set()
        for r in t.reads:
            if r.buffer in peers:
                peer, src = peers[r.buffer]
                deps |= {(peer, w.id) for w in g.tasks[:t.id] for wr in w.writes
                         if wr.overlaps(Region(src, r.box))}
        out.append(sorted(deps))
    return out


@pytest.mark.parametrize("n_ranks", [2, 3, 8])
def test_remote_dependencies_equal_their_definition_on_rewritten_buffers(n_ranks, seed):
    """derive_remote_dependencies (vectorised, one overlap test per (source, box) until the source gets a new
    writer) against its definition on random graphs: two sources of 1-3 dimensions written again and again in random
    boxes (empty ones too), peer reads of repeated and fresh boxes between the writes, and tasks that read the peers'
    copies and write 1-3 regions of the sources themselves (their reads see only earlier writers)."""
    for i in range(20):
        rnd = random.Random(seed * 1000 + i)
        shape = tuple(rnd.choice([4, 6, 24]) for _ in range(rnd.randint(1, 3)))
        g = Graph()
        srcs = [g.add_buffer(f"s{k}", shape, torch.float32, "activation") for k in range(2)]
        mirrors = {(k, p): add_peer_buffer(g, s, p).name for k, s in enumerate(srcs) for p in range(1, n_ranks)}
        seen = [tuple((0, n) for n in shape)]

        def box():
            if rnd.random() < 0.4:
                return rnd.choice(seen)
            b = []
            for n in shape:
                lo = rnd.randint(0, n)
                b.append((lo, rnd.randint(lo, n) if rnd.random() < 0.1 else rnd.randint(min(lo + 1, n), n)))
            seen.append(tuple(b))
            return tuple(b)

        for j in range(12):
            tasks = []
            for t in range(rnd.randint(1, 4)):
                reads, writes = [], []
                if rnd.random() < 0.6:  # reads of the peers' copies of a source (sometimes of this rank's own too)
                    k, b = rnd.randrange(2), box()
                    reads = [Region(mirrors[(k, p)], b) for p in range(1, n_ranks) if rnd.random() < 0.8]
                    if rnd.random() < 0.3:
                        reads.append(Region(srcs[k].name, b))
                if not reads or rnd.random() < 0.4:  # writes of the sources, by the same task or another
                    writes = [Region(srcs[rnd.randrange(2)].name, box()) for _ in range(rnd.randint(1, 3))]
                tasks.append(Task(-1, t, tuple(reads), tuple(writes)))
            g.add_op(Op(f"op{j}", ALLREDUCE, {}, {}), tasks)
        got = derive_remote_dependencies(g)
        assert got == _naive_remote(g), i
        assert sum(map(len, got)) > 0


def test_remote_dependencies_refuse_a_box_of_the_wrong_rank():
    """A peer read (or a source write) whose box has not one (lo, hi) pair per dimension of its buffer is refused,
    not compared on the dimensions it shares (the vectorised test would otherwise broadcast it)."""
    for bad_read in (True, False):
        g = Graph()
        s = g.add_buffer("s", (2, 8), torch.float32, "activation")
        peer = add_peer_buffer(g, s, 1).name
        w = Region("s", ((0, 2),)) if not bad_read else Region("s", ((0, 2), (4, 8)))
        r = Region(peer, ((0, 2),)) if bad_read else Region(peer, ((0, 2), (0, 8)))
        g.add_op(Op("w", ALLREDUCE, {}, {}), [Task(-1, 0, (), (w,))])
        g.add_op(Op("r", ALLREDUCE, {}, {}), [Task(-1, 0, (r,), ())])
        with pytest.raises(ValueError, match="1 \\(lo, hi\\) pairs for a buffer of 2 dimensions"):
            derive_remote_dependencies(g)


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 8])
def test_random_cross_rank_graphs_schedule_and_run(n_ranks, seed):
    """Random graphs with cross-rank reads: the schedules built on the merged dependencies validate, and
    simulated ranks running them (remote waits on the peers' tasks) always finish; the ranks' events agree."""
    for i in range(12):
        rnd = random.Random(seed * 100 + i)
        graphs = [_random_tp_graph(random.Random(seed * 100 + i), n_ranks=n_ranks, rank=r) for r in range(n_ranks)]
        deps = [transitive_reduction(derive_dependencies(g)) for g in graphs]
        remote = [derive_remote_dependencies(g) for g in graphs]
        evs = [derive_events(g, d, rm) for g, d, rm in zip(graphs, deps, remote)]
        assert all((e.signal, e.expected) == (evs[0].signal, evs[0].expected) for e in evs)
        order = merged_dependencies(deps[0], remote[0])
        for policy in (critical_path_list, round_robin):
            sched = policy(graphs[0], order, rnd.randint(1, 5))
            validate(sched, graphs[0], order)
            for r in range(n_ranks):
                validate(sched, graphs[r], merged_dependencies(deps[r], remote[r]))
            assert _simulate(graphs, deps, remote, sched, rnd)


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 8])
def test_reserved_workers_schedule(n_ranks, seed):
    """SM reservation (``comm_workers``): on random cross-rank graphs and on tiny's TP graph, the tasks with
    remote waits run only on the last k workers and every other task on the others; the schedules validate on
    the merged dependencies of every rank and simulated ranks running them finish."""
    from onekernel.graph.schedule import reserved_critical_path

    cases = []
    for i in range(8):
        rnd = random.Random(seed * 100 + i)
        cases.append([_random_tp_graph(random.Random(seed * 100 + i), n_ranks=n_ranks, rank=r)
                      for r in range(n_ranks)])
    cases.append([_tp_graph(r, n=2) for r in range(2)] if n_ranks == 2 else cases[0])
    for graphs in cases:
        deps = [transitive_reduction(derive_dependencies(g)) for g in graphs]
        remote = [derive_remote_dependencies(g) for g in graphs]
        comm = [bool(r) for r in remote[0]]
        if not any(comm):
            continue
        order = merged_dependencies(deps[0], remote[0])
        for W, k in ((2, 1), (5, 2), (16, 4)):
            sched = reserved_critical_path(graphs[0], order, W, comm, k)
            for r in range(len(graphs)):
                validate(sched, graphs[r], merged_dependencies(deps[r], remote[r]))
            for w, q in enumerate(sched.queues):
                assert all(comm[t] == (w >= W - k) for t in q), (w, q)
            assert _simulate(graphs, deps, remote, sched, rnd)
            assert sched.queues == reserved_critical_path(graphs[0], order, W, comm, k).queues  # deterministic


def test_ar_tiles_and_comm_workers_refusals():
    """decode_graph(ar_tiles=n) gives every all-reduce n tiles; bad counts and TP=1 are refused; the runner
    refuses comm_workers on a graph without remote waits."""
    import dataclasses

    from onekernel.errors import InputError
    from onekernel.exec.megakernel import MegakernelRunner
    from onekernel.models.decode_graph import build_decode_step
    from onekernel.models.random_init import random_weights
    from onekernel.runtime.kv_cache import KVCache

    cfg = dataclasses.replace(get_config("tiny"), vocab_size=256)
    g, _, _ = decode_graph(cfg, 2, 16, torch.float32, tiling=Tiling(132, "fit"), tp=(0, 2), ar_tiles=4)
    ars = [op for op in g.ops if op.kind is ALLREDUCE]
    assert ars and all(op.n_tiles == 4 for op in ars)
    for bad in (3, 0, cfg.dim, cfg.dim // 2):
        with pytest.raises(InputError, match="ar_tiles"):
            decode_graph(cfg, 2, 16, torch.float32, tp=(0, 2), ar_tiles=bad)
    with pytest.raises(InputError, match="tp > 1 only"):
        decode_graph(cfg, 2, 16, torch.float32, ar_tiles=4)
    cache = KVCache(cfg, 1, 8, torch.float32, "cpu")
    bound = build_decode_step(cfg, random_weights(cfg, torch.float32, "cpu", 0), cache, tiling=Tiling(8, "fit"))
    with pytest.raises(InputError, match="comm_workers"):
        MegakernelRunner(bound, interpret=True, comm_workers=1)


def test_tp_profile_breakdown_and_png(tmp_path, seed):
    """Synthetic stamps of two ranks on tiny's TP graph (random task times, every task on a random SM; the
    all-reduce tiles with a random remote wait): the breakdown's sums equal the stamps' (remote waits only on the
    tasks with remote waits, all-reduce time only on allreduce tasks), stages and ops cover every op, and the PNG
    is written."""
    from onekernel.profile.tp_trace import layer_of, rank_breakdown, tp_timeline_png

    g = _tp_graph(0)
    remote = derive_remote_dependencies(g)
    rtasks = {t for t, r in enumerate(remote) if r}
    gen = torch.Generator().manual_seed(seed)
    profs, want = [], []
    for rank in range(2):
        n = len(g.tasks)
        start = torch.randint(0, 10_000, (n,), generator=gen) + 10**9 * (rank + 1)  # unsynchronised clocks
        lw = start + torch.randint(0, 500, (n,), generator=gen)
        rw = torch.tensor([int(torch.randint(1, 900, (1,), generator=gen)) if t in rtasks else 0 for t in range(n)])
        ready = lw + rw
        end = ready + torch.randint(1, 2000, (n,), generator=gen)
        sm = torch.randint(0, 16, (n,), generator=gen)
        p = torch.zeros(n, 8, dtype=torch.int64)
        p[:, 0], p[:, 1], p[:, 2], p[:, 3], p[:, 4] = start, ready, end, sm, lw
        profs.append(p)
        ar = torch.tensor([g.ops[t.op].kind is ALLREDUCE for t in g.tasks])
        want.append({"remote": float(rw.sum()) / 1e3, "ar_body": float((end - ready)[ar].sum()) / 1e3,
                     "local": float((lw - start).sum()) / 1e3, "span": float(end.max() - start.min()) / 1e3})
    for rank, p in enumerate(profs):
        b = rank_breakdown(g, p, rtasks)
        assert b["remote_wait_us"] == pytest.approx(want[rank]["remote"])
        assert b["allreduce_body_us"] == pytest.approx(want[rank]["ar_body"])
        assert b["local_wait_us"] == pytest.approx(want[rank]["local"])
        assert b["span_us"] == pytest.approx(want[rank]["span"])
        assert set(b["ops"]) == {op.name for op in g.ops}
        assert set(b["stages"]) == {layer_of(op.name) for op in g.ops} >= {"embed", "layer 0", "layer 1", "lm_head"}
        assert b["allreduce_tasks"] == sum(op.n_tiles for op in g.ops if op.kind is ALLREDUCE)
    png = tmp_path / "tp.png"
    tp_timeline_png(g, profs, rtasks, png, title="synthetic")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
