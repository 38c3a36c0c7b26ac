"""build_decode_graph + bind + run_reference, and one full decode step of the tiny configs with every op
launched as its own kernel (Triton interpreter, fp32), compared to the graph reference and to the
independent reference decoder ``onekernel.runtime.reference.decode_step``."""
import dataclasses
import os
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from onekernel.errors import InputError, UnsupportedModelError
from onekernel.exec.codegen import launch_op
from onekernel.graph.deps import derive_dependencies
from onekernel.models.config import get_config
from onekernel.models.decode_graph import bind, build_decode_graph, run_reference
from onekernel.models.random_init import random_weights
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import decode_step

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def _setup(cfg, B, S, seed):
    torch.manual_seed(seed)
    w = random_weights(cfg, torch.float32, seed=seed)
    cache = KVCache(cfg, B, S, torch.float32)
    cache.k.normal_()
    cache.v.normal_()
    lens = torch.randint(0, S - 1, (B,), dtype=torch.int32)
    lens[0] = 0  # first token of a sequence
    if B > 1:
        lens[-1] = S - 1  # last cache row
    cache.seq_lens.copy_(lens)
    tokens = torch.randint(0, cfg.vocab_size, (B,), dtype=torch.int32)
    return w, cache, tokens


def _clone_cache(cache):
    c = KVCache(cache.cfg, cache.batch, cache.max_seq_len, cache.dtype)
    c.k.copy_(cache.k)
    c.v.copy_(cache.v)
    c.seq_lens.copy_(cache.seq_lens)
    return c


CASES = [("tiny", 1, None), ("tiny", 3, LLAMA3), ("tiny-qwen3", 1, None), ("tiny-qwen3", 3, None)]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused-merge", "separate-merge"])
@pytest.mark.parametrize("name,B,scaling", CASES, ids=[f"{c[0]}-B{c[1]}-{'scaled' if c[2] else 'plain'}" for c in CASES])
def test_decode_step_matches_references(name, B, scaling, fuse):
    cfg = dataclasses.replace(get_config(name), rope_scaling=scaling)
    S = 40
    w, cache, tokens = _setup(cfg, B, S, seed=B + 7 * len(name))
    ref_cache, graph_cache = _clone_cache(cache), _clone_cache(cache)

    g = build_decode_graph(cfg, B, S, torch.float32, n_sm=16, fuse_merge=fuse)
    assert ("attn.0" in g.buffers) != fuse
    t = bind(g, w, cache)
    t["tokens"].copy_(tokens)
    for op in g.ops:
        launch_op(g, op, t)
    for bname, buf in g.buffers.items():  # every activation/output was written (poison gone)
        if buf.kind in ("activation", "output"):
            assert not t[bname].float().isnan().any(), bname

    r = bind(g, w, graph_cache)
    r["tokens"].copy_(tokens)
    run_reference(g, r)
    torch.testing.assert_close(t["logits"], r["logits"], rtol=1e-4, atol=1e-4)
    assert torch.equal(t["next_tokens"], r["next_tokens"])
    torch.testing.assert_close(cache.k, graph_cache.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache.v, graph_cache.v, rtol=1e-4, atol=1e-4)

    logits = decode_step(SimpleNamespace(config=cfg, weights=w), ref_cache, tokens)
    torch.testing.assert_close(t["logits"], logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(t["next_tokens"], logits.argmax(-1).to(torch.int32))
    torch.testing.assert_close(cache.k, ref_cache.k, rtol=1e-4, atol=1e-4)
    assert torch.equal(cache.seq_lens, ref_cache.seq_lens)  # the step does not advance seq_lens


def test_graph_structure_and_bind():
    cfg = get_config("tiny-qwen3")
    B, S = 2, 16
    g = build_decode_graph(cfg, B, S, torch.bfloat16)
    assert g.meta["cfg"] is cfg and g.meta["batch"] == B and g.meta["max_seq_len"] == S
    assert g.meta["dtype"] == torch.bfloat16
    kinds = [op.kind for op in g.ops]
    layer = ["qkv_rope", "attn_partial", "attn_merge", "gemv_residual", "gate_up", "gemv_residual"]
    assert not g.meta["fuse_merge"] and kinds == ["embed"] + layer * cfg.n_layers + ["lm_head", "argmax"]
    assert all(f"attn.{i}" in g.buffers for i in range(cfg.n_layers))
    assert g.buffers["logits"].dtype == torch.float32 and g.buffers["next_tokens"].dtype == torch.int32
    assert all(t.bytes > 0 for t in g.tasks)
    deps = derive_dependencies(g)
    for op in g.ops:  # tiles of one op never depend on each other
        assert not set(op.task_ids) & {d for tid in op.task_ids for d in deps[tid]}, op.name
    # qkv of layer 1 waits for the down projection of layer 0 (through x.1)
    down0 = next(op for op in g.ops if op.name == "down.0")
    qkv1 = next(op for op in g.ops if op.name == "qkv_rope.1")
    assert set(down0.task_ids) <= set(deps[qkv1.task_ids[0]])

    w = random_weights(cfg, torch.bfloat16, seed=3)
    cache = KVCache(cfg, B, S, torch.bfloat16)
    t = bind(g, w, cache)
    assert set(t) == set(g.buffers)
    assert torch.equal(t["layers.1.wqkv"], torch.cat([w["layers.1.wq"], w["layers.1.wk"], w["layers.1.wv"]]))
    assert torch.equal(t["layers.0.w_gate_up"], torch.cat([w["layers.0.w_gate"], w["layers.0.w_up"]]))
    assert t["layers.1.k_cache"].data_ptr() == cache.k[1].data_ptr()
    assert t["seq_lens"] is cache.seq_lens
    assert t["x.0"].isnan().all() and t["logits"].isnan().all()
    assert t["lm_head"].data_ptr() == t["tok_embeddings"].data_ptr()  # tied embeddings stay one tensor
    with pytest.raises(InputError):
        bind(g, w, KVCache(cfg, B, S + 1, torch.bfloat16))


@pytest.mark.parametrize("change,match", [
    ({"head_dim": 24}, "head_dim"), ({"head_dim": 8}, "head_dim"), ({"head_dim": 512}, "head_dim"),
    ({"dim": 72}, "dim"), ({"ffn_dim": 100}, "ffn_dim"),
])
def test_unsupported_config(change, match):
    cfg = dataclasses.replace(get_config("tiny"), **change)
    with pytest.raises(UnsupportedModelError, match=match):
        build_decode_graph(cfg, 1, 16, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.float8_e4m3fn])
