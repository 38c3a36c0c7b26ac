"""Executors under the Triton interpreter (fp32, CPU) against the PyTorch reference mode.

Under the interpreter there are no CUDA graphs and no PDL, so ``graph`` and ``pdl`` would re-run the eager
launches: the separate-kernel path is tested once (``eager``), the megakernel's own path (one worker running
every task in schedule order through the generated dispatch, events, epochs) once, each on the `tiny` models,
with the attention merge fused into the O-projection and separate (several KV splits, empty ones included).
The megakernel rejects an invalid schedule and turns an unsatisfiable wait into an error naming the task.
"""
from types import SimpleNamespace

import pytest
import torch

from onekernel.errors import DeviceError, InputError, KernelTimeoutError, ScheduleError
from onekernel.graph.schedule import Schedule
from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner
from onekernel.runtime.runners import make_step_runner


def _setup(name, batch, seed):
    model = load_model(name, random_weights=True, seed=seed)
    cache = KVCache(model.config, batch, 40, torch.float32, "cpu")
    g = torch.Generator().manual_seed(seed)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    cache.seq_lens.copy_(torch.randint(0, 30, (batch,), generator=g, dtype=torch.int32))
    return model, cache, g


def _poison(r):
    r.tensors[r.bound.logits].fill_(float("nan"))
    r.tensors[r.bound.next_tokens].fill_(-1)


@pytest.mark.parametrize("mode", ["eager", "megakernel"])
@pytest.mark.parametrize("name,batch", [("tiny", 1), ("tiny", 3), ("tiny-qwen3", 2)])
def test_mode_matches_reference(mode, name, batch, seed):
    _check_against_reference(mode, name, batch, seed)


@pytest.mark.parametrize("mode,name,batch", [("eager", "tiny", 3), ("megakernel", "tiny-qwen3", 2)])
def test_mma_gemv_matches_reference(mode, name, batch, seed):
    """The whole decode step with every GEMV on the tensor-core path (gemv="mma"): the separate kernels, and the
    megakernel's generated dispatch with the MMA variants (Qwen3's q/k norm included)."""
    _check_against_reference(mode, name, batch, seed, gemv="mma")


def _check_against_reference(mode, name, batch, seed, **options):
    """Three steps of ``mode`` (runner ``options``) against the reference runner from the same cache: logits,
    greedy tokens and the K/V written."""
    model, cache, g = _setup(name, batch, seed)
    snap = (cache.k.clone(), cache.v.clone(), cache.seq_lens.clone())
    tokens = torch.randint(0, model.config.vocab_size, (3, batch), generator=g, dtype=torch.int32)
    ref = ReferenceRunner(model, cache)
    want = []
    for t in tokens:
        lg, nt = ref.step(t)
        want.append((lg.clone(), nt.clone(), cache.k.clone(), cache.v.clone()))
        cache.seq_lens += 1
    cache.k.copy_(snap[0]); cache.v.copy_(snap[1]); cache.seq_lens.copy_(snap[2])
    r = make_step_runner(mode, model, cache, interpret=True, **options)
    assert r.bound.graph.meta["gemv"] == options.get("gemv", "fma")
    for t, (lg_w, nt_w, k_w, v_w) in zip(tokens, want):
        _poison(r)
        lg, nt = r.step(t)
        r.check()
        torch.testing.assert_close(lg, lg_w, rtol=1e-4, atol=1e-4)
        assert torch.equal(nt, nt_w)
        torch.testing.assert_close(cache.k, k_w, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.v, v_w, rtol=1e-5, atol=1e-5)
        cache.seq_lens += 1


