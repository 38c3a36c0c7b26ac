"""The streaming (Gluon) megakernel on a Hopper GPU against the PyTorch reference and the Triton megakernel
(the interpreter-tested path), and its bitwise batch invariance, with CUDA-core (gemv="fma") and tensor-core
(gemv="mma") GEMV bodies. Skipped without a CUDA sm_90 GPU."""
import sys
from pathlib import Path

import pytest
import torch

from onekernel.models.load import load_model
from onekernel.bench.modes import random_decode_state, step_on_copy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")]


@pytest.mark.parametrize("name,batch,gemv", [("smollm2-135m", 3, "fma"), ("llama-3.2-1b", 3, "fma"),
                                             ("llama-3.2-1b", 16, "fma"), ("smollm2-135m", 3, "mma"),
                                             ("llama-3.2-1b", 3, "mma"), ("llama-3.2-1b", 8, "mma"),
                                             ("llama-3.2-1b", 16, "mma"), ("qwen3-0.6b", 3, "mma"),
                                             ("qwen3-0.6b", 16, "mma"), ("llama-3.1-70b/tp8", 3, "mma")])
def test_gluon_matches_reference_and_is_batch_invariant(name, batch, gemv, seed):
    """Batch 16 on Llama-3.2-1B with fma: more rows than shared memory holds beside the ring
    (stream_plan.xbuf_rows), so the rows past XB take the L2 path; each must still equal its batch-1 run
    bitwise. mma: the tensor-core body (16 padded batch rows at every B, batch 1 included); the Triton
    megakernel it is compared with runs the same gemv path. Qwen3-0.6B: the per-head q/k RMSNorm pass
    (stream_epilogue.qk_norm_head) after each qkv task, whose units are whole heads. "llama-3.1-70b/tp8": two
    layers of Llama-3.1-70B's rank-0 shard at TP=8 (hidden 8192, 8 query heads on 1 KV head: CK 512 and the
    CUDA-core attention with 8 heads per warp, ops.attention.choose_split's short splits)."""
    model = _model(name, seed % 1000)
    lens = [300, 217, 45] if batch == 3 else torch.randint(1, 400, (batch,), generator=torch.Generator().manual_seed(
        seed)).tolist()
    cache, tokens = random_decode_state(model, len(lens), max(lens) + 32, lens, seed)
    ref = step_on_copy(model, "reference", cache, tokens)
    tri = step_on_copy(model, "megakernel", cache, tokens, backend="triton", gemv=gemv)
    glu = step_on_copy(model, "megakernel", cache, tokens, backend="gluon", gemv=gemv, wait_ms=5000)
    assert glu[3].consts["MMA"] == (gemv == "mma")
    for other in (ref, tri):
        err = ((glu[0] - other[0]).norm(dim=-1) / other[0].norm(dim=-1)).max().item()
        assert err < 0.08, err  # bf16 rounding of different reduction orders (the Triton path: same size)
    assert torch.equal(glu[1], glu[0].argmax(-1).to(torch.int32))
    b = torch.arange(len(lens), device="cuda")
    pos = cache.seq_lens.long()
    def rows(c):  # the K and V rows this step wrote, one row per (layer, sequence, head)
        return torch.cat([c.k[:, b, :, pos], c.v[:, b, :, pos]]).reshape(-1, c.k.shape[-1]).float()
    kv_err = ((rows(glu[2]) - rows(ref[2])).norm(dim=-1) / rows(ref[2]).norm(dim=-1)).max().item()
    kv_tri = ((rows(tri[2]) - rows(ref[2])).norm(dim=-1) / rows(ref[2]).norm(dim=-1)).max().item()
    assert kv_err < max(0.08, 1.5 * kv_tri), (kv_err, kv_tri)  # elementwise: bf16 ulps of values near zero
    keep = torch.ones_like(glu[2].k, dtype=torch.bool)
    keep[:, b, :, pos] = False
    assert torch.equal(glu[2].k[keep], cache.k[keep]), "a KV row other than seq_lens[b] was written"
    for i, n in enumerate(lens):  # each sequence alone, at batch 1: bitwise the same logits
        one, _ = random_decode_state(model, 1, max(lens) + 32, [n], seed)  # the same length: the same splits
        one.k.copy_(cache.k[:, i:i + 1])
        one.v.copy_(cache.v[:, i:i + 1])
        alone = step_on_copy(model, "megakernel", one, tokens[i:i + 1], backend="gluon", gemv=gemv)[0]
        assert torch.equal(alone[0], glu[0][i]), f"row {i} differs from its batch-1 run"


