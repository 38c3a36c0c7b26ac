"""Batch invariance: a batch row's outputs must not depend on the batch size B or on the other rows.

For every op kind, row r of a batch-5 (and for one op batch-16) launch must be bitwise equal (torch.equal)
to a batch-1 launch on row r's inputs alone, with the other rows holding different random data and every
output poisoned with NaN first; then a whole ``tiny`` decode step (eager executor) at B=1 vs B=4.

What this checks and what it does not: these tests run under the Triton interpreter (numpy, fp32), so they
check the *structure* of the kernels: tile shapes and split choices that do not depend on B (a different
BLOCK_K or SPLIT changes numpy's fp32 sums too), one reduction per row with no cross-row mixing, masks.
They cannot check the GPU's reduction order inside a ``tl.sum`` (that follows from the tensor layouts the
compiler picks, which the kernels keep B-independent by reducing [R, BLOCK_K] / [BLOCK_K] tiles per row;
see ops/gemv.py). The bitwise check on the GPU is the megakernel/eager B=8 vs B=1 generation run.
"""
import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from onekernel.exec.codegen import launch_op
from onekernel.graph.ir import Graph
from onekernel.models.decode_graph import OP_KINDS
from onekernel.models.load import load_model
from onekernel.ops.attention import add_attn_merge, add_attn_partial
from onekernel.ops.embed import add_embed
from onekernel.ops.gemv import add_gate_up, add_gemv_residual
from onekernel.ops.lm_head import add_lm_head
from onekernel.ops.oproj_merge import add_oproj_merge
from onekernel.ops.qkv import add_qkv_rope
from onekernel.ops.tiling import Tiling
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner

F32 = torch.float32
ROWS = (0, 3)  # the rows of the batch-5 launch compared with batch 1


def _graph(specs):
    """A graph with the given buffers declared, and their handles in declaration order."""
    g = Graph()
    return g, [g.add_buffer(name, shape, dtype, kind) for name, shape, dtype, kind in specs]


# Builders: B -> Graph with the op(s) added with their default tiling (n_sm small so that the default
# tiles have several row tiles and several BLOCK_K chunks). Every non-weight buffer has the batch as dim 0.
D, K_BIG = 80, 600  # K_BIG > 512 -> two BLOCK_K chunks, the last one partial
SMALL = Tiling(n_sm=2)


def b_gemv_residual(B, gemv="fma", dt=F32):
    N, K = 40, K_BIG
    g, (x, w, res) = _graph([("x", (B, K), dt, "activation"), ("w", (N, K), dt, "weight"),
                             ("res", (B, N), dt, "activation")])
    add_gemv_residual(g, "o", x, w, res, tiling=SMALL, gemv=gemv)
    return g


def b_gate_up(B, gemv="fma", dt=F32, tiling=SMALL, Fd=48, blocks=None):
    """gate_up over Fd rows per matrix and K = K_BIG; blocks: add_gate_up's overrides."""
    g, (x, nw, w) = _graph([("x", (B, K_BIG), dt, "activation"), ("nw", (K_BIG,), dt, "weight"),
                            ("w", (2 * Fd, K_BIG), dt, "weight")])
    add_gate_up(g, "gu", x, nw, w, eps=1e-5, tiling=tiling, gemv=gemv, blocks=blocks)
    return g


def b_gate_up_wave(B, gemv="fma", dt=F32):
    """gate_up in one wave (3 tiles on 4 SMs): on the tensor-core path its RMSNorm once per tile (PRENORM), pipelined
    (b_gate_up's 3 tiles on 2 SMs keep the in-loop form)."""
    g = b_gate_up(B, gemv, dt, Tiling(4, "cover"))
    assert g.ops[0].params["PRENORM"] == (gemv == "mma") and (gemv != "mma" or g.ops[0].n_tiles == 3)
    return g


