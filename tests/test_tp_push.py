"""The push all-reduce of the streaming megakernel at tensor-parallel size > 1 (dist/tp_megakernel.py, ``push=True``),
on the CPU: the pools' layout (``pool_layout``, ``bind_pools``: a slot per rank for every partial, n + 1 counter
sets), the address tables of ``exec.persistent.push_counters`` (every pushed row lands where its reader looks,
every signal in the counter its reader polls), a simulation of every rank's queues routed through those tables
(every wait met only by its producers on the peer, and every all-reduce reading the rows of its own step while
a peer runs a step ahead, over three steps), and the refusals. The Gluon
kernel itself runs on GPUs only (scripts/tp_one_gpu.py on one, scripts/tp_check.py on several).
"""
import dataclasses
from itertools import permutations
from types import SimpleNamespace

import pytest
import torch

from onekernel.dist.sharding import shard_config
from onekernel.dist.tp_megakernel import bind_pools, pool_layout, push_slot
from onekernel.errors import InputError
from onekernel.exec import stream_base as sd
from onekernel.exec.persistent import push_counters
from onekernel.exec.stream_plan import make_plan, task_bound
from onekernel.exec.stream_records import fingerprint, records
from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.tiling import Tiling
from stream_sim import simulate

CFG = dataclasses.replace(get_config("tiny"), name="stream-push-test", vocab_size=300, dim=128, n_heads=12,
                          n_kv_heads=6, head_dim=32, ffn_dim=384)  # every size divisible by 2 and 3
W = 8


def _graphs(n, batch=2):
    return [decode_graph(shard_config(CFG, n, r).config, batch, 48, torch.bfloat16, tiling=Tiling(W, "fit"),
                         tp=(r, n))[0] for r in range(n)]


def _bound(graphs, push, min_counters=0):
    """Every rank's pools (CPU, each its own allocation: real, unequal addresses) and bound tensors."""
    n = len(graphs)
    nbytes, n_counters, offsets = pool_layout(graphs[0], min_counters, n if push else 0)
    pools = [torch.full((nbytes + 64 * r,), 7, dtype=torch.uint8) for r in range(n)]  # stale bytes everywhere
    tensors = [{} for _ in range(n)]
    every = [bind_pools(g, t, pools, r, offsets, n_counters, push) for r, (g, t) in enumerate(zip(graphs, tensors))]
    assert all(c.data_ptr() == d.data_ptr() and c.numel() == d.numel() for e in every for c, d in zip(e, every[0]))
    return pools, tensors, every[0], n_counters, offsets


@pytest.mark.parametrize("n", [2, 3])
def test_pushed_rows_land_where_the_peers_read_them(n):
    """Rank r's partial X lives in its own pool at slot r; the element offset to rank q's pool
    (push_counters [2n:3n]) lands on exactly the bytes rank q reads as peer{r}.X; 0 only for itself. No two
    tensors of one pool overlap; every slot is poisoned (NaN) and every counter set zeroed."""
    graphs = _graphs(n)
    pools, tensors, counters, n_counters, offsets = _bound(graphs, True)
    assert all(c.numel() == n_counters * (n + 1) for c in counters)
    for r in range(n):
        assert int(counters[r].abs().sum()) == 0
        _, tab = push_counters(counters, r, n_counters, 2, "cpu")
        delta = tab[2 * n:].tolist()
        assert delta[r] == 0 and all(d != 0 for q, d in enumerate(delta) if q != r)
        for src in offsets:
            mine = tensors[r][src]
            assert mine.data_ptr() == pools[r].data_ptr() + push_slot(offsets, graphs[r].buffers, src, r)
            assert torch.isnan(mine.float()).all()
            for q in range(n):
                if q != r:
                    theirs = tensors[q][f"peer{r}.{src}"]
                    assert mine.data_ptr() + 2 * delta[q] == theirs.data_ptr()
                    assert theirs.shape == mine.shape and torch.isnan(theirs.float()).all()
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in
                       list(tensors[r].values()) + [counters[r]])
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "overlapping tensors in one pool"
        assert all(pools[r].data_ptr() <= a and b <= pools[r].data_ptr() + pools[r].numel() for a, b in spans)


@pytest.mark.parametrize("n", [2, 3])
def test_pull_binding_reads_the_peers_own_partials(n):
    """Pull (the default): peer{p}.X is rank p's own X in p's pool, one counter set per rank."""
    graphs = _graphs(n)
    pools, tensors, counters, n_counters, offsets = _bound(graphs, False)
    assert all(c.numel() == n_counters for c in counters)
    for r in range(n):
        for name, (p, src) in graphs[r].meta["peers"].items():
            assert tensors[r][name].data_ptr() == tensors[p][src].data_ptr()


def test_signals_reach_the_counters_the_readers_poll():
    """For every ordered pair of ranks: where rank p signals rank r (tab_p[n + r]) is the address where rank r's
    remote waits on p spin (tab_r[p]), inside r's own counters and in the receive set of p."""
    n = 3
    graphs = _graphs(n)
    _, _, counters, n_counters, _ = _bound(graphs, True)
    tabs = [push_counters(counters, r, n_counters, 2, "cpu")[1].tolist() for r in range(n)]
    for r in range(n):
        for p in range(n):
            if p != r:
                wait = counters[r].data_ptr() + 4 * tabs[r][p]
                assert wait == counters[p].data_ptr() + 4 * tabs[p][n + r]
                assert tabs[r][p] == n_counters * (1 + p)


