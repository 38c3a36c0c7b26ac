"""The megakernel at tensor-parallel size 2 end to end on the CPU: two ranks in the Triton interpreter over gloo with
shared-memory pools (tests/tp_mk_worker.py) against the TP=1 reference, a rank that never launches (the peer's
remote wait gives up, naming task, event and peer rank), and which timeout is reported when a local and a remote
wait both fail. The schedules, records and the all-reduce op alone: tests/test_tp_schedule.py."""
import random
import socket
import time

import pytest
import torch

from onekernel.models.config import get_config
from onekernel.ops.tiling import Tiling

pytestmark = pytest.mark.xdist_group("tp-ranks")  # one worker runs the TP ranks' tests (see tests/test_tp.py)


# -- two ranks end to end in the interpreter ---------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: dict, timeout: float = 300) -> None:
    import torch.multiprocessing as mp

    from onekernel.dist.tp_megakernel import shared_pools
    from tp_mk_worker import run

    pools = shared_pools(args["tp"], 1 << 20)
    ctx = mp.start_processes(run, args=({**args, "port": _free_port()}, pools), nprocs=args["tp"], join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise AssertionError(f"the ranks did not finish within {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


@pytest.mark.parametrize("gemv,mode", [(None, None), ("mma", None), (None, "eager")])
def test_tp2_megakernel_equals_tp1_reference(gemv, mode, seed, tmp_path):
    """Two ranks (spawned, gloo, the interpreter, one worker each, shared-memory pools) on ``tiny`` with an uneven
    253-row vocabulary (rank 1's shard padded to 127 rows), on the model's GEMV path (fp32: "fma") and the
    tensor-core one (gemv="mma": every GEMV adds ``residual.zero``, the all-reduce tiles the residual): every logit
    of prefill + 3 greedy steps within 1e-5 of the TP=1 reference's range, tokens equal where the top-2 margin is
    clear, rank 0's KV heads equal, and both ranks' reduced buffers (every ``*.ar.out``) bitwise equal. mode
    "eager": the same graph as separate kernels with the one-shot all-reduce kernels (dist/tp_oneshot.py: each
    tile meets its peers' at a flag barrier, then sums their rows)."""
    import dataclasses

    from test_tp import _reference

    cfg = dataclasses.replace(get_config("tiny"), vocab_size=253)
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(cfg.vocab_size) for _ in range(n)] for n in (4, 2)]
    steps = 3
    out = tmp_path / "mk"
    _spawn({"tp": 2, "vocab": 253, "seed": seed, "prompts": prompts, "steps": steps, "out": str(out), "gemv": gemv,
            "mode": mode})
    got = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
    assert got[0]["gemv"] == got[1]["gemv"] == (gemv or "fma")
    assert got[0]["reset"] is got[1]["reset"] is (True if mode else None)  # load_kernels left no count behind
    want_logits, want_tokens, cache = _reference(cfg, seed, prompts, steps)
    lg = got[0]["logits"]
    assert lg.shape == want_logits.shape == (steps + 1, 2, cfg.vocab_size)
    assert torch.isfinite(lg).all()
    scale = want_logits.abs().max()
    err = (lg - want_logits).abs().max() / scale
    assert err < 1e-5, f"TP=2 megakernel logits differ from the TP=1 reference by {err:.2e} of their range"
    assert torch.equal(got[0]["logits"], got[1]["logits"]) and torch.equal(got[0]["tokens"], got[1]["tokens"])
    top2 = want_logits.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 1e-4 * scale
    assert clear.float().mean() > 0.8
    assert torch.equal(got[0]["tokens"][clear], want_tokens[clear])
    hkv = cfg.n_kv_heads // 2
    torch.testing.assert_close(got[0]["k"], cache.k[:, :, :hkv], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1]["v"], cache.v[:, :, hkv:], rtol=1e-5, atol=1e-5)
    red = [g["reduced"] for g in got]
    assert set(red[0]) == set(red[1]) and len(red[0]) == 1 + 2 * cfg.n_layers
    for name in red[0]:
        assert not torch.isnan(red[0][name]).any(), name
        assert torch.equal(red[0][name], red[1][name]), f"{name} differs between the ranks"


def test_a_rank_that_never_launches_times_out_naming_the_peer(tmp_path):
    """Rank 1 skips its first launch (ONEKERNEL_TP_FAULT=1:skip:1; its collectives still run): rank 0's first
    all-reduce task gives up after its spin limit and check() raises KernelTimeoutError naming the task, its op,
    the event and peer rank 1."""
    out = tmp_path / "fault"
    _spawn({"tp": 2, "vocab": 256, "seed": 1, "prompts": [[1, 2]], "steps": 1, "out": str(out),
            "fault": "1:skip:1", "spin_limit": 2000})
    msg = torch.load(f"{out}.rank0.pt")["error"]
    print(msg)
    assert "(embed.ar, op kind allreduce, tile " in msg and "of peer rank 1" in msg, msg
    assert "waited on event" in msg and "saw count 0 < expected" in msg, msg


