"""decode_graph + build_decode_step + run_reference, and one full decode step of the tiny configs with every
op launched as its own kernel (Triton interpreter, fp32), compared to the graph reference and to the
independent reference decoder ``onekernel.runtime.reference.decode_one_token``."""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from onekernel.errors import InputError, UnsupportedModelError
from onekernel.exec.codegen import launch_op
from onekernel.graph.deps import derive_dependencies
from onekernel.models.config import get_config, rope_inv_freq
from onekernel.models.decode_graph import build_decode_step, decode_graph
from onekernel.models.random_init import random_weights
from onekernel.ops.base import run_reference
from onekernel.ops.tiling import MMA_MIN, SM90_SMEM, Tiling, cdiv
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import decode_one_token

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
LAYER = ["qkv_rope", "attn_partial", "attn_merge", "gemv_residual", "gate_up", "gemv_residual"]


def _setup(cfg, B, S, seed):
    g = torch.Generator().manual_seed(seed)
    w = random_weights(cfg, torch.float32, seed=seed)
    cache = KVCache(cfg, B, S, torch.float32)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    lens = torch.randint(0, S - 1, (B,), dtype=torch.int32, generator=g)
    lens[0] = 0  # first token of a sequence
    if B > 1:
        lens[-1] = S - 1  # last cache row
    cache.seq_lens.copy_(lens)
    tokens = torch.randint(0, cfg.vocab_size, (B,), dtype=torch.int32, generator=g)
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
def test_decode_step_matches_references(name, B, scaling, fuse, seed):
    cfg = dataclasses.replace(get_config(name), rope_scaling=scaling)
    S = 40
    w, cache, tokens = _setup(cfg, B, S, seed)
    ref_cache, graph_cache = _clone_cache(cache), _clone_cache(cache)

    step = build_decode_step(cfg, w, cache, tiling=Tiling(16), fuse_merge=fuse)
    g, t = step.graph, step.tensors
    assert ("attn_merge.0.out" in g.buffers) != fuse
    t[step.tokens].copy_(tokens)
    for op in g.ops:
        launch_op(g, op, t)
    for bname, buf in g.buffers.items():  # every activation/output was written (poison gone)
        if buf.kind in ("activation", "output"):
            assert not t[bname].float().isnan().any(), bname

    r = build_decode_step(cfg, w, graph_cache, tiling=Tiling(16), fuse_merge=fuse).tensors
    r[step.tokens].copy_(tokens)
    run_reference(g, r)
    torch.testing.assert_close(t[step.logits], r[step.logits], rtol=1e-4, atol=1e-4)
    assert torch.equal(t[step.next_tokens], r[step.next_tokens])
    torch.testing.assert_close(cache.k, graph_cache.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache.v, graph_cache.v, rtol=1e-4, atol=1e-4)

    logits = decode_one_token(cfg, w, ref_cache.k, ref_cache.v, ref_cache.seq_lens, tokens, rope_inv_freq(cfg))
    torch.testing.assert_close(t[step.logits], logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(t[step.next_tokens], logits.argmax(-1).to(torch.int32))
    torch.testing.assert_close(cache.k, ref_cache.k, rtol=1e-4, atol=1e-4)
    assert torch.equal(cache.seq_lens, ref_cache.seq_lens)  # the step does not advance seq_lens


def test_graph_structure_and_binding():
    cfg = get_config("tiny-qwen3")
    B, S = 2, 16
    w = random_weights(cfg, torch.bfloat16, seed=3)
    cache = KVCache(cfg, B, S, torch.bfloat16)
    step = build_decode_step(cfg, w, cache)
    g, t = step.graph, step.tensors
    assert g.meta["model"] == cfg.name and g.meta["batch"] == B and g.meta["max_seq_len"] == S
    assert g.meta["dtype"] == torch.bfloat16 and step.batch == B
    kinds = [op.kind.name for op in g.ops]
    assert not g.meta["fuse_merge"] and kinds == ["embed"] + LAYER * cfg.n_layers + ["lm_head", "argmax"]
    assert g.buffers[step.logits].dtype == torch.float32 and g.buffers[step.next_tokens].dtype == torch.int32
    assert all(task.bytes > 0 for task in g.tasks)
    deps = derive_dependencies(g)
    for op in g.ops:  # tiles of one op never depend on each other
        assert not set(op.task_ids) & {d for tid in op.task_ids for d in deps[tid]}, op.name
    # qkv of layer 1 waits for the down projection of layer 0 (through its output)
    down0 = next(op for op in g.ops if op.name == "down.0")
    qkv1 = next(op for op in g.ops if op.name == "qkv_rope.1")
    assert qkv1.args["x"] == down0.args["out"] and set(down0.task_ids) <= set(deps[qkv1.task_ids[0]])

    assert set(t) == set(g.buffers)
    assert torch.equal(t["layers.1.wqkv"], torch.cat([w["layers.1.wq"], w["layers.1.wk"], w["layers.1.wv"]]))
    assert torch.equal(t["layers.0.w_gate_up"], torch.cat([w["layers.0.w_gate"], w["layers.0.w_up"]]))
    assert t["layers.1.k_cache"].data_ptr() == cache.k[1].data_ptr()
    assert t["seq_lens"] is cache.seq_lens
    assert t[qkv1.args["x"]].isnan().all() and t[step.logits].isnan().all()
    assert t["lm_head"].data_ptr() == t["tok_embeddings"].data_ptr()  # tied embeddings stay one tensor

    # a moved cache is re-pointed once, on the next repoint(); an unmoved one is not
    assert not step.repoint()
    cache.reallocate()
    assert step.repoint() and not step.repoint()
    assert t["layers.1.v_cache"].data_ptr() == cache.v[1].data_ptr() and t["seq_lens"] is cache.seq_lens


def test_binding_errors():
    cfg = get_config("tiny")
    w = random_weights(cfg, torch.float32, seed=3)
    with pytest.raises(InputError, match="does not match"):
        build_decode_step(cfg, w, KVCache(get_config("tiny-qwen3"), 1, 16))
    del w["layers.1.wk"]
    with pytest.raises(InputError, match="layers.1.wk"):
        build_decode_step(cfg, w, KVCache(cfg, 1, 16))


@pytest.mark.parametrize("change,match", [
    ({"head_dim": 24}, "head_dim"), ({"head_dim": 8}, "head_dim"), ({"head_dim": 512}, "head_dim"),
    ({"dim": 72}, "dim"), ({"ffn_dim": 100}, "ffn_dim"),
])
def test_unsupported_config(change, match):
    cfg = dataclasses.replace(get_config("tiny"), **change)
    with pytest.raises(UnsupportedModelError, match=match):
        decode_graph(cfg, 1, 16, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.float8_e4m3fn])
