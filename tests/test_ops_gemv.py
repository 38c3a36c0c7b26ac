"""Tile functions of embed / qkv_rope / gemv_residual / gate_up / lm_head / argmax under the Triton interpreter.

Every op is launched with ``launch_op`` (one program per tile) on fresh random fp32 inputs, outputs poisoned
with NaN first; every element is compared to (a) the op's PyTorch reference and (b) a plain formula written
here. Shapes are awkward on purpose: N and K not multiples of the tile, batch 1, 3 and 16 (the CUDA-core
path; the tensor-core path: tests/test_ops_mma.py).
"""
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import triton
import triton.language as tl

from onekernel.exec.codegen import launch_op
from onekernel.graph.deps import derive_dependencies
from onekernel.graph.ir import Graph
from onekernel.models.config import get_config, rope_inv_freq
from onekernel.ops.embed import add_embed
from onekernel.ops.gemv import add_gate_up, add_gemv_residual
from onekernel.ops.gemv_rows import rnd
from onekernel.ops.lm_head import add_lm_head
from onekernel.ops.qkv import add_qkv_rope

F32 = torch.float32
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _graph(specs):
    """A graph with the given buffers declared, and their handles in declaration order."""
    g = Graph()
    return g, [g.add_buffer(name, shape, dtype, kind) for name, shape, dtype, kind in specs]


def _poison(g, t):
    for name, b in g.buffers.items():
        if b.kind in ("activation", "output", "scratch") and name not in t:
            t[name] = torch.full(b.shape, float("nan")) if b.dtype.is_floating_point else \
                torch.full(b.shape, -1, dtype=b.dtype)
    return t


def _run_both(g, t):
    """Launch every op (kernels) on t and every reference on a copy; return (kernel, reference) dicts."""
    r = {k: v.clone() for k, v in t.items()}
    for op in g.ops:
        launch_op(g, op, t)
        op.kind.reference(op, r)
    return t, r


def _close(a, b, tol=2e-5):
    assert not torch.isnan(a).any()
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _tiles_disjoint(g):
    """No two tiles of one op write overlapping regions (else the op would depend on itself)."""
    deps = derive_dependencies(g)
    for op in g.ops:
        ids = set(op.task_ids)
        for tid in op.task_ids:
            assert not ids & set(deps[tid]), f"{op.name}: tile {tid} depends on a tile of its own op"


@pytest.mark.parametrize("B", [1, 3, 16])
def test_gemv_residual(B, seed):
    torch.manual_seed(seed)
    N, K = 40, 80  # BLOCK_N 16 -> 3 tiles (last partial); BLOCK_K 32 -> 3 chunks (last partial)
    g, (x, w, res) = _graph([("x", (B, K), F32, "activation"), ("w", (N, K), F32, "weight"),
                             ("res", (B, N), F32, "activation")])
    out = add_gemv_residual(g, "o", x, w, res, blocks={"BLOCK_N": 16, "BLOCK_K": 32}).name
    t = _poison(g, {"x": torch.randn(B, K), "w": torch.randn(N, K) * 0.1, "res": torch.randn(B, N)})
    k, r = _run_both(g, t)
    _close(k[out], r[out])
    _close(k[out], t["res"] + t["x"] @ t["w"].T)
    _tiles_disjoint(g)


@pytest.mark.parametrize("B", [1, 3, 16])
def test_gate_up(B, seed):
    torch.manual_seed(seed)
    Fd, K, eps = 48, 80, 1e-5
    g, (x, nw, w) = _graph([("x", (B, K), F32, "activation"), ("nw", (K,), F32, "weight"),
                            ("w", (2 * Fd, K), F32, "weight")])
    act = add_gate_up(g, "gu", x, nw, w, eps=eps, blocks={"BLOCK_N": 32 if B == 1 else 16, "BLOCK_K": 64}).name
    t = _poison(g, {"x": torch.randn(B, K) * 3, "nw": 1 + 0.1 * torch.randn(K), "w": torch.randn(2 * Fd, K) * 0.2})
    k, r = _run_both(g, t)
    _close(k[act], r[act])
    h = _rms(t["x"], t["nw"], eps)
    gate, up = h @ t["w"][:Fd].T, h @ t["w"][Fd:].T
    _close(k[act], gate * torch.sigmoid(gate) * up)
    _tiles_disjoint(g)


