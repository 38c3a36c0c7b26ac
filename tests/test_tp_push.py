"""The push all-reduce of the streaming megakernel at tensor-parallel size > 1 (dist/tp_megakernel.py, ``push=True``),
on the CPU: the pools' layout (``pool_layout``, ``bind_pools``: a slot per rank for every partial, n + 1 counter
sets), the address tables of ``exec.persistent.push_counters`` (every pushed row lands where its reader looks,
every signal in the counter its reader polls), a simulation of every rank's queues routed through those tables
(the reader's waits are met exactly by its producers on the peer, over three steps), and the refusals. The Gluon
kernel itself runs on GPUs only (scripts/tp_one_gpu.py on one, scripts/tp_check.py on several).
"""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from onekernel.dist.sharding import shard_config
from onekernel.dist.tp_megakernel import bind_pools, pool_layout, push_slot
from onekernel.errors import InputError
from onekernel.exec import stream_base as sd
from onekernel.exec.persistent import push_counters
from onekernel.exec.stream_plan import make_plan, task_bound
from onekernel.exec.stream_records import fingerprint, records, remote_wait_list
from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.tiling import Tiling

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


def _addr_index(counters):
    """absolute address -> (rank, index) of every counter"""
    return {c.data_ptr() + 4 * i: (r, i) for r, c in enumerate(counters) for i in range(c.numel())}


@pytest.mark.parametrize("gemv", ["fma", "mma"])
def test_push_routing_runs_every_queue_and_meets_waits_only_after_their_producers(gemv):
    """Both ranks' queues, run through the push tables as the kernel does (a local wait on own[e], a remote wait on
    own + tab[peer] + e, a signal to own[sig] and, for F_SYS tasks, to own + tab[n + q] + sig of every peer q) in an
    adversarial order (rank 1 first): every task runs in each of three steps (monotonic counters), and every remote
    wait is met only once every producer of its event on that peer has run in this step."""
    n = 2
    graphs = [decode_graph(shard_config(CFG, n, r).config, 2, 48, torch.bfloat16, tiling=Tiling(W, "fit"),
                           tp=(r, n), gemv=gemv)[0] for r in range(n)]
    plans = [make_plan(SimpleNamespace(graph=g, batch=2, device=torch.device("cpu")), W) for g in graphs]
    assert fingerprint(plans[0], (("PUSH", True),)) != fingerprint(plans[0], (("PUSH", False),))
    _, _, counters, _, _ = _bound(graphs, True, task_bound(graphs[0], W))
    ne = plans[0].events.n_events
    tabs = [push_counters(counters, r, ne, 2, "cpu")[1].tolist() for r in range(n)]
    where = _addr_index(counters)
    mem = [c.tolist() for c in counters]

    def at(r, off):  # the counter at rank r's counters + off (int32 elements), as the kernel addresses it
        return where[counters[r].data_ptr() + 4 * off]

    q_tabs = []
    for p in plans:
        qrec, wl = records(p)
        q_tabs.append((qrec.tolist(), wl.tolist(), remote_wait_list(p).tolist(), p.schedule.queues))
    for epoch in (1, 2, 3):
        ran = [set() for _ in range(n)]
        pos = [[0] * W for _ in range(n)]
        offs = [[0] + [sum(len(q) for q in q_tabs[r][3][:w + 1]) for w in range(W)] for r in range(n)]
        progress = True
        while progress:
            progress = False
            for r in (1, 0):
                qrec, wl, rwl, queues = q_tabs[r]
                for w in range(W):
                    while pos[r][w] < len(queues[w]):
                        row = qrec[offs[r][w] + pos[r][w]]
                        ok = all(mem[r][e] >= x * epoch for e, x in wl[row[sd.F_WB.value]:row[sd.F_WE.value]])
                        remote = []
                        if row[sd.F_KIND.value] == sd.K_ALLREDUCE.value:
                            remote = rwl[row[sd.F_RWB.value]:row[sd.F_RWE.value]]
                            ok = ok and all(mem[rr][i] >= x * epoch for e, x, p in remote
                                            for rr, i in [at(r, tabs[r][p] + e)])
                        if not ok:
                            break
                        for e, _, p in remote:
                            assert set(plans[p].events.producers[e]) <= ran[p], (r, e, p)
                        sig = row[sd.F_SIGNAL.value]
                        if sig >= 0:
                            mem[r][sig] += 1
                            if row[sd.F_SYS.value]:
                                for q in range(n):
                                    if q != r:
                                        rr, i = at(r, tabs[r][n + q] + sig)
                                        assert rr == q
                                        mem[rr][i] += 1
                        ran[r].add(row[sd.F_TASK.value])
                        pos[r][w] += 1
                        progress = True
        left = [sum(len(q) for q in q_tabs[r][3]) - sum(pos[r]) for r in range(n)]
        assert left == [0, 0], f"step {epoch}: tasks left per rank {left}"


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
