"""Regions, dependency derivation (against a brute-force oracle), events, topological order, critical path."""
import random
from types import SimpleNamespace

import pytest
import torch

from onekernel.graph.deps import derive_dependencies, derive_events, derive_op_events, transitive_reduction
from onekernel.graph.paths import critical_path, summary, topological_order
from onekernel.graph.ir import Graph, Op, Region, Task


def K(name):
    """A stand-in op kind: the graph layer reads nothing of a kind but its name."""
    return SimpleNamespace(name=name)


def oracle_deps(graph):
    """O(n^2) reference: RAW, WAR and WAW against every earlier task, with Region.overlaps."""
    out = []
    for c, tc in enumerate(graph.tasks):
        s = []
        for p in range(c):
            tp = graph.tasks[p]
            raw = any(r.overlaps(w) for r in tc.reads for w in tp.writes)
            war_waw = any(w.overlaps(x) for w in tc.writes for x in (*tp.reads, *tp.writes))
            if raw or war_waw:
                s.append(p)
        out.append(s)
    return out


def closure(deps):
    reach = []
    for ds in deps:
        s = set(ds)
        for d in ds:
            s |= reach[d]
        reach.append(s)
    return reach


def chain_graph(sizes, kinds=None):
    """A graph of ops with ``sizes[i]`` tasks each and no regions (deps are supplied by the test)."""
    g = Graph()
    for i, k in enumerate(sizes):
        kind = K(kinds[i] if kinds else f"k{i % 3}")
        g.add_op(Op(f"op{i}", kind, {}, {}), [Task(0, j, (), (), bytes=j + 1) for j in range(k)])
    return g


def random_dag(rng, n, p_edge=None, program_order=True):
    """Deps of a random DAG on n tasks (edges from earlier to later ids, or relabelled at random)."""
    p = p_edge if p_edge is not None else rng.choice([0.0, 0.02, 0.1, 0.4])
    deps = []
    for c in range(n):
        ds = {q for q in range(c) if rng.random() < p}
        if c and rng.random() < 0.5:
            ds.add(rng.randrange(max(0, c - 4), c))
        deps.append(sorted(ds))
    if program_order:
        return deps
    perm = list(range(n))
    rng.shuffle(perm)
    out = [[] for _ in range(n)]
    for c, ds in enumerate(deps):
        out[perm[c]] = sorted(perm[d] for d in ds)
    return out


def random_region_graph(rng):
    g = Graph()
    names = []
    for b in range(rng.randint(1, 4)):
        shape = tuple(rng.randint(1, 12) for _ in range(rng.randint(1, 3)))
        g.add_buffer(f"b{b}", shape, torch.float32, rng.choice(["activation", "weight", "kv", "scratch"]))
        names.append(f"b{b}")

    def region():
        buf = g.buffers[rng.choice(names)]
        box = []
        for s in buf.shape:
            lo = rng.randrange(s)
            box.append((lo, rng.randint(lo + 1, s)))
        return Region(buf.name, tuple(box))

    for o in range(rng.randint(1, 8)):
        tasks = [Task(0, j, tuple(region() for _ in range(rng.randint(0, 3))),
                      tuple(region() for _ in range(rng.randint(0, 2))), bytes=rng.randint(0, 100))
                 for j in range(rng.randint(1, 10))]
        g.add_op(Op(f"op{o}", K(rng.choice(["gemv", "norm", "attn"])), {}, {}), tasks)
    return g


@pytest.mark.parametrize("a,b,expect", [
    (((0, 4),), ((4, 8),), False),             # half-open: touching is not overlapping
    (((0, 5),), ((4, 8),), True),
    (((0, 4), (0, 4)), ((2, 6), (4, 8)), False),  # overlap in dim 0 only
    (((0, 4), (0, 4)), ((2, 6), (3, 8)), True),
    (((1, 2), (0, 9), (3, 4)), ((0, 3), (8, 9), (3, 5)), True),
    (((0, 9),), ((2, 3),), True),              # containment
])
def test_region_overlap(a, b, expect):
    assert Region("x", a).overlaps(Region("x", b)) is expect
    assert Region("x", b).overlaps(Region("x", a)) is expect
    assert not Region("x", a).overlaps(Region("y", a))


def test_small_graph_dependencies():
    g = Graph()
    g.add_buffer("x", (2, 8), torch.float32, "activation")
    g.add_buffer("w", (8, 8), torch.float32, "weight")
    g.add_buffer("y", (2, 8), torch.float32, "activation")
    X = lambda lo, hi: Region("x", ((0, 2), (lo, hi)))  # noqa: E731
    Y = lambda lo, hi: Region("y", ((0, 2), (lo, hi)))  # noqa: E731
    W = Region("w", ((0, 8), (0, 8)))
    g.add_op(Op("embed", K("embed"), {}, {}), [Task(0, i, (), (X(4 * i, 4 * i + 4),)) for i in range(2)])   # 0, 1
    g.add_op(Op("gemv", K("gemv"), {}, {}), [Task(0, i, (X(0, 8), W), (Y(4 * i, 4 * i + 4),))
                                          for i in range(2)])                                        # 2, 3
    g.add_op(Op("add", K("add"), {}, {}), [Task(0, i, (X(4 * i, 4 * i + 4), Y(4 * i, 4 * i + 4)),
                                               (X(4 * i, 4 * i + 4),)) for i in range(2)])           # 4, 5
    g.add_op(Op("gemv2", K("gemv"), {}, {}), [Task(0, 0, (X(0, 8), W), (Y(0, 2),))])                     # 6
    full = derive_dependencies(g, full=True)
    assert full == [[], [], [0, 1], [0, 1], [0, 2, 3], [1, 2, 3], [0, 1, 2, 4, 5]]  # WAR: 4, 5 after 2, 3
    assert full == oracle_deps(g)
    deps = derive_dependencies(g)  # last writer / readers since: 6 needs only 4 and 5
    assert deps == [[], [], [0, 1], [0, 1], [0, 2, 3], [1, 2, 3], [4, 5]]
    assert transitive_reduction(full) == transitive_reduction(deps) == [[], [], [0, 1], [0, 1], [2, 3], [2, 3], [4, 5]]
    assert topological_order(g, deps) == list(range(7))
    assert critical_path(g, deps, [1] * 7) == (4, [0, 2, 4, 6])
    s = summary(g, deps, derive_events(g, deps))
    assert "gemv" in s and "dependency edges: 12" in s and "longest dependency chain: 4 tasks" in s
    assert "weights 768" in s  # 3 reads of the 8x8 fp32 weight