@pytest.mark.parametrize("B", [1, 3])
def test_embed(B, seed):
    torch.manual_seed(seed)
    V, D = 50, 80
    g, (tokens, table) = _graph([("tokens", (B,), torch.int32, "input"), ("table", (V, D), F32, "weight")])
    x = add_embed(g, "embed", tokens, table, block_d=32).name
    t = _poison(g, {"tokens": torch.randint(0, V, (B,), dtype=torch.int32), "table": torch.randn(V, D)})
    k, r = _run_both(g, t)
    assert torch.equal(k[x], r[x]) and torch.equal(k[x], t["table"][t["tokens"].long()])


def _rope(x, pos, inv):  # x [B, H, hd], pos [B]: plain rotate-half RoPE written out
    half = x.shape[-1] // 2
    f = pos.double()[:, None, None] * inv.double()[None, None, :]
    c, s = torch.cos(f).float(), torch.sin(f).float()
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1)


QKV_CASES = [  # (name, B, qk_norm, rope_scaling, P or (P, U) override, positions)
    ("llama-B1", 1, False, None, None, [97]),
    ("llama-B3-3-units-per-tile", 3, False, LLAMA3, (4, 3), [97, 0, 33]),  # 32 units: 11 tiles, the last of 2
    ("llama3-scaled-B3-chunked", 3, False, LLAMA3, 8, [0, 97, 5]),
    ("qwen3-B3", 3, True, None, None, [97, 0, 33]),
    ("qwen3-B16", 16, True, LLAMA3, None, list(range(0, 98, 6))[:15] + [97]),
    ("llama-B16-chunked", 16, False, None, 8, [97] * 8 + [0] * 8),
]