class PushRouting:
    """The push all-reduce as the kernel addresses it (stream_sim's routing): a remote wait on peer p polls
    own + tab[p] + e, a signal adds to own[sig] and, for F_SYS tasks, to own + tab[n + q] + sig of every peer q;
    every address is resolved back to the (rank, index) of a real counter of ``counters`` (one allocation per
    rank), so a wrong table lands on another cell or on none (KeyError)."""
    push = True

    def __init__(self, counters, n_events):
        self.n, self.counters = len(counters), counters
        self.tabs = [push_counters(counters, r, n_events, 2, "cpu")[1].tolist() for r in range(self.n)]
        self.where = {c.data_ptr() + 4 * i: (r, i) for r, c in enumerate(counters) for i in range(c.numel())}
        self.mem = [c.tolist() for c in counters]

    def _at(self, r, off):
        return self.where[self.counters[r].data_ptr() + 4 * off]

    def wait_cell(self, r, p, e):
        return self._at(r, self.tabs[r][p] + e)

    def signal_cells(self, r, sig, sys):
        cells = [(r, sig)]
        if sys:
            cells += [self._at(r, self.tabs[r][self.n + q] + sig) for q in range(self.n) if q != r]
            assert [c[0] for c in cells[1:]] == [q for q in range(self.n) if q != r]
        return cells


@pytest.mark.parametrize("gemv", ["fma", "mma"])
@pytest.mark.parametrize("n,order", [(2, (1, 0)), (2, (0, 1)), (2, 1), (2, 2), *((3, o) for o in permutations(range(3))),
                                     (3, 1), (3, 2)])  # an int: random bursts with that seed
def test_push_routing_runs_every_queue_and_reads_each_steps_rows(gemv, n, order):
    """Every rank's queues, run through the push tables as the kernel does (PushRouting) for three steps in an
    adversarial order (tests/stream_sim.py: each rank order, or seeded random bursts of one rank; a rank starts its
    next step as soon as its own ends): every task runs (no wait cycle), and every all-reduce finds the pushed rows of its own
    step from every producer it waits on, never an older step (a wait met early) nor a newer one (a peer a step
    ahead pushing over rows not yet read)."""
    graphs = [decode_graph(shard_config(CFG, n, r).config, 2, 48, torch.bfloat16, tiling=Tiling(W, "fit"),
                           tp=(r, n), gemv=gemv)[0] for r in range(n)]
    plans = [make_plan(SimpleNamespace(graph=g, batch=2, device=torch.device("cpu")), W) for g in graphs]
    assert fingerprint(plans[0], (("PUSH", True),)) != fingerprint(plans[0], (("PUSH", False),))
    _, _, counters, _, _ = _bound(graphs, True, task_bound(graphs[0], W))
    routing = PushRouting(counters, plans[0].events.n_events)
    simulate(plans, routing, **({"seed": order} if isinstance(order, int) else {"order": order}))
    ne = plans[0].events.n_events
    assert all(m[:ne] == routing.mem[0][:ne] for m in routing.mem) and max(routing.mem[0]) > 0


@pytest.mark.parametrize("gemv", ["fma", "mma"])
def test_every_remotely_read_task_can_push_its_rows(gemv):
    """The kernel pushes only from the embed task and the residual-GEMV epilogue (stream_tasks.embed_task,
    stream_mma / stream_fma): every task whose signal a peer waits on (F_SYS) must be one of those, writing a buffer
    the peers mirror (else its rows would never reach them, or push_rows would write outside the pool), and no such
    plan has RMSNorm partials (that epilogue does not push; the runner refuses it)."""
    g = _graphs(2)[0] if gemv == "fma" else decode_graph(shard_config(CFG, 2, 0).config, 2, 48, torch.bfloat16,
                                                         tiling=Tiling(W, "fit"), tp=(0, 2), gemv="mma")[0]
    plan = make_plan(SimpleNamespace(graph=g, batch=2, device=torch.device("cpu")), W)
    sources = {src for _, src in g.meta["peers"].values()}
    qrec, _ = records(plan)
    flagged = 0
    for row in qrec[:-1].tolist():
        if row[sd.F_SYS.value]:
            flagged += 1
            op = plan.graph.ops[row[sd.F_OP.value]]
            assert row[sd.F_KIND.value] in (sd.K_EMBED.value, sd.K_RESID.value), op.name
            assert op.args["out"] in sources, op.name
    assert flagged > 0 and not plan.consts.get("NSS")


def test_push_is_refused_off_the_streaming_kernel():
    """push=True where the Triton megakernel runs (the interpreter here) is refused before any pool is touched;
    push must be a bool."""
    from onekernel.dist.sharding import ShardedModel
    from onekernel.dist.tp_megakernel import TPMegakernelRunner
    from onekernel.models.random_init import random_weights
    from onekernel.runtime.kv_cache import KVCache

    cfg = get_config("tiny")
    shard = shard_config(cfg, 2, 0)
    model = ShardedModel(shard.config, random_weights(shard.config, torch.float32, "cpu", 0), None, "tiny", shard)
    cache = KVCache(shard.config, 1, 8, torch.float32, "cpu")
    group = SimpleNamespace(shard=shard, config=cfg)
    with pytest.raises(InputError, match="streaming"):
        TPMegakernelRunner(model, cache, group, interpret=True, pools=[], push=True)
    with pytest.raises(InputError, match="push must be"):
        TPMegakernelRunner(model, cache, group, interpret=True, pools=[], push="yes")
    with pytest.raises(ValueError, match="push_ranks must be"):
        pool_layout(_graphs(2)[0], 0, True)