@pytest.mark.parametrize("seed", range(150))
def test_random_region_graphs_match_oracle(seed):
    g = random_region_graph(random.Random(seed))
    oracle = oracle_deps(g)
    assert derive_dependencies(g, full=True) == oracle
    deps = derive_dependencies(g)
    assert all(set(d) <= set(o) for d, o in zip(deps, oracle))  # only real conflicts ...
    assert closure(deps) == closure(oracle)  # ... and the same ordering
    red = transitive_reduction(deps)
    assert closure(red) == closure(oracle) and red == transitive_reduction(oracle)
    assert all(set(r) <= set(d) for r, d in zip(red, deps))


def check_events(ev, deps, exact):
    n = len(deps)
    assert len(ev.signal) == n and len(ev.waits) == n
    for e, ps in enumerate(ev.producers):
        assert ev.expected[e] == len(ps) > 0
        assert all(ev.signal[p] == e for p in ps)
    assert sum(len(ps) for ps in ev.producers) == sum(s >= 0 for s in ev.signal)
    for c, ws in enumerate(ev.waits):
        assert ws == sorted(set(ws))
        got = set().union(*(ev.producers[e] for e in ws)) if ws else set()
        if exact:
            assert got == set(deps[c])
        else:
            assert got >= set(deps[c]) and all(p < c for p in got)
    a = ev.arrays()
    assert a["wait_ptr"].dtype == torch.int32 and a["wait_ptr"][-1] == ev.n_waits
    for c in range(n):
        assert a["wait_ids"][a["wait_ptr"][c]:a["wait_ptr"][c + 1]].tolist() == ev.waits[c]


@pytest.mark.parametrize("seed", range(300))
def test_events_random_dags(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 120)
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.randint(1, 12))
    sizes[-1] -= sum(sizes) - n
    g = chain_graph(sizes)
    deps = random_dag(rng, n, program_order=seed % 3 != 0)
    ev = derive_events(g, deps)
    check_events(ev, deps, exact=True)
    consumers = {}
    for c, ds in enumerate(deps):
        for p in ds:
            consumers.setdefault(p, set()).add(c)
    for ps in ev.producers:  # producers of one event share one consumer set; different events differ
        assert len({frozenset(consumers[p]) for p in ps}) == 1
    assert len({frozenset(consumers[ps[0]]) for ps in ev.producers}) == ev.n_events
    if seed % 3 != 0:
        check_events(derive_op_events(g, deps), deps, exact=False)


def test_op_events_segments_same_op():
    g = chain_graph([4, 2])
    deps = [[], [], [1], [], [0, 3], []]  # task 2 depends on task 1 of its own op
    ev = derive_op_events(g, deps)
    check_events(ev, deps, exact=False)
    assert ev.producers == [[0, 1], [2, 3]] and ev.waits == [[], [], [0], [], [0, 1], []]


def test_topological_order_cycle():
    g = chain_graph([3])
    with pytest.raises(ValueError, match="cycle"):
        topological_order(g, [[2], [0], [1]])
    assert topological_order(g, [[1], [], [0]]) == [1, 0, 2]


def test_large_graph_runs():
    """A decode-like graph of ~6k tasks (shared residual buffer, layer chains) derives and summarises."""
    g = Graph()
    D, L, T = 512, 12, 32
    g.add_buffer("x", (1, D), torch.float32, "activation")
    g.add_buffer("h", (1, D), torch.float32, "activation")
    for i in range(L):
        g.add_buffer(f"w{i}", (D, D), torch.float32, "weight")
        for k in range(8):
            g.add_op(Op(f"norm{i}.{k}", K("norm"), {}, {}), [Task(0, 0, (Region("x", ((0, 1), (0, D))),),
                                                                (Region("h", ((0, 1), (0, D))),))])
            s = D // T
            g.add_op(Op(f"gemv{i}.{k}", K("gemv"), {}, {}), [
                Task(0, j, (Region("h", ((0, 1), (0, D))), Region(f"w{i}", ((j * s, j * s + s), (0, D)))),
                     (Region("x", ((0, 1), (j * s, j * s + s))),), bytes=s * D * 4) for j in range(T)])
    deps = derive_dependencies(g)
    red = transitive_reduction(deps)
    assert red[L * 8 * (T + 1) - 1] == [L * 8 * (T + 1) - T - 1]  # last gemv tile waits only on the last norm
    ev = derive_events(g, red)
    assert ev.n_events <= 2 * len(g.ops)
    assert "longest dependency chain: 192 tasks" in summary(g, red, ev)