def test_unsupported_dtype(dtype):
    with pytest.raises(UnsupportedModelError, match="dtype"):
        build_decode_graph(get_config("tiny"), 1, 16, dtype)


def test_bad_batch():
    with pytest.raises(InputError):
        build_decode_graph(get_config("tiny"), 0, 16, torch.float32)


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-3.2-1b", "qwen3-0.6b"])
@pytest.mark.parametrize("workers", [132, 96, 66])
def test_megakernel_fit_tiling_gives_at_most_one_tile_per_worker(name, workers):
    """MegakernelRunner(tiles="fit") builds the graph with n_sm = W // 2 + 1: every row-tiled GEMV op whose
    BLOCK_N is not at its cap then has between W/2 and W tiles (no worker runs two tiles of one op)."""
    from onekernel.models.config import get_config
    cfg = get_config(name)
    g = build_decode_graph(cfg, 1, 512, torch.bfloat16, n_sm=workers // 2 + 1)
    for op in g.ops:
        if op.kind in ("gemv_residual", "gate_up", "oproj_merge") and op.params["BLOCK_N"] < 64:
            assert workers // 2 < op.n_tiles <= workers, (op.name, op.n_tiles)


def test_megakernel_rejects_unknown_tiling():
    from onekernel.exec.megakernel import MegakernelRunner
    from onekernel.models.load import load_model
    model = load_model("tiny", random_weights=True)
    cache = KVCache(model.config, 1, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="tiling"):
        MegakernelRunner(model, cache, 1, interpret=True, tiles="huge")


def test_fuse_merge_default_and_forced_paths():
    big = get_config("smollm2-135m")
    for B in (1, 5):  # off by default (measured slower), on when asked
        assert not build_decode_graph(big, B, 512, torch.bfloat16).meta["fuse_merge"]
        assert build_decode_graph(big, B, 512, torch.bfloat16, fuse_merge=True).meta["fuse_merge"]
    cfg = get_config("tiny")
    sep = build_decode_graph(cfg, 2, 16, torch.float32, fuse_merge=False)
    kinds = [op.kind for op in sep.ops if op.name.endswith(".0")]
    assert kinds == ["qkv_rope", "attn_partial", "attn_merge", "gemv_residual", "gate_up", "gemv_residual"]
    assert sep.buffers["attn.1"].shape == (2, cfg.n_heads * cfg.head_dim) and not sep.meta["fuse_merge"]
    fused = build_decode_graph(cfg, 2, 16, torch.float32, fuse_merge=True)
    assert len(fused.ops) == len(sep.ops) - cfg.n_layers and "attn.0" not in fused.buffers
    o = next(op for op in fused.ops if op.name == "o_proj.1")
    assert o.kind == "oproj_merge" and o.args == {"o_part": "attn_o.1", "lse_part": "attn_lse.1",
                                                   "w": "layers.1.wo", "res": "x.1", "out": "h.1"}