def b_gate_up_rows(B, gemv="fma", dt=F32):
    """gate_up in tiles of 24 rows held in 32-row register tiles (ROWS < BLOCK_N: ops.tiling.gate_up_rows' form; the
    last tile 16 rows), in one wave: the rows past a tile's ROWS masked, PRENORM's scratch one row per 24-row tile."""
    g = b_gate_up(B, gemv, dt, Tiling(4, "cover"), Fd=40, blocks={"BLOCK_N": 32, "ROWS": 24})
    op = g.ops[0]
    assert op.n_tiles == 2 and op.params["PRENORM"] == (gemv == "mma")
    assert gemv != "mma" or g.buffers[op.args["xn"]].shape[1] == 2
    return g


def _b_qkv(B, qk_norm, gemv, dt, tiling=None, K=K_BIG):
    HQ, HKV, HD, S = 4, 2, 32, 64
    NH = HQ + 2 * HKV
    g, (x, nw, w, inv, sl, qn, kn, kc, vc) = _graph([
        ("x", (B, K), dt, "activation"), ("nw", (K,), dt, "weight"),
        ("w", (NH * HD, K), dt, "weight"), ("inv", (HD // 2,), F32, "weight"),
        ("seq_lens", (B,), torch.int32, "input"), ("qn", (HD,), dt, "weight"),
        ("kn", (HD,), dt, "weight"), ("kc", (B, HKV, S, HD), dt, "kv"), ("vc", (B, HKV, S, HD), dt, "kv")])
    norms = {"qn": qn, "kn": kn} if qk_norm else {}
    add_qkv_rope(g, "qkv", x, nw, w, inv, sl, kc, vc, eps=1e-6, gemv=gemv, **norms, **({"tiling": tiling} if tiling else {}))
    return g


def b_qkv_llama(B, gemv="fma", dt=F32):
    return _b_qkv(B, False, gemv, dt)


def b_qkv_qwen3(B, gemv="fma", dt=F32):
    return _b_qkv(B, True, gemv, dt)


def b_qkv_units(B, gemv="fma", dt=F32):
    """qkv_rope on 5 SMs: on the tensor-core path (``ops.qkv.qkv_tiles``) 32 units of 4 rotation pairs, 7 per tile
    (8 register slots, one dead), 5 tiles, the last holding 4."""
    g = _b_qkv(B, False, gemv, dt, Tiling(5, "cover"))
    p = g.ops[0].params
    assert (p["P"], p["U"], g.ops[0].n_tiles) == ((4, 7, 5) if gemv == "mma" else (p["P"], 1, g.ops[0].n_tiles))
    return g


def b_qkv_wide(B, gemv="fma", dt=F32):
    """qkv_rope over rows wider than one RMSNorm chunk (K = 4100 > ``NORM_CHUNK``, the last chunk partial): the
    tensor-core path's once-per-tile normalisation (``gemv_rows.rms_norm_rows``) sums and loads each row in chunks."""
    return _b_qkv(B, False, gemv, dt, K=4100)


def b_lm_head(B, gemv="fma", dt=F32):
    V = 100
    g, (x, nw, w) = _graph([("x", (B, K_BIG), dt, "activation"), ("nw", (K_BIG,), dt, "weight"),
                            ("w", (V, K_BIG), dt, "weight")])
    add_lm_head(g, "lm_head", x, nw, w, eps=1e-5, tiling=SMALL, gemv=gemv)
    return g


def _b_partials(B, dt=F32):
    """attn_partial over a 160-position cache (default split: 3 splits of 64; random seq_lens: empty splits)."""
    g, (q, kc, vc, sl) = _graph([("q", (B, 8, 16), dt, "activation"), ("kc", (B, 2, 160, 16), dt, "kv"),
                                 ("vc", (B, 2, 160, 16), dt, "kv"), ("seq_lens", (B,), torch.int32, "input")])
    return g, add_attn_partial(g, "attn", q, kc, vc, sl)


def b_attention(B):
    g, (o_part, lse_part) = _b_partials(B)
    add_attn_merge(g, "merge", o_part, lse_part, F32)
    return g


def b_oproj_merge(B, gemv="fma", dt=F32):
    """The partials, then the fused merge + O-projection, K = 8*16 = 128 in 4 chunks of 32, 2 splits per
    partials tile."""
    g, (o_part, lse_part) = _b_partials(B, dt)
    w = g.add_buffer("w", (40, 128), dt, "weight")
    res = g.add_buffer("res", (B, 40), dt, "activation")
    add_oproj_merge(g, "o", o_part, lse_part, w, res, tiling=SMALL, gemv=gemv, blocks={"BLOCK_K": 32, "CH": 2})
    return g


def b_embed(B):
    g, (tokens, table) = _graph([("tokens", (B,), torch.int32, "input"), ("table", (50, D), F32, "weight")])
    add_embed(g, "embed", tokens, table)
    return g


def b_allreduce(B, dt=F32):
    """Rank 1 of 3: its own partial, two peers' copies and the residual, summed per column tile."""
    from onekernel.ops.allreduce import add_allreduce, add_peer_buffer

    g, (x, res) = _graph([("x", (B, D), dt, "activation"), ("res", (B, D), dt, "activation")])
    add_allreduce(g, "ar", [add_peer_buffer(g, x, 0), x, add_peer_buffer(g, x, 2)], residual=res, tiling=SMALL)
    return g


BUILDERS = [b_gemv_residual, b_gate_up, b_qkv_llama, b_qkv_qwen3, b_lm_head, b_attention, b_oproj_merge, b_embed,
            b_allreduce]


def test_every_op_kind_is_covered():
    """A new op kind in the decode step needs a builder here (its batch invariance is checked below)."""
    covered = {op.kind.name for b in BUILDERS for op in b(2).ops}
    assert covered == {k.name for k in OP_KINDS}


def _written(g):
    return {r.buffer for op in g.ops for i in op.task_ids for r in g.tasks[i].writes}


def _inputs(g, gen):
    """Random inputs for every buffer; written non-KV buffers poisoned (NaN / -1)."""
    written = _written(g)
    t = {}
    for name, b in g.buffers.items():
        if name in written and b.kind != "kv":
            t[name] = torch.full(b.shape, float("nan"), dtype=b.dtype) if b.dtype.is_floating_point else \
                torch.full(b.shape, -1, dtype=b.dtype)
        elif name == "seq_lens":
            S = next(bb.shape[-2] for n, bb in g.buffers.items() if bb.kind == "kv")
            t[name] = torch.randint(0, S, b.shape, generator=gen, dtype=torch.int32)
        elif name == "tokens":
            t[name] = torch.randint(0, g.buffers["table"].shape[0], b.shape, generator=gen, dtype=torch.int32)
        elif name in ("nw", "qn", "kn"):
            t[name] = (1 + 0.1 * torch.randn(b.shape, generator=gen)).to(b.dtype)
        else:
            t[name] = (torch.randn(b.shape, generator=gen) * (0.2 if b.kind == "weight" else 1.0)).to(b.dtype)
    return t


def _run(g, t):
    for op in g.ops:
        launch_op(g, op, t)
    return t


def _check_rows(builder, B, rows, seed, **kw):
    """Row r (of ``rows``) of a batch-B launch equals a batch-1 launch of row r, bitwise; kw: the builder's
    options (gemv)."""
    gen = torch.Generator().manual_seed(seed)
    gb = builder(B, **kw)
    tb = _inputs(gb, gen)
    g1 = builder(1, **kw)
    # the batch-1 runs get row r's inputs (weights shared); fresh poisoned outputs
    singles = {}
    for r in rows:
        t1 = {n: (v.clone() if g1.buffers[n].kind == "weight" else v[r:r + 1].clone()) for n, v in tb.items()}
        singles[r] = _run(g1, t1)
    _run(gb, tb)
    for op1, opb in zip(g1.ops, gb.ops):  # only the batch block may differ between the two graphs
        diff = {k for k in op1.params if op1.params[k] != opb.params[k]}
        assert diff <= {"B", "BLOCK_B"}, f"{op1.kind.name}: tile params depend on B: {sorted(diff)}"
    for r in rows:
        for n in _written(g1):
            a, b = tb[n][r], singles[r][n][0]
            assert not (a.is_floating_point() and torch.isnan(a).any()), f"{n}[{r}] not written"
            assert torch.equal(a, b), f"{builder.__name__}: {n}[{r}] at B={B} differs from B=1 " \
                f"(max |diff| {(a.double() - b.double()).abs().max().item():.3g})"


@pytest.mark.parametrize("builder", BUILDERS, ids=[b.__name__[2:] for b in BUILDERS])
def test_op_row_matches_batch1(builder):
    _check_rows(builder, 5, ROWS, seed=zlib.crc32(builder.__name__.encode()))


@pytest.mark.parametrize("builder", [b_gate_up, b_qkv_qwen3], ids=["gate_up", "qkv_qwen3"])
def test_op_row_matches_batch1_b16(builder):
    _check_rows(builder, 16, (0, 11, 15), seed=16)


def test_oproj_merge_every_row_of_b3_matches_batch1():
    _check_rows(b_oproj_merge, 3, (0, 1, 2), seed=3)


def _b_gate_up_limit(B, dt=F32):
    """gate_up with the production tiling rule (``ops.tiling.gate_up_rows``) on 2 SMs of the separate kernels'
    tensor-core path: 96 rows per matrix are 3 tiles of 32 rows, more than one wave, so batch <= 2 takes 4 tiles of
    24 rows in 32-row register tiles and batch 3+ keeps the 3 tiles of 32."""
    return b_gate_up(B, "mma", dt, Tiling(2, "cover"), Fd=96)


def test_gate_up_rows_across_the_batch_limit(monkeypatch):
    """``tiling.gate_up_rows`` picks gate_up's rows by batch (sessions 34-35: evened-out rows up to batch 2, the
    power-of-two tiles past it). The two sides differ in ROWS alone (the same register tiles, chunks and loop), and
    each sequence of a batch-3 launch (3 tiles of 32 rows) equals its batch-1 launch (4 tiles of 24) and the PyTorch
    reference within fp32 rounding; batch 2 takes batch 1's tiles. Not bitwise here: numpy's matmul, the
    interpreter's tl.dot, rounds a row differently at another position in the tile (a [32, K] @ [K, 16] product's
    rows 24-31 against the same rows at 0-7). On the GPU the same launches are bitwise equal in bf16
    (tests/test_mma_gpu.py), and the H200 check of bitwise batch invariance (scripts/invariance_check.py, batch 8 and
    16 against batch 1 on Llama-3.1-8B graph) crosses it.
    ONEKERNEL_GATE_UP_ROWS=0 keeps the power-of-two tiles at every batch."""
    g1, g3 = _b_gate_up_limit(1), _b_gate_up_limit(3)
    p1, p3 = g1.ops[0].params, g3.ops[0].params
    assert (g1.ops[0].n_tiles, p1["BLOCK_N"], p1["ROWS"]) == (4, 32, 24)
    assert (g3.ops[0].n_tiles, p3["BLOCK_N"], p3["ROWS"]) == (3, 32, 0)
    assert {k for k in p1 if p1[k] != p3[k]} == {"B", "ROWS"} and not p1["PRENORM"]
    assert _b_gate_up_limit(2).ops[0].params["ROWS"] == 24
    gen = torch.Generator().manual_seed(34)
    t3 = _inputs(g3, gen)
    _run(g3, t3)
    for r in (0, 1, 2):
        t1 = {n: (v.clone() if g1.buffers[n].kind == "weight" else v[r:r + 1].clone()) for n, v in t3.items()}
        t1["gu.out"].fill_(float("nan"))
        ref = {n: v.clone() for n, v in t1.items()}
        _run(g1, t1)
        assert not torch.isnan(t1["gu.out"]).any()
        torch.testing.assert_close(t3["gu.out"][r], t1["gu.out"][0], rtol=2e-6, atol=2e-5)
        g1.ops[0].kind.reference(g1.ops[0], ref)
        torch.testing.assert_close(t1["gu.out"], ref["gu.out"], rtol=1e-5, atol=1e-4)
    monkeypatch.setenv("ONEKERNEL_GATE_UP_ROWS", "0")
    g0 = _b_gate_up_limit(1)
    assert (g0.ops[0].n_tiles, g0.ops[0].params["ROWS"]) == (3, 0)


def test_gate_up_rows_outside_the_register_tile_are_refused():
    """A ROWS override above the tile's BLOCK_N register rows (rows never written) or below 0 is one ValueError."""
    for blocks in ({"ROWS": 128}, {"BLOCK_N": 16, "ROWS": 24}, {"BLOCK_N": 32, "ROWS": -8}):
        with pytest.raises(ValueError, match="ROWS"):
            b_gate_up(2, "mma", F32, Tiling(2, "cover"), Fd=100, blocks=blocks)


# Every GEMV op, on the tensor-core path (ops/gemv_mma.py: the batch padded to 16 columns for every B).
MMA_BUILDERS = [b_gemv_residual, b_gate_up, b_gate_up_wave, b_gate_up_rows, b_qkv_llama, b_qkv_qwen3, b_qkv_units,
                b_qkv_wide, b_lm_head, b_oproj_merge]


def test_every_gemv_kind_has_an_mma_builder():
    """Every op kind with an MMA switch is checked on that path below."""
    covered = {op.kind.name for b in MMA_BUILDERS for op in b(2, gemv="mma").ops if op.params.get("MMA")}
    assert covered == {k.name for k in OP_KINDS if "MMA" in k.consts}


@pytest.mark.parametrize("builder", MMA_BUILDERS, ids=[b.__name__[2:] for b in MMA_BUILDERS])
def test_mma_op_row_matches_batch1(builder):
    _check_rows(builder, 5, ROWS, seed=zlib.crc32(builder.__name__.encode()) + 1, gemv="mma")


def test_decode_step_tiny_b4_row_matches_b1():
    model = load_model("tiny", random_weights=True, seed=7)
    cfg = model.config
    gen = torch.Generator().manual_seed(7)
    c1 = KVCache(cfg, 1, 40, F32, "cpu")
    c4 = KVCache(cfg, 4, 40, F32, "cpu")
    for c in (c1, c4):
        c.k.normal_(generator=gen)
        c.v.normal_(generator=gen)
    c4.seq_lens.copy_(torch.tensor([5, 31, 17, 0], dtype=torch.int32))
    c1.k[:, 0] = c4.k[:, 2]
    c1.v[:, 0] = c4.v[:, 2]
    c1.seq_lens[0] = c4.seq_lens[2]
    tok4 = torch.randint(0, cfg.vocab_size, (4,), generator=gen, dtype=torch.int32)
    tok1 = tok4[2:3].clone()
    r1 = make_step_runner("eager", model, c1, interpret=True)
    r4 = make_step_runner("eager", model, c4, interpret=True)
    for r in (r1, r4):
        r.tensors[r.bound.logits].fill_(float("nan"))
        r.tensors[r.bound.next_tokens].fill_(-1)
    lg1, nt1 = r1.step(tok1)
    lg4, nt4 = r4.step(tok4)
    assert not torch.isnan(lg1).any()
    assert torch.equal(lg4[2], lg1[0])
    assert nt4[2].item() == nt1[0].item()
    assert torch.equal(c4.k[:, 2], c1.k[:, 0]) and torch.equal(c4.v[:, 2], c1.v[:, 0])


def test_rmsnorm_pass_in_chunks_and_row_groups(monkeypatch):
    """The RMSNorm pass's runtime loops (ops/gemv_rows.py ``rms_rstd``): K = 600 in 3 chunks (NORM_CHUNK made 256;
    the benchmark models need one) and 5 rows in groups of 4 (the last group masked): each row equals its
    batch-1 run and the PyTorch reference."""
    import triton.language as tl

    from onekernel.ops import gemv_rows

    monkeypatch.setattr(gemv_rows, "NORM_CHUNK", tl.constexpr(256))
    _check_rows(b_gate_up, 5, (0, 3, 4), seed=5)
    g = b_gate_up(5)
    t = _inputs(g, torch.Generator().manual_seed(6))
    want = {n: v.clone() for n, v in t.items()}
    g.ops[0].kind.reference(g.ops[0], want)
    _run(g, t)
    torch.testing.assert_close(t["gu.out"], want["gu.out"], rtol=1e-5, atol=1e-5)