@pytest.mark.slow  # the CI suite's time; the same path named peer rank 1 on an H200 (run 38 call 383)
def test_a_rank_that_skips_a_step_stops_the_oneshot_all_reduce_naming_the_peer(tmp_path):
    """The kernel mode eager with the one-shot all-reduce: rank 1 skips its first step; rank 0's first all-reduce
    tile gives up after its poll limit and check() names the all-reduce, its tile and peer rank 1."""
    out = tmp_path / "fault"
    _spawn({"tp": 2, "vocab": 256, "seed": 1, "prompts": [[1, 2]], "steps": 1, "out": str(out),
            "fault": "1:skip:1", "spin_limit": 2000, "mode": "eager"})
    msg = torch.load(f"{out}.rank0.pt")["error"]
    assert "eager: all-reduce embed.ar tile " in msg and "waited on peer rank 1" in msg, msg
    assert "run count 0 < 1" in msg, msg


def _one_rank_runner(n_ranks=2, spin_limit=64, **graph_kw):
    """Rank 0's TP megakernel in the interpreter in this process (one worker): every peer buffer bound to its own
    poisoned tensor and every peer's event counters a zero tensor that nobody signals, so each remote wait gives
    up. (runner, remote-waiting tasks)."""
    import dataclasses

    from onekernel.exec.megakernel import MegakernelRunner
    from onekernel.models.decode_graph import build_decode_step
    from onekernel.models.random_init import random_weights
    from onekernel.runtime.kv_cache import KVCache

    cfg = dataclasses.replace(get_config("tiny"), vocab_size=256)
    cfg = dataclasses.replace(cfg, n_layers=1)
    cache = KVCache(cfg, 1, 8, torch.float32, "cpu")
    w = random_weights(cfg, torch.float32, "cpu", 0)
    w["residual.zero"] = torch.zeros(1, cfg.dim)
    bound = build_decode_step(cfg, w, cache, tiling=Tiling(8, "fit"), tp=(0, n_ranks), **graph_kw)
    counters = [torch.zeros(len(bound.graph.tasks), dtype=torch.int32) for _ in range(n_ranks)]
    r = MegakernelRunner(bound, interpret=True, rank=0, counters=counters, spin_limit=spin_limit)
    return r, [t for t, rw in enumerate(r.events.remote_waits) if rw]


def test_a_local_timeout_first_does_not_hide_the_remote_one():
    """The H200 failure of run 8 call 3: a local wait gave up before the remote wait it depended on (its polls
    are faster), and the remote spin, stopping on the error word, never recorded the peer. Here the first
    all-reduce tile's own local wait gives up first (its expected count raised: it can never be met), then its
    remote wait on peer 1 (never signalled) runs: the remote slot must record it, and check() must name the
    remote failure (task, op, event, peer rank 1) first and the local wait as its consequence."""
    from onekernel.errors import KernelTimeoutError

    r, rtasks = _one_rank_runner()
    g = r.graph
    t = rtasks[0]
    assert g.ops[g.tasks[t].op].name == "embed.ar" and r.events.waits[t]
    e_local = r.events.waits[t][0]
    r.events.expected[e_local] += 1000
    r.write_tables()
    r.step(torch.zeros(1, dtype=torch.int32))
    with pytest.raises(KernelTimeoutError) as info:
        r.check()
    msg = str(info.value)
    print(msg)
    e_remote = r.events.remote_waits[t][0][1]
    assert msg.startswith(f"megakernel: task {t} (embed.ar, op kind allreduce, tile {g.tasks[t].tile}) waited on "
                          f"event {e_remote} (producers: "), msg
    assert "task of embed) of peer rank 1" in msg or "tasks of embed) of peer rank 1" in msg, msg
    assert "of peer rank 1 and saw count 0 < expected" in msg, msg
    assert f"A local wait gave up too (a consequence of the remote one): task {t} (embed.ar" in msg, msg
    assert f"waited on event {e_local} " in msg, msg
    err = r.err.tolist()
    assert err[0] == 1 and err[8:10] == [5, t] and err[13] == 1


def test_a_remote_timeout_alone_stops_the_local_spins():
    """No local failure: the first remote wait gives up and records itself; err[0] = 6 (stop) so that the local
    spins downstream give up at once; check() names only the remote failure."""
    from onekernel.errors import KernelTimeoutError

    r, rtasks = _one_rank_runner()
    r.step(torch.zeros(1, dtype=torch.int32))
    with pytest.raises(KernelTimeoutError, match=f"task {rtasks[0]} \\(embed.ar, .* of peer rank 1 and saw count 0"
                       ) as info:
        r.check()
    assert "A local wait gave up too" not in str(info.value)
    assert r.err.tolist()[0] == 6