def test_counters_rewind_between_steps(monkeypatch, seed):
    """Every REWIND_EVERY steps the megakernel runner puts its event counters and done counter back to 0 and its
    epoch to 1, between two steps (so no wait target, expected count x epoch in int32, can wrap: the step whose
    target crosses 2^31, first after 16.3M steps at 132 producers, would not wait), and every step, before and after a rewind, still matches the
    reference: five steps with a rewind after every second one (the device bumps the epoch once per step)."""
    from onekernel.exec import persistent
    monkeypatch.setattr(persistent, "REWIND_EVERY", 2)
    model, cache, g = _setup("tiny", 2, seed)
    snap = (cache.k.clone(), cache.v.clone(), cache.seq_lens.clone())
    tokens = torch.randint(0, model.config.vocab_size, (5, 2), generator=g, dtype=torch.int32)
    ref = ReferenceRunner(model, cache)
    want = []
    for t in tokens:
        lg, nt = ref.step(t)
        want.append((lg.clone(), nt.clone()))
        cache.seq_lens += 1
    cache.k.copy_(snap[0]); cache.v.copy_(snap[1]); cache.seq_lens.copy_(snap[2])
    r = make_step_runner("megakernel", model, cache, interpret=True)
    for i, (t, (lg_w, nt_w)) in enumerate(zip(tokens, want), start=1):
        _poison(r)
        lg, nt = r.step(t)
        r.check()
        torch.testing.assert_close(lg, lg_w, rtol=1e-4, atol=1e-4)
        assert torch.equal(nt, nt_w)
        rewound = i % 2 == 0
        assert r.epoch.item() == (1 if rewound else 1 + i % 2), (i, r.epoch.item())
        assert (int(r.ev_cnt.abs().sum()) == 0) == rewound and (r.done.item() == 0) == rewound, i
        cache.seq_lens += 1


def test_rewind_comes_before_any_target_wraps():
    """The rewind interval follows the plan: REWIND_EVERY (2^20) steps where every event has at most 2,045
    producers, fewer where one has more (the Triton megakernel's LM-head tiles, one argmax event: 2,374 on Qwen3,
    whose target crossed 2^31 at step 904,585), so expected x epoch and n_workers x epoch stay below 2^31."""
    from onekernel.exec import persistent
    from onekernel.exec.megakernel import MegakernelRunner
    for expected, workers in (([1, 132, 7], 132), ([2374, 3], 132), ([5], 4096), ([1 << 20], 8)):
        r = object.__new__(MegakernelRunner)
        r.events, r.n_workers = SimpleNamespace(expected=expected), workers
        n = r._rewind_steps()
        big = max(max(expected), workers)
        assert 1 <= n <= persistent.REWIND_EVERY and big * (n + 1) < 2 ** 31, (expected, workers, n)
        assert n == persistent.REWIND_EVERY or big * (n + 4) >= 2 ** 31 - 1, (expected, workers, n)


def test_tensor_parallel_rank_does_not_rewind_alone():
    """A tensor-parallel rank's peers read its counters: without a barrier over the ranks it refuses to rewind
    them (RuntimeError) and leaves them as they were."""
    from onekernel.exec.megakernel import MegakernelRunner
    r = object.__new__(MegakernelRunner)
    r.tp, r.ev_cnt, r.done, r.epoch = True, torch.full((3,), 7, dtype=torch.int32), torch.ones(1), torch.full((1,), 5)
    with pytest.raises(RuntimeError, match="barrier over the ranks"):
        r.rewind()
    assert r.ev_cnt.tolist() == [7, 7, 7] and r.epoch.item() == 5
    calls = []
    r._rank_barrier = lambda: calls.append(r.epoch.item())
    r.rewind()
    assert calls == [5, 1] and r.ev_cnt.tolist() == [0, 0, 0] and r.epoch.item() == 1 and r.done.item() == 0