def _model(name: str, seed: int):
    """A random bf16 model on the GPU: a named config, or "NAME/tpN": two layers of rank 0's shard of NAME at TP=N
    as a model of its own (scripts/tp_common.shard_as_model, as scripts/shard_bench.py times it)."""
    if "/tp" not in name:
        return load_model(name, random_weights=True, dtype=torch.bfloat16, device="cuda", seed=seed)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from tp_common import shard_as_model

    base, tp = name.split("/tp")
    return shard_as_model(base, int(tp), 0, seed=seed, layers=2)


@pytest.mark.parametrize("name,gemv", [("llama-3.2-1b", "mma"), ("smollm2-135m", None)])
def test_auto_takes_gluon_for_an_mma_step(name, gemv):
    """backend="auto" runs an MMA step of a model that prefers streaming on the Gluon kernel at every batch
    (one path per model: batch invariance), its logits within bf16 rounding of the reference and its tokens
    the argmax of its logits. SmolLM2-135M with no GEMV path asked for: the megakernel's own choice
    (runtime.runners.megakernel_step), the tensor-core streaming kernel."""
    from onekernel.exec.stream_runner import StreamMegakernelRunner
    model = load_model(name, random_weights=True, dtype=torch.bfloat16, device="cuda", seed=7)
    for batch in (1, 16):
        cache, tokens = random_decode_state(model, batch, 256, None, 7)
        ref = step_on_copy(model, "reference", cache, tokens)
        got = step_on_copy(model, "megakernel", cache, tokens, **({"gemv": gemv} if gemv else {}))
        assert isinstance(got[3], StreamMegakernelRunner) and got[3].consts["MMA"], type(got[3])
        err = ((got[0] - ref[0]).norm(dim=-1) / ref[0].norm(dim=-1)).max().item()
        assert err < 0.08, (batch, err)
        assert torch.equal(got[1], got[0].argmax(-1).to(torch.int32))


def test_pdl_takes_the_streaming_bodies_for_an_mma_step(seed):
    """mode "pdl" with no backend asked for (exec.pdl_streams): Llama-3.2-1B's tensor-core step runs on the streaming
    bodies, one persistent kernel per op, at batch 1 and 5; its logits within bf16 rounding of the reference, its tokens
    their argmax, each row bitwise its batch-1 run, and the Triton per-op kernels (backend="triton") still there."""
    from onekernel.exec.kernels import PdlRunner
    from onekernel.exec.stream_segments import StreamSegmentRunner
    model = load_model("llama-3.2-1b", random_weights=True, dtype=torch.bfloat16, device="cuda", seed=seed % 1000)
    lens = torch.randint(1, 300, (5,), generator=torch.Generator().manual_seed(seed)).tolist()
    cache, tokens = random_decode_state(model, 5, 332, lens, seed)
    ref = step_on_copy(model, "reference", cache, tokens)
    got = step_on_copy(model, "pdl", cache, tokens)
    assert isinstance(got[3], StreamSegmentRunner) and got[3].pdl, type(got[3])
    err = ((got[0] - ref[0]).norm(dim=-1) / ref[0].norm(dim=-1)).max().item()
    assert err < 0.08, err
    assert torch.equal(got[1], got[0].argmax(-1).to(torch.int32))
    tri = step_on_copy(model, "pdl", cache, tokens, backend="triton")
    assert type(tri[3]) is PdlRunner
    assert ((tri[0] - ref[0]).norm(dim=-1) / ref[0].norm(dim=-1)).max().item() < 0.08
    for i, n in enumerate(lens):
        one, _ = random_decode_state(model, 1, 332, [n], seed)
        one.k.copy_(cache.k[:, i:i + 1])
        one.v.copy_(cache.v[:, i:i + 1])
        assert torch.equal(step_on_copy(model, "pdl", one, tokens[i:i + 1])[0][0], got[0][i]), f"row {i}"


