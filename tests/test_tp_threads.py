"""The tensor-parallel megakernel with its ranks as threads of one process (``onekernel.dist.threads``, the harness of
scripts/tp_one_gpu.py), in the Triton interpreter: two ranks of ``tiny`` (253-row vocabulary: rank 1's shard padded)
against the TP=1 reference. The process-based version: tests/test_tp_megakernel.py."""
import dataclasses
import random
import time

import pytest
import torch

from onekernel.models.config import get_config

# not in the "tp-ranks" xdist group (tests/test_tp.py): the ranks here are threads of the test's own process (no
# spawned processes, no ports), so it runs on either worker and balances the suite


def _thread_ranks(cfg, seed, prompts, steps, tp=2):
    """Prefill + ``steps`` greedy steps on ``tp`` thread ranks (TPMegakernelRunner, interpreter, one worker each, one
    PoolFactory): per rank {"logits" [steps+1, B, V], "tokens" [steps+1, B], "reduced": {every *.ar.out}}."""
    from onekernel.dist.sharding import ShardedModel, shard_config, shard_weights
    from onekernel.dist.threads import PoolFactory, run_ranks, thread_groups
    from onekernel.models.random_init import random_weights
    from onekernel.models.tokenizer import Tokenizer
    from onekernel.runtime.kv_cache import KVCache
    from tp_worker import greedy

    full = random_weights(cfg, torch.float32, "cpu", seed)
    shards = [shard_config(cfg, tp, r) for r in range(tp)]
    groups, pools = thread_groups(shards), PoolFactory(tp)

    def rank(r):
        s = shards[r]
        model = ShardedModel(s.config, shard_weights(s, full), Tokenizer.byte_level(), cfg.name, s)
        cache = KVCache(s.config, len(prompts), max(map(len, prompts)) + steps, torch.float32, "cpu")
        runner = groups[r].step_runner("megakernel", model, cache, interpret=True, pools=pools)
        logits, tokens = greedy(runner, cache, prompts, steps, check=True)
        t = runner.bound.tensors
        return {"logits": logits, "tokens": tokens,
                "reduced": {n: t[n].clone() for n in t if n.endswith(".ar.out")}}
    return run_ranks(tp, rank, groups)


def _check(cfg, got, want_logits, want_tokens):
    """What the test asserts: every logit within 1e-5 of the range of TP=1's, the ranks' logits and tokens equal,
    tokens equal TP=1's where its top-2 margin is clear, every reduced buffer finite and bitwise equal on the ranks."""
    lg = got[0]["logits"]
    assert lg.shape == want_logits.shape and torch.isfinite(lg).all()
    scale = want_logits.abs().max()
    err = (lg - want_logits).abs().max() / scale
    assert err < 1e-5, f"TP=2 thread-rank logits differ from the TP=1 reference by {err:.2e} of their range"
    for g in got[1:]:
        assert torch.equal(g["logits"], lg) and torch.equal(g["tokens"], got[0]["tokens"])
    top2 = want_logits.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 1e-4 * scale
    assert clear.float().mean() > 0.8
    assert torch.equal(got[0]["tokens"][clear], want_tokens[clear])
    red = [g["reduced"] for g in got]
    assert len(red[0]) == 1 + 2 * cfg.n_layers and all(set(r) == set(red[0]) for r in red)
    for name in red[0]:
        assert torch.isfinite(red[0][name]).all(), name
        for r in red[1:]:
            assert torch.equal(red[0][name], r[name]), f"{name} differs between the ranks"


def test_tp2_thread_ranks_equal_tp1_reference(seed):
    """Two thread ranks: logits of prefill + 2 steps within 1e-5 of the TP=1 reference's range, tokens equal, the
    reduced buffers bitwise equal on both ranks (the runner poisons every partial and activation with NaN: an
    element never written fails); and the checks fail on one element changed in any of those results."""
    from test_tp import _reference

    cfg = dataclasses.replace(get_config("tiny"), vocab_size=253)
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(cfg.vocab_size) for _ in range(n)] for n in (4, 2)]
    steps = 2
    want_logits, want_tokens, _ = _reference(cfg, seed, prompts, steps)
    got = _thread_ranks(cfg, seed, prompts, steps)
    _check(cfg, got, want_logits, want_tokens)
    last = f"down.{cfg.n_layers - 1}.ar.out"
    for rank, key, name, why in ((0, "logits", None, "differ from the TP=1"), (1, "logits", None, ""),
                                 (1, "tokens", None, ""), (1, "reduced", last, "differs between the ranks"),
                                 (0, "reduced", "embed.ar.out", "")):
        bad = [{k: (dict(v) if isinstance(v, dict) else v) for k, v in g.items()} for g in got]
        t = bad[rank][key][name].clone() if name else bad[rank][key].clone()
        t.view(-1)[-1] += 1 if t.dtype == torch.int32 else 1e-3 * float(want_logits.abs().max())
        if name:
            bad[rank][key][name] = t
        else:
            bad[rank][key] = t
        with pytest.raises(AssertionError, match=why or None):
            _check(cfg, bad, want_logits, want_tokens)


def test_thread_group_collectives_and_a_rank_that_fails():
    """ThreadGroup's all_reduce (fp32 sum in rank order, identical on every rank), gather, distributed argmax; a rank
    that raises breaks the others' barrier at once (RankError), and run_ranks re-raises the rank's own error."""
    from onekernel.dist.sharding import shard_config
    from onekernel.dist.threads import PoolFactory, run_ranks, thread_groups
    from onekernel.errors import InputError

    cfg = dataclasses.replace(get_config("tiny"), vocab_size=253)
    shards = [shard_config(cfg, 2, r) for r in range(2)]
    groups = thread_groups(shards, timeout=30)
    xs = [torch.randn(3, 5, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    logits = torch.randn(2, 253, generator=torch.Generator().manual_seed(7))

    def rank(r):
        s = shards[r]
        local = logits[:, s.vocab_start:s.vocab_stop].contiguous()
        return (groups[r].all_reduce(xs[r].clone()), groups[r].gather_logits(local), groups[r].argmax(local))
    out = run_ranks(2, rank, groups)
    for red, full, ids in out:
        assert torch.equal(red, xs[0] + xs[1]) and torch.equal(full, logits)
        assert torch.equal(ids, logits.argmax(-1).to(torch.int32))

    fresh = thread_groups(shards, timeout=30)  # a rank failing before its collective: the other must not wait 30 s

    def failing(r):
        if r == 1:
            raise ValueError("rank 1 broke")
        fresh[r].all_reduce(xs[r].clone())
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 broke"):
        run_ranks(2, failing, fresh)
    assert time.monotonic() - t0 < 10
    f = PoolFactory(2)
    assert f(64, "cpu")[0] is f(64, "cpu")[0] and len(f(64, "cpu")) == 2
    with pytest.raises(InputError, match="different graphs"):
        f(128, "cpu")