@pytest.mark.parametrize("fuse", [True, False], ids=["fused-merge", "separate-merge"])
@pytest.mark.parametrize("mode", ["eager", "megakernel"])
def test_fuse_merge_matches_reference(mode, fuse, twin_caches, seed):
    """tiny, batch 3, a 160-position cache (SPLIT 64, NSPLIT 3): rows at lengths 1, 97 and 150 -> 1, 2 and 3
    live splits (the empty splits' partials are -inf / 0); two steps."""
    model = load_model("tiny", random_weights=True, seed=seed)
    (cache, ref_cache), g = twin_caches(model, 3, 160, [0, 96, 149], seed)
    ref = ReferenceRunner(model, ref_cache)
    r = make_step_runner(mode, model, cache, interpret=True, fuse_merge=fuse)
    partial = next(op for op in r.graph.ops if op.name == "attn_partial.0")
    assert r.graph.meta["fuse_merge"] is fuse and partial.params["NSPLIT"] == 3
    kinds = [op.kind.name for op in r.graph.ops]
    assert kinds.count("attn_merge") == (0 if fuse else model.config.n_layers)
    assert kinds.count("oproj_merge") == (model.config.n_layers if fuse else 0)
    for _ in range(2):
        tokens = torch.randint(0, model.config.vocab_size, (3,), generator=g, dtype=torch.int32)
        lg_w, nt_w = ref.step(tokens)
        _poison(r)
        lg, nt = r.step(tokens)
        r.check()
        torch.testing.assert_close(lg, lg_w, rtol=1e-4, atol=1e-4)
        assert torch.equal(nt, nt_w)
        torch.testing.assert_close(cache.k, ref_cache.k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.v, ref_cache.v, rtol=1e-5, atol=1e-5)
        cache.seq_lens += 1
        ref_cache.seq_lens += 1


def test_gpu_mode_without_gpu_is_refused():
    model, cache, _ = _setup("tiny", 1, 0)
    with pytest.raises(DeviceError, match="--interpret"):
        make_step_runner("megakernel", model, cache)
    with pytest.raises(InputError, match="unknown mode"):
        make_step_runner("turbo", model, cache, interpret=True)


def test_invalid_schedule_is_rejected_before_launch():
    model, cache, _ = _setup("tiny", 1, 0)
    r = make_step_runner("megakernel", model, cache, interpret=True)
    queue = list(r.schedule.queues[0])
    t = next(i for i, d in enumerate(r.deps) if d)  # a task with a dependency, placed before it
    queue.remove(t)
    queue.insert(queue.index(r.deps[t][0]), t)
    with pytest.raises(ScheduleError):
        make_step_runner("megakernel", model, cache, interpret=True, schedule=Schedule([queue], 1, "manual"))


@pytest.mark.parametrize("check_every", [0, 1])
def test_unsatisfiable_event_times_out_with_named_task(check_every):
    """A wait no producer can satisfy ends in KernelTimeoutError naming the task: at once from ``step`` with
    ``check_every=1``, from the caller's ``check()`` with the default ``check_every=0``."""
    model, cache, _ = _setup("tiny", 1, 0)
    r = make_step_runner("megakernel", model, cache, interpret=True, spin_limit=50, check_every=check_every)
    t = next(i for i, w in enumerate(r.events.waits) if w)
    ev = r.events.waits[t][0]
    r.events.expected[ev] = 1_000_000  # no producer can ever reach this count
    r.write_tables()
    op = r.graph.ops[r.graph.tasks[t].op]
    tok = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(KernelTimeoutError, match=f"task {t} \\({op.name}"):
        if check_every:
            r.step(tok)
        else:
            r.step(tok)  # does not read the error word
            r.check()


def test_generate_raises_a_megakernel_timeout_before_emitting_its_tokens(monkeypatch):
    """The pipelined generation loop polls the runner for a device-side error of step k before it emits step
    k's tokens: a megakernel whose every wait times out raises KernelTimeoutError naming a task, and only the
    prefill's token (which no decode step produced) reached on_token."""
    import onekernel.runtime.generate as gen_mod
    from onekernel.runtime.generate import generate

    def broken_runner(mode, model, cache, **kw):
        r = make_step_runner(mode, model, cache, spin_limit=50, **kw)
        for ev in range(r.events.n_events):
            r.events.expected[ev] = 1_000_000  # no producer can ever reach this count
        r.write_tables()
        return r

    monkeypatch.setattr(gen_mod, "make_step_runner", broken_runner)
    model = load_model("tiny", random_weights=True)
    seen = []
    with pytest.raises(KernelTimeoutError, match="megakernel: task \\d+ \\("):
        generate(model, [[1, 2, 3]], mode="megakernel", interpret=True, max_new_tokens=4,
                 on_token=lambda b, t, piece: seen.append(t))
    assert len(seen) == 1