def test_rmsnorm_partials_are_each_tasks_sums_of_squares(seed, monkeypatch):
    """stream_plan.SS_PARTIALS forced on (STREAM_SS_PARTIALS=1; by default only hidden sizes >= 4096 take them) for a
    tensor-core megakernel step of Llama-3.2-1B at batch 5: each residual GEMV's partials (stream.ss.<op>, poisoned with
    -1 before the step: stream_pack.scratch_tensors) hold, for every sequence b and task j, the sum of squares of the
    rows task j stored (units plan.units[t]), as float64 sums of those rows give them (fp32 partial sums: rtol 1e-5).
    Every residual GEMV has them (an RMSNorm'd GEMV reads each output; the first layer's qkv reads the embedding and
    keeps its rstd pass). The logits the readers make of them are within bf16 rounding of the PyTorch reference, the
    tokens their argmax, and each row bitwise its batch-1 run (the partials' sum order does not depend on B)."""
    from onekernel.exec import stream_plan
    monkeypatch.setattr(stream_plan, "SS_PARTIALS", "1")
    model = load_model("llama-3.2-1b", random_weights=True, dtype=torch.bfloat16, device="cuda", seed=seed % 1000)
    lens = torch.randint(1, 250, (5,), generator=torch.Generator().manual_seed(seed)).tolist()
    cache, tokens = random_decode_state(model, 5, 256, lens, seed)
    ref = step_on_copy(model, "reference", cache, tokens)
    got = step_on_copy(model, "megakernel", cache, tokens, backend="gluon", gemv="mma")
    r = got[3]
    plan, rg = r.plan, r.plan.consts["RG"]
    assert plan.consts["NSS"] == min(model.config.dim // rg, r.n_workers)
    ops = [op for op in plan.graph.ops if op.kind.name == "gemv_residual"]
    assert len(ops) == 2 * model.config.n_layers and all("ss" in op.args for op in ops)
    for op in ops:
        out = r.tensors[op.args["out"]].double()
        want = torch.stack([(out[:, u0 * rg:(u0 + nu) * rg] ** 2).sum(1)
                            for u0, nu in (plan.units[t] for t in op.task_ids)], 1)
        torch.testing.assert_close(r.scratch[op.args["ss"]].double(), want, rtol=1e-5, atol=0, msg=op.name)
    err = ((got[0] - ref[0]).norm(dim=-1) / ref[0].norm(dim=-1)).max().item()
    assert err < 0.08, err
    assert torch.equal(got[1], got[0].argmax(-1).to(torch.int32))
    for i, n in enumerate(lens):
        one, _ = random_decode_state(model, 1, 256, [n], seed)
        one.k.copy_(cache.k[:, i:i + 1])
        one.v.copy_(cache.v[:, i:i + 1])
        alone = step_on_copy(model, "megakernel", one, tokens[i:i + 1], backend="gluon", gemv="mma")
        assert alone[3].plan.consts["NSS"] > 0
        assert torch.equal(alone[0][0], got[0][i]), f"row {i} differs from its batch-1 run"


def test_norm_bf16_is_rnd_to_the_bit():
    """stream_stage.norm_bf16 (cvt.rn.bf16x2.f32, then mul.rn.bf16x2 by the norm weight) gives the bits of
    ``rnd(rnd(y) * g).to(bf16)`` (RMSNorm's rounding points, ops.gemv_rows.rnd) and of PyTorch's bf16 rounding of
    each step, for random y of RMSNorm's magnitudes (products above fp32's subnormal range), exact bf16 ties of y and
    random bf16 g: the staged RMSNorm values of the tensor-core GEMV are unchanged."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from onekernel.exec.stream_stage import norm_bf16
    from onekernel.ops.gemv_rows import rnd

    @gluon.jit
    def both(y_ptr, g_ptr, hw_ptr, sw_ptr, N: gl.constexpr):
        L: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
        o = gl.arange(0, N, layout=L)
        y = gl.load(y_ptr + o)
        g = gl.load(g_ptr + o)
        gl.store(hw_ptr + o, norm_bf16(y, g))
        gl.store(sw_ptr + o, (rnd(y, gl.bfloat16) * g.to(gl.float32)).to(gl.bfloat16))

    torch.manual_seed(5)
    n = 8192
    y = torch.randn(n) * torch.exp2(torch.randint(-20, 20, (n,)).float())
    ties = (torch.randint(0x3000, 0x4800, (256,), dtype=torch.int32) << 16) | 0x8000  # halfway, both parities
    y[:256] = ties.view(torch.float32)
    y[256:512] = -y[:256]
    y = y.cuda()
    g = (torch.randn(n) * 2).bfloat16().cuda()
    hw = torch.full_like(g, float("nan"))
    sw = torch.full_like(g, float("nan"))
    both[(1,)](y, g, hw, sw, n, num_warps=4)
    assert torch.equal(hw.view(torch.int16), sw.view(torch.int16))
    assert torch.equal(hw.view(torch.int16), (y.bfloat16().float() * g.float()).bfloat16().view(torch.int16))


@pytest.mark.parametrize("graph", [False, True])
def test_counters_rewind_on_the_gpu(monkeypatch, graph, seed):
    """The streaming megakernel rewinds its event counters, done counter and epoch every REWIND_EVERY steps
    (persistent.PersistentRunner.rewind, between two steps in stream order; tested in the interpreter in
    tests/test_executors.py): with a rewind after every second step, six steps of SmolLM2-135M (tensor cores, batch
    3; launched, and replayed from a CUDA graph) give every step's logits and tokens bitwise equal to a runner that
    never rewinds, from the same cache and tokens; the counters are zero and the epoch 1 exactly after a rewind."""
    from onekernel.exec import persistent
    from onekernel.exec.stream_runner import StreamMegakernelRunner
    from onekernel.runtime.kv_cache import KVCache
    from onekernel.runtime.runners import make_step_runner

    model = load_model("smollm2-135m", random_weights=True, dtype=torch.bfloat16, device="cuda", seed=seed % 1000)
    cache, _ = random_decode_state(model, 3, 96, [40, 7, 61], seed)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (6, 3), generator=g, dtype=torch.int32).cuda()
    runs = {}
    for every in (1 << 20, 2):
        monkeypatch.setattr(persistent, "REWIND_EVERY", every)
        c = KVCache(model.config, 3, 96, torch.bfloat16, "cuda")  # a copy of the cache: each run starts alike
        c.k.copy_(cache.k)
        c.v.copy_(cache.v)
        c.seq_lens.copy_(cache.seq_lens)
        r = make_step_runner("megakernel", model, c, gemv="mma", use_cuda_graph=graph)
        assert isinstance(r, StreamMegakernelRunner) and (every > 2 or r._rewind_steps() == 2)
        out = []
        for i, t in enumerate(tokens, start=1):
            r.tensors[r.bound.logits].fill_(float("nan"))
            r.tensors[r.bound.next_tokens].fill_(-1)
            lg, nt = r.step(t)
            torch.cuda.synchronize()
            r.check()
            out.append((lg.clone(), nt.clone()))
            if every == 2:  # a CUDA-graph runner's first step also launches once while it captures: epoch 3 then
                rewound = i % 2 == 0
                assert (r.epoch.item() == 1) == rewound, (i, r.epoch.item())
                assert (int(r.ev_cnt.abs().sum()) == 0) == rewound and (r.done.item() == 0) == rewound, i
            c.seq_lens += 1
        runs[every] = out
    for i, ((a, ta), (b, tb)) in enumerate(zip(runs[1 << 20], runs[2])):
        assert not torch.isnan(a).any()
        assert torch.equal(a, b) and torch.equal(ta, tb), f"step {i + 1} differs after rewinding"


@pytest.mark.parametrize("name,batch,S", [("llama-3.2-1b", 8, 2048), ("smollm2-135m", 3, 2048), ("llama-3.2-1b", 3, 4096),
                                          ("llama-3.1-70b/tp8", 3, 512)])
def test_dead_splits_of_a_long_cache(name, batch, S, seed):
    """A serving cache of 2048 positions (32 splits of 64 per KV head, permuted along the runs; exec.stream_attn_runs;
    and 4096 on Llama-3.2-1B: 32 splits of 128, ops.attention.choose_split's 2-wave bound for head dim 64)
    with sequences at short, random positions: the attention runs skip their dead tiles and the merge reads only live
    splits. One runner, two steps: first every sequence near the cache's end (every split live, every partial
    written), then at short positions from a fresh cache copy, so a merge that read a dead split would meet the first
    step's partials. Each step against the PyTorch reference; the second's rows bitwise equal to each sequence alone
    at batch 1 (tensor-core attention on Llama-3.2-1B, the CUDA-core body on SmolLM2-135M). "llama-3.1-70b/tp8" at
    512 positions: 16 splits of 32 for its 8-head group (ops.attention.choose_split), so the skip is on there too, as in
    the benchmark's cache."""
    from onekernel.runtime.runners import make_step_runner

    model = _model(name, seed % 1000)
    gen = torch.Generator().manual_seed(seed)
    short = torch.randint(1, 300, (batch,), generator=gen).tolist()
    long_, tokens = random_decode_state(model, batch, S, [S - 1 - i for i in range(batch)], seed)
    state, _ = random_decode_state(model, batch, S, short, seed + 1)
    r = make_step_runner("megakernel", model, long_, backend="gluon", wait_ms=5000)
    for i, src in enumerate((long_, state)):
        ref = step_on_copy(model, "reference", src, tokens)
        if i:
            for dst, x in ((long_.k, src.k), (long_.v, src.v), (long_.seq_lens, src.seq_lens)):  # r's cache
                dst.copy_(x)
        r.tensors[r.bound.logits].fill_(float("nan"))
        lg, _ = r.step(tokens)
        torch.cuda.synchronize()
        r.check()
        err = ((lg.float() - ref[0].float()).norm(dim=-1) / ref[0].float().norm(dim=-1)).max().item()
        assert err < 0.08, (i, err)
    for i, n in enumerate(short[:2]):
        one, _ = random_decode_state(model, 1, S, [n], seed)
        one.k.copy_(state.k[:, i:i + 1])
        one.v.copy_(state.v[:, i:i + 1])
        alone = step_on_copy(model, "megakernel", one, tokens[i:i + 1], backend="gluon")[0]
        assert torch.equal(alone[0], lg[i]), f"row {i} differs from its batch-1 run"
