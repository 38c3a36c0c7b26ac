"""Executors under the Triton interpreter (fp32, CPU): every Triton mode on the `tiny` models equals the
reference mode, eager and megakernel also with the attention merge forced fused into the O-projection and
forced separate (several KV splits, empty ones included); the megakernel rejects an invalid schedule and turns
an unsatisfiable wait into an error."""
import pytest
import torch

from onekernel.errors import DeviceError, KernelTimeoutError, ScheduleError
from onekernel.exec import make_runner
from onekernel.graph.schedule import Schedule
from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner


def _setup(name, batch, seed):
    model = load_model(name, random_weights=True, seed=seed)
    cache = KVCache(model.config, batch, 40, torch.float32, "cpu")
    g = torch.Generator().manual_seed(seed)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    cache.seq_lens.copy_(torch.randint(0, 30, (batch,), generator=g, dtype=torch.int32))
    return model, cache


@pytest.mark.parametrize("mode", ["eager", "graph", "pdl", "megakernel"])
@pytest.mark.parametrize("name,batch", [("tiny", 1), ("tiny", 3), ("tiny-qwen3", 2)])
def test_mode_matches_reference(mode, name, batch):
    seed = torch.randint(0, 10_000, ()).item()
    model, cache = _setup(name, batch, seed)
    snap = (cache.k.clone(), cache.v.clone(), cache.seq_lens.clone())
    tokens = torch.randint(0, model.config.vocab_size, (3, batch), dtype=torch.int32)
    ref = ReferenceRunner(model, cache)
    want = []
    for t in tokens:
        lg, nt = ref.step(t)
        want.append((lg.clone(), nt.clone(), cache.k.clone(), cache.v.clone()))
        cache.seq_lens += 1
    cache.k.copy_(snap[0]); cache.v.copy_(snap[1]); cache.seq_lens.copy_(snap[2])
    r = make_runner(mode, model, cache, batch, interpret=True)
    for t, (lg_w, nt_w, k_w, v_w) in zip(tokens, want):
        r.tensors["logits"].fill_(float("nan"))
        r.tensors["next_tokens"].fill_(-1)
        lg, nt = r.step(t)
        torch.testing.assert_close(lg, lg_w, rtol=1e-4, atol=1e-4)
        assert torch.equal(nt, nt_w)
        torch.testing.assert_close(cache.k, k_w, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.v, v_w, rtol=1e-5, atol=1e-5)
        cache.seq_lens += 1


@pytest.mark.parametrize("fuse", [True, False], ids=["fused-merge", "separate-merge"])
@pytest.mark.parametrize("mode", ["eager", "megakernel"])
def test_fuse_merge_matches_reference(mode, fuse, twin_caches):
    """tiny, batch 3, a 160-position cache (SPLIT 64, NSPLIT 3): rows at lengths 1, 97 and 150 -> 1, 2 and 3
    live splits (the empty splits' partials are -inf / 0); two steps."""
    seed = int(torch.randint(0, 10_000, ()))
    model = load_model("tiny", random_weights=True, seed=seed)
    (cache, ref_cache), g = twin_caches(model, 3, 160, [0, 96, 149], seed)
    ref = ReferenceRunner(model, ref_cache)
    r = make_runner(mode, model, cache, 3, interpret=True, fuse_merge=fuse)
    partial = next(op for op in r.graph.ops if op.name == "attn_partial.0")
    assert r.graph.meta["fuse_merge"] is fuse and partial.params["NSPLIT"] == 3
    assert [op.kind for op in r.graph.ops].count("attn_merge") == (0 if fuse else model.config.n_layers)
    for _ in range(2):
        tokens = torch.randint(0, model.config.vocab_size, (3,), generator=g, dtype=torch.int32)
        lg_w, nt_w = ref.step(tokens)
        r.tensors["logits"].fill_(float("nan"))
        r.tensors["next_tokens"].fill_(-1)
        lg, nt = r.step(tokens)
        torch.testing.assert_close(lg, lg_w, rtol=1e-4, atol=1e-4)
        assert torch.equal(nt, nt_w)
        torch.testing.assert_close(cache.k, ref_cache.k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.v, ref_cache.v, rtol=1e-5, atol=1e-5)
        cache.seq_lens += 1
        ref_cache.seq_lens += 1


def test_gpu_mode_without_gpu_is_refused():
    model, cache = _setup("tiny", 1, 0)
    with pytest.raises(DeviceError, match="--interpret"):
        make_runner("megakernel", model, cache, 1)


def test_invalid_schedule_is_rejected_before_launch():
    model, cache = _setup("tiny", 1, 0)
    r = make_runner("megakernel", model, cache, 1, interpret=True)
    queue = list(r.schedule.queues[0])
    t = next(i for i, d in enumerate(r.deps) if d)  # a task with a dependency, placed before it
    queue.remove(t)
    queue.insert(queue.index(r.deps[t][0]), t)
    with pytest.raises(ScheduleError):
        make_runner("megakernel", model, cache, 1, interpret=True, schedule=Schedule([queue], 1, "manual"))


def test_unsatisfiable_event_times_out_with_named_task():
    model, cache = _setup("tiny", 1, 0)
    r = make_runner("megakernel", model, cache, 1, interpret=True, spin_limit=50)
    t = next(i for i, w in enumerate(r.events.waits) if w)
    ev = r.events.waits[t][0]
    r.events.expected[ev] = 1_000_000  # no producer can ever reach this count
    r.write_tables()
    op = r.graph.ops[r.graph.tasks[t].op]
    with pytest.raises(KernelTimeoutError, match=f"task {t} \\({op.name}"):
        r.step(torch.tensor([1], dtype=torch.int32))
