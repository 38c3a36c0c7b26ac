"""The tensor-core GEMV path (``gemv="mma"``) on the GPU in bf16 (skipped without CUDA; run with
``TRITON_INTERPRET=0``, as scripts/gpu_call.sh 21 does).

* Every GEMV op (the builders of tests/test_batch_invariance.py, bf16) at B = 1, 3, 16 against its PyTorch
  reference (``F.linear`` in bf16: cuBLAS, fp32 accumulation) and against the CUDA-core path, every element of
  every output the op writes, NaN-poisoned first (the argmax partials' indices: each must point at its tile's
  maximum of its own logits, since a near-tie may round the other way in the reference). Tolerance: both sides round each output to bf16 (a relative
  step of 2^-8) after fp32 sums in different orders, so they differ by at most one bf16 step before the
  epilogue; RoPE / SiLU / residual roundings can add one or two more: |a - b| <= 2^-6 (|b| + max|b| / 8).
* Bitwise batch invariance on the tensor cores: row r of a batch-5 launch equals a batch-1 launch of row r
  (torch.equal), rows 0, 3 and 4; and across gate_up's batch limit of ``tiling.gate_up_rows`` (batch 3's tiles
  against batch 1's evened-out rows).
"""
import os
import zlib

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a CUDA GPU and TRITON_INTERPRET=0")

from onekernel.exec.codegen import launch_op  # noqa: E402

from test_batch_invariance import MMA_BUILDERS, _b_gate_up_limit, _inputs, _written  # noqa: E402

BF16 = torch.bfloat16


def _run(g, t):
    for op in g.ops:
        launch_op(g, op, t)
    torch.cuda.synchronize()
    return t


def _gemv_outputs(g):
    """The buffers the GEMV ops (those with an MMA switch) write."""
    return {r.buffer for op in g.ops if "MMA" in op.kind.consts for i in op.task_ids for r in g.tasks[i].writes}


def _state(builder, B, gemv, seed):
    g = builder(B, gemv=gemv, dt=BF16)
    t = {n: v.cuda() for n, v in _inputs(g, torch.Generator().manual_seed(seed)).items()}
    if "kc" in _written(g):  # the cache rows the step writes: poisoned too
        rows = (torch.arange(B), slice(None), t["seq_lens"].long().cpu())
        for n in ("kc", "vc"):
            t[n][rows] = float("nan")
    return g, t


def _where_written(g, t, name, B):
    if name in ("kc", "vc"):
        return t[name][torch.arange(B), :, t["seq_lens"].long().cpu()]
    return t[name]


# b_qkv_wide (K = 4100) is left out here: its GEMV outputs reach ~50 (a bf16 ulp there is 0.25), so a 1-ulp
# difference from the fp32 sum order (cuBLAS's against the kernel's) survives RoPE's rotation of two such values into
# an output near 1, beyond this tolerance (call 282: 1-2 elements at batch 3 and 16, 0.25 off); its values are checked
# in fp32 on the CPU (tests/test_ops_mma.py) and its rows bitwise against batch 1 below.
REF_BUILDERS = [b for b in MMA_BUILDERS if b.__name__ != "b_qkv_wide"]


@pytest.mark.parametrize("B", [1, 3, 16])
@pytest.mark.parametrize("builder", REF_BUILDERS, ids=[b.__name__[2:] for b in REF_BUILDERS])
def test_mma_bf16_matches_reference_and_fma(builder, B):
    seed = zlib.crc32(builder.__name__.encode()) + B
    g, t = _state(builder, B, "mma", seed)
    ref = {k: v.clone() for k, v in t.items()}
    for op in g.ops:
        op.kind.reference(op, ref)
    _run(g, t)
    gf, tf = _state(builder, B, "fma", seed)
    _run(gf, tf)
    for name in sorted(_gemv_outputs(g)):
        a = _where_written(g, t, name, B)
        if not a.is_floating_point():  # lm_head's argmax partials: bf16 near-ties may order differently than
            # the reference, so each index must point at its own tile maximum (pmax) in its own logits
            assert torch.equal(t["lm_head.logits"].gather(1, a.long()), t["lm_head.pmax"]), name
            continue
        assert not torch.isnan(a).any(), f"{name}: not every element written"
        for other, what in ((ref, "reference"), (tf, "fma path") if name in tf else (ref, "reference")):
            b = _where_written(g, other, name, B).float()
            tol = 2 ** -6 * (b.abs() + b.abs().max() / 8)
            bad = ((a.float() - b).abs() > tol).sum().item()
            assert bad == 0, f"{name}: {bad} elements off the {what} (max |diff| {(a.float() - b).abs().max():.3g})"


@pytest.mark.parametrize("builder", MMA_BUILDERS, ids=[b.__name__[2:] for b in MMA_BUILDERS])
def test_mma_bf16_row_matches_batch1_bitwise(builder):
    seed = zlib.crc32(builder.__name__.encode())
    g5, t5 = _state(builder, 5, "mma", seed)
    g1 = builder(1, gemv="mma", dt=BF16)
    singles = {}
    for r in (0, 3, 4):
        singles[r] = _run(g1, {n: (v.clone() if g1.buffers[n].kind == "weight" else v[r:r + 1].clone())
                               for n, v in t5.items()})
    _run(g5, t5)
    for r, t1 in singles.items():
        for n in _gemv_outputs(g1):
            assert torch.equal(t5[n][r], t1[n][0]), f"{builder.__name__}: {n}[{r}] at B=5 differs from B=1"


def test_gate_up_rows_across_the_batch_limit_bitwise():
    """``tiling.gate_up_rows``: batch 3 keeps 3 tiles of 32 rows, batch 1 takes 4 tiles of 24 (in 32-row register
    tiles); rows 0, 1 and 2 of the batch-3 launch equal their batch-1 launches bitwise in bf16 (under the
    interpreter only within fp32 rounding: tests/test_batch_invariance.py)."""
    g3 = _b_gate_up_limit(3, BF16)
    g1 = _b_gate_up_limit(1, BF16)
    assert (g3.ops[0].params["ROWS"], g1.ops[0].params["ROWS"]) == (0, 24)
    t3 = {n: v.cuda() for n, v in _inputs(g3, torch.Generator().manual_seed(9)).items()}
    singles = {r: _run(g1, {n: (v.clone() if g1.buffers[n].kind == "weight" else v[r:r + 1].clone())
                            for n, v in t3.items()}) for r in (0, 1, 2)}
    _run(g3, t3)
    for r, t1 in singles.items():
        assert not torch.isnan(t1["gu.out"]).any()
        assert torch.equal(t3["gu.out"][r], t1["gu.out"][0]), f"gu.out[{r}] at B=3 differs from B=1"