def test_unsupported_dtype(dtype):
    with pytest.raises(UnsupportedModelError, match="dtype"):
        decode_graph(get_config("tiny"), 1, 16, dtype)


@pytest.mark.parametrize("batch", [0, 17])
def test_bad_batch(batch):
    with pytest.raises(InputError, match="batch"):
        decode_graph(get_config("tiny"), batch, 16, torch.float32)


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-3.2-1b", "qwen3-0.6b"])
@pytest.mark.parametrize("sms", [132, 96, 66])
def test_fit_tiling_gives_at_most_one_tile_per_sm(name, sms):
    """Tiling(n, "fit") (the megakernel's, one worker per SM): every row-tiled GEMV op whose BLOCK_N is not at
    its cap has between n/2 and n tiles (no worker runs two tiles of one op); "cover" has at least n where
    BLOCK_N is above its minimum on the CUDA cores (4 rows), and on the tensor cores (Llama-3.2-1B) the same single
    wave of tiles as "fit" (``Tiling.gemv_min_tiles``), but for a gate_up whose power-of-two tiles take more than one
    wave (Llama-3.2-1B at 96 SMs), which ``tiling.gate_up_rows`` evens out over two CTAs a SM; qkv_rope's one wave of
    units (``ops.qkv.qkv_tiles``) within it."""
    cfg = get_config(name)
    fit, _, _ = decode_graph(cfg, 1, 512, torch.bfloat16, tiling=Tiling(sms, "fit"))
    cover, _, _ = decode_graph(cfg, 1, 512, torch.bfloat16, tiling=Tiling(sms, "cover"))
    for f, c in zip(fit.ops, cover.ops):
        if f.kind.name in ("gemv_residual", "gate_up", "lm_head") and f.params["BLOCK_N"] < 64:
            assert f.n_tiles <= sms, (f.name, f.n_tiles)
            # more than half the SMs, unless the tiles already have tl.dot's 16 rows (Qwen3-0.6B's o_proj: 1024 / 16)
            assert f.n_tiles > sms // 2 or (f.params["MMA"] and f.params["BLOCK_N"] == MMA_MIN), (f.name, f.n_tiles)
        if c.kind.name == "gate_up" and c.params["MMA"] and c.params["ROWS"]:  # tiling.gate_up_rows: 2 CTAs a SM
            assert sms < c.n_tiles <= 2 * sms and c.params["ROWS"] < c.params["BLOCK_N"], (c.name, c.n_tiles)
            assert cdiv(c.params["N"], c.params["BLOCK_N"]) > sms, (c.name, c.n_tiles)
        elif c.kind.name in ("gemv_residual", "gate_up", "lm_head") and c.params["MMA"]:
            assert c.n_tiles == f.n_tiles, (c.name, c.n_tiles, f.n_tiles)
        elif c.kind.name == "qkv_rope" and c.params["MMA"]:  # qkv_tiles: one wave of units, U > 1
            assert f.n_tiles <= c.n_tiles <= sms and f.params["U"] == 1, (c.name, c.n_tiles, f.n_tiles)
        elif c.kind.name in ("gemv_residual", "gate_up", "lm_head") and c.params["BLOCK_N"] > 4:
            assert c.n_tiles >= sms, (c.name, c.n_tiles)


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.1-8b", "qwen3-8b"])
def test_separate_tensor_core_gemvs_take_the_measured_chunks(name):
    """The separate kernels' tensor-core GEMVs (Tiling "cover"): qkv_rope with its RMSNorm once per tile (PRENORM) and
    ``tiling.prenorm_pipeline``'s depth (4 deep on an H200, its shared memory within the CTA's share; 3 deep of 128
    columns for a 64-row tile on a 99 KB GPU), gate_up the same where it is one wave of tiles (Llama-3.2-1B) and in
    registers with the in-loop RMSNorm where it is not (the 8B models: 224 / 192 tiles of 64 rows, and at batch 1-2
    ``tiling.gate_up_rows``' 256 tiles of 56 / 48 rows), the residual GEMVs DEEP; the megakernel's tiles ("fit")
    keep the depths they had (qkv_rope and gate_up below 64 rows in registers, chunks of 8192 / 4096) and never
    PRENORM. At every batch the same but gate_up's rows."""
    cfg = get_config(name)
    for smem in (SM90_SMEM, 101376):
        for b in (1, 16):
            cover, _, _ = decode_graph(cfg, b, 512, torch.bfloat16, tiling=Tiling(132, "cover", smem))
            fit, _, _ = decode_graph(cfg, b, 512, torch.bfloat16, tiling=Tiling(132, "fit", smem))
            for c, f in zip(cover.ops, fit.ops):
                k, cp = c.kind.name, c.params
                if k == "qkv_rope":
                    rows = 2 * cp["P"] * (1 << (cp["U"] - 1).bit_length())  # the tile's register rows
                    assert cp["PRENORM"] and (cp["STAGES"] + 1) * (rows + 16) * cp["BLOCK_K"] * 2 <= smem, cp
                    # (rows: H200, 99 KB): 1B's 32-row tiles, 8B's 64, Qwen3-8B's whole heads of 128
                    want = {32: ((4, 256), (3, 256)), 64: ((4, 256), (3, 128)), 128: ((4, 128), (4, 64))}[rows]
                    assert (cp["STAGES"], cp["BLOCK_K"]) == want[smem != SM90_SMEM], cp
                    assert not f.params["PRENORM"] and f.params["STAGES"] == 0
                    assert 2 * f.params["P"] * f.params["BLOCK_K"] <= 8192, f.params
                elif k == "gate_up":
                    if c.n_tiles <= 132:
                        assert cp["PRENORM"] and cp["STAGES"] >= 3, cp
                        assert (cp["STAGES"] + 1) * (2 * cp["BLOCK_N"] + 16) * cp["BLOCK_K"] * 2 <= smem, cp
                    else:
                        assert not cp["PRENORM"] and cp["STAGES"] == 0 and cp["BLOCK_N"] * cp["BLOCK_K"] <= 8192, cp
                    assert not f.params["PRENORM"] and f.params["STAGES"] == (5 if f.params["BLOCK_N"] >= 64 else 0)
                    assert f.params["BLOCK_N"] * f.params["BLOCK_K"] <= 4096, f.params
                elif k == "gemv_residual":
                    assert cp["STAGES"] == f.params["STAGES"] == 5
                if k in ("qkv_rope", "gate_up", "gemv_residual"):
                    assert cp["MMA"] and f.params["MMA"]
    gate_up = next(op for op in cover.ops if op.kind.name == "gate_up")  # batch 16
    assert gate_up.params["PRENORM"] == (name == "llama-3.2-1b")  # 8B and Qwen3-8B: 224 / 192 tiles, two waves
    # tiling.gate_up_rows: (tiles, ROWS) at batch 1-2, then at batch 3-16
    small, big = {"llama-3.2-1b": ((128, 0), (128, 0)), "llama-3.1-8b": ((256, 56), (224, 0)),
                  "qwen3-8b": ((256, 48), (192, 0))}[name]
    for b in (1, 2, 3, 16):
        g, _, _ = decode_graph(cfg, b, 512, torch.bfloat16, tiling=Tiling(132, "cover"))
        op = next(op for op in g.ops if op.kind.name == "gate_up")
        assert (op.n_tiles, op.params["ROWS"], op.params["BLOCK_N"]) == (*(small if b <= 2 else big), 64), (name, b)


