"""``attn_partial_fold`` (ops/attention_fold.py: the split-KV partials, merged by the last split of each (sequence,
KV head) group) under the Triton interpreter, fp32, and ``fold_merge=True`` through the decode step, the runners
and the bench rows.

The op: seeded random q/K/V and lengths (length 1: a sequence at position 0; empty splits; the last cache row),
the output and the partials poisoned with NaN, the counters zero as a step binds them; every element against the
PyTorch references (``partial_reference``, ``merge_partials``) and an independent softmax formula, bitwise against
attn_partial + attn_merge (the same tile functions; the interpreter runs the tiles in order), the counters 0 after
each of two runs, each row bitwise its batch-1 run. The step: the ``tiny`` model with and without the fold, bitwise
(eager, graph and the Triton megakernel in the interpreter). The regions: no dependency among the fold's tiles,
o_proj's tiles on every tile of the groups they read. The errors: fold with fuse, at TP > 1, on a backend that
may stream, the reference mode.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from onekernel.errors import InputError
from onekernel.exec import check_fold_backend, make_runner
from onekernel.exec.codegen import launch_op
from onekernel.graph.deps import derive_dependencies, transitive_reduction
from onekernel.graph.ir import Graph
from onekernel.models.config import get_config
from onekernel.models.decode_graph import build_decode_step, decode_graph
from onekernel.models.load import load_model
from onekernel.ops.attention import add_attn_merge, add_attn_partial, merge_partials
from onekernel.ops.attention_fold import add_attn_partial_fold
from onekernel.ops.tiling import Tiling
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner
from test_batch_invariance import _check_rows, b_attention_fold
from test_decode_graph import _clone_cache, _setup
from test_ops_attention import naive_attention

CASES = [  # B, Hq, Hkv, hd, S, split
    (1, 2, 2, 16, 64, None),     # one split
    (3, 6, 2, 64, 200, 64),      # ratio 3, 4 splits
    (4, 8, 2, 16, 160, 32),      # ratio 4, 5 splits
    (2, 3, 1, 32, 96, 16),       # one KV head, 6 splits
]


def fold_graph(B, Hq, Hkv, hd, S, split, fold=True):
    """q "q", caches "kc" / "vc", "seq_lens"; attn_partial_fold (op "attn": "attn.out", "attn.counter") or
    attn_partial ("attn") + attn_merge ("merge": "merge.out")."""
    g = Graph()
    q = g.add_buffer("q", (B, Hq, hd), torch.float32, "activation")
    kc = g.add_buffer("kc", (B, Hkv, S, hd), torch.float32, "kv")
    vc = g.add_buffer("vc", (B, Hkv, S, hd), torch.float32, "kv")
    sl = g.add_buffer("seq_lens", (B,), torch.int32, "input")
    if fold:
        add_attn_partial_fold(g, "attn", q, kc, vc, sl, torch.float32, split=split)
    else:
        add_attn_merge(g, "merge", *add_attn_partial(g, "attn", q, kc, vc, sl, split=split), torch.float32)
    return g


def inputs(g, seed):
    """Random q / K / V; lengths: 1 (position 0), S (the last row), the rest random; NaN-poisoned outputs and
    partials; zero counters."""
    gen = torch.Generator().manual_seed(seed)
    B, _, S, _ = g.buffers["kc"].shape
    t = {}
    for name, b in g.buffers.items():
        if name in ("q", "kc", "vc"):
            t[name] = torch.randn(b.shape, generator=gen)
        elif b.kind == "counter":
            t[name] = torch.zeros(b.shape, dtype=b.dtype)
        elif b.dtype.is_floating_point:
            t[name] = torch.full(b.shape, float("nan"))
    lens = torch.randint(1, S + 1, (B,), generator=gen)
    lens[0] = 1
    if B > 1:
        lens[-1] = S
    t["seq_lens"] = (lens - 1).to(torch.int32)
    return t


@pytest.mark.parametrize("B,Hq,Hkv,hd,S,split", CASES)
def test_fold_matches_references(B, Hq, Hkv, hd, S, split, seed):
    g = fold_graph(B, Hq, Hkv, hd, S, split)
    op = g.ops[0]
    t = inputs(g, seed)
    plain = fold_graph(B, Hq, Hkv, hd, S, split, fold=False)
    tp = {n: v.clone() for n, v in t.items() if n in plain.buffers}
    tp["merge.out"] = t["attn.out"].clone()
    for o in plain.ops:
        launch_op(plain, o, tp)
    NSPLIT, SPLIT = op.params["NSPLIT"], op.params["SPLIT"]
    assert NSPLIT > 1 or S <= SPLIT
    for run in range(2):  # the second run starts from the counters the first one left
        t["attn.out"].fill_(float("nan"))
        launch_op(g, op, t)
        assert torch.equal(t["attn.counter"], torch.zeros_like(t["attn.counter"])), run
        assert not t["attn.out"].isnan().any()
        ref = {n: v.clone() for n, v in t.items()}
        for n in ("attn.o_part", "attn.lse_part", "attn.out"):
            ref[n].fill_(float("nan"))
        op.kind.reference(op, ref)
        torch.testing.assert_close(t["attn.o_part"], ref["attn.o_part"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(t["attn.lse_part"], ref["attn.lse_part"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(t["attn.out"], ref["attn.out"], rtol=1e-4, atol=1e-5)
        mine = merge_partials(t["attn.o_part"], t["attn.lse_part"], torch.float32)  # the kernel's own partials
        torch.testing.assert_close(t["attn.out"], mine, rtol=1e-5, atol=1e-6)
        want = naive_attention(t["q"], t["kc"], t["vc"], t["seq_lens"])
        torch.testing.assert_close(t["attn.out"].double(), want, rtol=1e-4, atol=1e-5)
        for n in ("attn.o_part", "attn.lse_part"):  # the same tile functions: the same bits
            assert torch.equal(t[n], tp[n]), n
        assert torch.equal(t["attn.out"], tp["merge.out"])
    empty = (torch.arange(NSPLIT) * SPLIT)[None, :] > t["seq_lens"][:, None].long()  # [B, NSPLIT]
    assert bool(empty.any()) == (NSPLIT > 1)  # length 1 leaves every split but the first empty
    assert torch.isinf(t["attn.lse_part"]).permute(0, 2, 1).all(-1).eq(empty).all()


def test_fold_rows_match_batch1(seed):
    _check_rows(b_attention_fold, 5, (0, 1, 2, 3, 4), seed)


def test_fold_regions_and_dependencies():
    """The fold's tiles do not depend on each other; each o_proj tile depends on every tile of the groups it reads
    (reduced dependencies), whichever of them merges; the counter is int32 [B, Hkv], zero when bound."""
    cfg = get_config("tiny")
    B, S = 2, 40
    g, _, _ = decode_graph(cfg, B, S, torch.float32, tiling=Tiling(16), fold_merge=True)
    kinds = [op.kind.name for op in g.ops]
    assert kinds[1:6] == ["qkv_rope", "attn_partial_fold", "gemv_residual", "gate_up", "gemv_residual"]
    assert g.meta["fold_merge"] and "attn_merge" not in kinds
    deps = transitive_reduction(derive_dependencies(g))
    assert deps == transitive_reduction(derive_dependencies(g, full=True))
    fold, o_proj = g.ops[2], g.ops[3]
    tiles = set(fold.task_ids)
    assert not tiles & {d for t in fold.task_ids for d in deps[t]}
    for t in o_proj.task_ids:
        assert set(deps[t]) >= tiles, t  # o_proj reads every row of attn: every group's every tile
    counter = g.buffers["attn_partial.0.counter"]
    assert (counter.kind, counter.dtype, counter.shape) == ("counter", torch.int32, (B, cfg.n_kv_heads))
    assert all(r.shared for t in fold.task_ids for r in g.tasks[t].writes)
    w, cache, _ = _setup(cfg, B, S, 0)
    step = build_decode_step(cfg, w, cache, tiling=Tiling(16), fold_merge=True)
    assert not step.tensors[counter.name].any()


def _tiny_step(mode, model, cache, tokens, **kw):
    r = make_step_runner(mode, model, _clone_cache(cache), interpret=True, **kw)
    out = [r.step(tokens)[0].clone() for _ in range(2)]  # two steps on one state: the same logits
    counters = [n for n, b in r.graph.buffers.items() if b.kind == "counter"]
    assert all(not r.tensors[n].any() for n in counters)
    assert torch.equal(out[0], out[1])
    return out[0], len(counters)


def test_decode_step_tiny_fold_equals_unfolded(seed):
    """The tiny model at batch 3 (a sequence at position 0, one at the last row): fold_merge's logits equal the
    unfolded step's bitwise under the interpreter (the same partials, the same merge), in eager, graph (the
    interpreter runs its launches eagerly) and the Triton megakernel (one worker)."""
    model = load_model("tiny", random_weights=True, seed=seed % 1000)
    _, cache, tokens = _setup(model.config, 3, 40, seed)
    want, n = _tiny_step("eager", model, cache, tokens)
    assert n == 0
    for mode in ("eager", "graph", "megakernel"):
        got, n = _tiny_step(mode, model, cache, tokens, fold_merge=True)
        assert n == model.config.n_layers
        assert torch.equal(got, want), mode
    ref = make_step_runner("reference", model, _clone_cache(cache)).step(tokens)[0]
    torch.testing.assert_close(want, ref, rtol=1e-4, atol=1e-4)


def test_bench_rows_run_the_fold():
    from onekernel.bench.modes import MODE_VARIANTS, make_bench_runner
    from onekernel.cli_tools import EXTRA_MODES

    assert MODE_VARIANTS["graph-fold"] == ("graph", {"fold_merge": True})
    assert MODE_VARIANTS["pdl-triton-fold"] == ("pdl", {"backend": "triton", "fold_merge": True})
    assert {"graph-fold", "pdl-triton-fold"} <= set(EXTRA_MODES)
    model = load_model("tiny", random_weights=True, seed=1)
    cache = KVCache(model.config, 1, 16, torch.float32, "cpu")
    for mode in ("graph-fold", "pdl-triton-fold"):
        r = make_bench_runner(mode, model, cache, interpret=True)
        assert any(op.kind.name == "attn_partial_fold" for op in r.graph.ops), mode


def test_fold_errors():
    model = load_model("tiny", random_weights=True, seed=1)
    cache = KVCache(model.config, 1, 16, torch.float32, "cpu")
    with pytest.raises(InputError, match="exclude each other"):
        make_step_runner("eager", model, cache, interpret=True, fold_merge=True, fuse_merge=True)
    with pytest.raises(InputError, match="exclude each other"):
        decode_graph(model.config, 1, 16, torch.float32, fold_merge=True, fuse_merge=True)
    with pytest.raises(InputError, match="tensor parallelism"):
        decode_graph(model.config, 1, 16, torch.float32, fold_merge=True, tp=(0, 2))
    with pytest.raises(InputError, match="fold_merge"):
        make_step_runner("megakernel", model, cache, interpret=True, fold_merge=True, backend="gluon")
    with pytest.raises(InputError, match="fold_merge"):
        make_step_runner("graph", model, cache, interpret=True, fold_merge=True, backend="gluon")
    with pytest.raises(InputError, match="reference mode takes no runner options, got fold_merge"):
        make_step_runner("reference", model, cache, fold_merge=True)
    with pytest.raises(InputError, match="fold_merge"):
        make_step_runner("eager", model, cache, interpret=True, fold_merge=1)
    step = build_decode_step(model.config, model.weights, cache, fold_merge=True)
    with pytest.raises(InputError, match="fold_merge"):
        make_runner("pdl", step, interpret=True, backend="gluon")
    # on a GPU, "auto" may stream for pdl and the megakernel: refused before anything is built
    for mode in ("pdl", "megakernel"):
        with pytest.raises(InputError, match="backend='triton'"):
            check_fold_backend(mode, "auto", False)
        check_fold_backend(mode, "triton", False)
        check_fold_backend(mode, "auto", True)  # the interpreter runs the Triton kernels
    check_fold_backend("graph", "auto", False)
    check_fold_backend("eager", None, False)


def test_streaming_support_names_the_fold():
    from onekernel.exec.stream_support import unsupported_graph

    g, _, _ = decode_graph(get_config("tiny"), 1, 16, torch.bfloat16, fold_merge=True)
    assert "fold_merge=True" in unsupported_graph(g, 1)