@pytest.mark.parametrize("case", QKV_CASES, ids=[c[0] for c in QKV_CASES])
def test_qkv_rope(case, seed):
    name, B, qk, scaling, P, positions = case
    torch.manual_seed(seed)
    cfg = dataclasses.replace(get_config("tiny"), head_dim=32, rope_scaling=scaling, qk_norm=qk)
    HQ, HKV, HD, D, S, eps = 4, 2, 32, 80, 128, 1e-6
    NH = HQ + 2 * HKV
    g, (x, nw, w, inv, sl, qn, kn, kc, vc) = _graph([
        ("x", (B, D), F32, "activation"), ("nw", (D,), F32, "weight"), ("w", (NH * HD, D), F32, "weight"),
        ("inv", (HD // 2,), F32, "weight"), ("seq_lens", (B,), torch.int32, "input"), ("qn", (HD,), F32, "weight"),
        ("kn", (HD,), F32, "weight"), ("kc", (B, HKV, S, HD), F32, "kv"), ("vc", (B, HKV, S, HD), F32, "kv")])
    P, U = P if isinstance(P, tuple) else (P, 1)
    q = add_qkv_rope(g, "qkv", x, nw, w, inv, sl, kc, vc, eps=eps, **({"qn": qn, "kn": kn} if qk else {}),
                     blocks={"BLOCK_K": 32, **({"P": P, "U": U} if P else {})}).name
    op = g.ops[0]
    assert op.n_tiles == -(-NH * (HD // (2 * op.params["P"])) // U) and op.params["QK_NORM"] is qk
    pos = torch.tensor(positions, dtype=torch.int32)
    t = _poison(g, {"x": torch.randn(B, D), "nw": 1 + 0.1 * torch.randn(D), "w": torch.randn(NH * HD, D) * 0.2,
                    "inv": rope_inv_freq(cfg), "seq_lens": pos, "qn": 1 + 0.1 * torch.randn(HD),
                    "kn": 1 + 0.1 * torch.randn(HD), "kc": torch.randn(B, HKV, S, HD),
                    "vc": torch.randn(B, HKV, S, HD)})
    kc0, vc0 = t["kc"].clone(), t["vc"].clone()
    k, r = _run_both(g, t)
    for name_ in (q, "kc", "vc"):
        _close(k[name_], r[name_])
    # independent formula
    y = (_rms(t["x"], t["nw"], eps) @ t["w"].T).view(B, NH, HD)
    qh, kh, vh = y[:, :HQ], y[:, HQ:HQ + HKV], y[:, HQ + HKV:]
    if qk:
        qh, kh = _rms(qh, t["qn"], eps), _rms(kh, t["kn"], eps)
    inv = rope_inv_freq(cfg)
    if scaling:
        assert not torch.allclose(inv, rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None)))
    _close(k[q], _rope(qh, pos, inv), 1e-4)
    b = torch.arange(B)
    kc0[b, :, pos.long()] = _rope(kh, pos, inv)
    vc0[b, :, pos.long()] = vh
    _close(k["kc"], kc0, 1e-4)  # also checks that no other cache row changed
    _close(k["vc"], vc0, 1e-4)
    _tiles_disjoint(g)


@pytest.mark.parametrize("B,block_t", [(1, 2), (3, None), (16, 4)])
def test_lm_head_argmax(B, block_t, seed):
    torch.manual_seed(seed)
    V, K, eps = 100, 48, 1e-5  # BLOCK_N 16 -> 7 tiles, last one partial
    g, (xb, nwb, wb) = _graph([("x", (B, K), F32, "activation"), ("nw", (K,), F32, "weight"),
                               ("w", (V, K), F32, "weight")])
    lg_b, nt_b = add_lm_head(g, "lm_head", xb, nwb, wb, eps=eps,
                             blocks={"BLOCK_N": 16, "BLOCK_K": 32, "BLOCK_T": block_t})
    lg_n, nt_n = lg_b.name, nt_b.name
    x = torch.randn(B, K)
    w = torch.randn(V, K) * 0.1
    # exact ties across tiles: rows 37, 90 and 99 (last, partial tile) are the same strong row -> argmax 37
    w[37] = w[90] = w[99] = 4 * _rms(x[0], torch.ones(K), eps) / K ** 0.5
    t = _poison(g, {"x": x, "nw": torch.ones(K), "w": w})
    k, r = _run_both(g, t)
    for name in (lg_n, "lm_head.pmax", "lm_head.pidx", nt_n):
        _close(k[name].float(), r[name].float())
    logits = _rms(x, t["nw"], eps) @ w.T
    _close(k[lg_n], logits)
    assert torch.equal(k[nt_n], torch.argmax(k[lg_n], dim=-1).to(torch.int32))
    assert k[nt_n][0].item() == 37
    _tiles_disjoint(g)


@triton.jit
def _rnd_kernel(x, y, z, N: tl.constexpr):
    o = tl.arange(0, N)
    v = tl.load(x + o)
    tl.store(y + o, rnd(v, tl.bfloat16))
    tl.store(z + o, rnd(v, tl.float16))


def test_rnd_matches_torch_rounding(seed):
    """rnd (bit-level round-to-nearest-even to bf16/fp16, returned as fp32) == torch's .to(dtype).float()."""
    torch.manual_seed(seed)
    n = 4096
    x = torch.randn(n) * torch.exp2(torch.randint(-30, 18, (n,)).float())
    x[:8] = torch.tensor([65504.0, 65519.9, 65520.0, -70000.0, 1e-7, 3e-8, 2.98e-8, 0.0])
    y, z = torch.empty(n), torch.empty(n)
    _rnd_kernel[(1,)](x, y, z, n)
    assert torch.equal(y, x.bfloat16().float())
    assert torch.equal(z, x.half().float())


def test_rnd_is_round_to_nearest_even_to_the_bit(seed):
    """rnd(v, bf16)'s fp32 bits are torch's v.to(bf16) bits (round to nearest even) followed by 16 zero bits, for
    every finite fp32 v: ties of both parities, fp32 subnormals, signed zeros, the largest bf16 and the values
    that round to inf. So ``rnd(v, bf16).to(bf16)`` is ``v.to(bf16)`` (PTX cvt.rn.bf16.f32 also rounds to
    nearest even, exact on a bf16 value) and stream_stage.store_a converts its RMSNorm value without the outer
    rnd (fp16 keeps it: rnd's subnormal path turns -0 into +0). The interpreter's own fp32 -> bf16 conversion
    mis-rounds subnormals and negative values, so the conversion itself is compared on the GPU only."""
    torch.manual_seed(seed)
    n = 4096
    x = torch.randn(n) * torch.exp2(torch.randint(-149, 128, (n,)).float())
    x = torch.where(x.isfinite(), x, torch.zeros_like(x))
    ties = (torch.randint(0, 1 << 15, (64,), dtype=torch.int32) << 16) | 0x8000  # exactly halfway, both parities
    edge = torch.tensor([0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF,
                         0x00000000], dtype=torch.int32)
    bits = torch.cat([ties, edge])
    x[:bits.numel()] = bits.view(torch.float32)
    x[bits.numel():2 * bits.numel()] = -x[:bits.numel()]
    y, z = torch.empty(n), torch.empty(n)
    _rnd_kernel[(1,)](x, y, z, n)
    u = y.view(torch.int32)
    assert torch.equal(u & 0xFFFF, torch.zeros_like(u))
    assert torch.equal((u >> 16).to(torch.int16), x.bfloat16().view(torch.int16))