def test_unknown_tiling_is_refused():
    with pytest.raises(InputError, match="tiling"):
        Tiling(132, "huge")


def test_fuse_merge_default_and_forced_paths():
    big = get_config("smollm2-135m")
    for B in (1, 5):  # off by default (measured slower), on when asked
        assert not decode_graph(big, B, 512, torch.bfloat16)[0].meta["fuse_merge"]
        assert decode_graph(big, B, 512, torch.bfloat16, fuse_merge=True)[0].meta["fuse_merge"]
    cfg = get_config("tiny")
    sep, _, _ = decode_graph(cfg, 2, 16, torch.float32, fuse_merge=False)
    assert [op.kind.name for op in sep.ops if op.name.endswith(".0")] == LAYER
    assert sep.buffers["attn_merge.1.out"].shape == (2, cfg.n_heads * cfg.head_dim)
    fused, _, _ = decode_graph(cfg, 2, 16, torch.float32, fuse_merge=True)
    assert len(fused.ops) == len(sep.ops) - cfg.n_layers and "attn_merge.0.out" not in fused.buffers
    o = next(op for op in fused.ops if op.name == "o_proj.1")
    assert o.kind.name == "oproj_merge" and o.args == {
        "o_part": "attn_partial.1.o_part", "lse_part": "attn_partial.1.lse_part", "w": "layers.1.wo",
        "res": "down.0.out", "out": "o_proj.1.out"}
