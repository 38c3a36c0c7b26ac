"""The streaming (Gluon) megakernel compiles for sm_90a on a machine without a GPU (Triton's ptxas): spills,
shared memory, ring slots, the mbarrier offset, the tensor-core and cp.async instructions where expected, and the
profiling build (``scripts/stream_compile_check.py``, one subprocess per kernel)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _check(model: str, batch: int, gemv: str, seq: int = 1024, **env) -> dict:
    """The compile check's JSON record for one kernel in a cache of ``seq`` positions (asserting the script
    succeeded)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts/stream_compile_check.py"), model, str(batch), "132",
                          gemv, str(seq)], capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0", **env),
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model,batch,gemv", [("llama-3.2-1b", 1, "fma"), ("llama-3.2-1b", 8, "fma"),
                                              ("smollm2-135m", 3, "fma"), ("smollm2-135m", 1, "mma"),
                                              ("smollm2-135m", 16, "mma"), ("llama-3.2-1b", 1, "mma"),
                                              ("llama-3.2-1b", 8, "mma"), ("llama-3.2-1b", 16, "mma"),
                                              ("smollm2-1.7b", 1, "mma"), ("llama-3.2-3b", 1, "mma"),
                                              ("qwen3-0.6b", 3, "mma"), ("llama-3.1-8b", 8, "mma")])
def test_compiles_for_sm90_without_spills(model, batch, gemv):
    """The Gluon kernel compiles for sm_90a on this CPU (ptxas ships with Triton): at most 32 bytes of register
    spills (the attention run's flattened loop carries the next block's K/V and the next tile's q: 0-20 bytes in
    both bodies; SmolLM2-1.7B batch 1 28 since the staging's packed rounding, session 16, register-allocation
    noise of a kernel at 255 registers; real regressions were hundreds: 232 bytes for GB 16 everywhere) and none
    inside the innermost loops with tensor-core instructions (scripts/sass_loops.py: the GEMV's chunk loop, the
    tensor-core attention's block loop), shared memory within the H200's 227 KB, the mbarrier offset found, at least 4
    ring slots; the tensor-core body (gemv="mma") with mma.sync and ldmatrix in its PTX; its attention on the tensor
    cores where stream_smem.attn_tc_bufs says it fits (Llama-3.2-1B and SmolLM2-1.7B, head dim 64: K/V
    double-buffered; SmolLM2-135M's CK 512 tile, stream_support.attn_cols, one K/V buffer). The ring at
    shared byte 0, where the loader's bulk copies address it: fit_kernel raises otherwise (the CUDA-core batch-8
    kernel's activation buffer was once larger than the ring and the allocator put it first). Qwen3-0.6B: the q/k
    RMSNorm pass after each qkv task (head dim 128: attention on the tensor cores with one K/V view). Llama-3.1-8B:
    the RMSNorm partials (hidden size 4096, stream_plan.SS_MIN_D: one column per residual GEMV task, NSS = 132); the
    other models' kernels have none (NSS 0)."""
    rec = _check(model, batch, gemv)
    assert rec["spill_bytes"] <= 32 and rec["hot_loop_spills"] == 0, rec
    assert rec["smem"] <= 232448 and rec["SLOTS"] >= 4 and rec["BARS"] > 0, rec
    assert rec["bulk_copies"] >= 1 and rec["setmaxnreg"] == [24, 256], rec
    assert rec["compiles"] == 1, rec  # bars_guess right: a cold start compiles the kernel once, not twice
    tc = {("llama-3.2-1b", "mma"): 2, ("smollm2-1.7b", "mma"): 2, ("llama-3.2-3b", "mma"): 1,
          ("qwen3-0.6b", "mma"): 1, ("smollm2-135m", "mma"): 1, ("llama-3.1-8b", "mma"): 1}.get((model, gemv), 0)
    assert rec["ATTN_TC"] == tc, rec
    assert rec["NSS"] == (132 if model == "llama-3.1-8b" else 0), rec
    if gemv == "mma":  # GB groups x (CK/4 / 16 k-steps x RG/8 n-tiles) per staged tile, unrolled once; attention on
        # the tensor cores: per block S = Q K^T (HD/16 k-steps x 2 n-tiles) and O += P V (HD/8 n-tiles), HD/4 in all
        att = rec["HD"] // 4 if tc else 0
        assert rec["mma_sync"] == rec["GB"] * (rec["CK"] // 64) * (rec["RG"] // 8) + att and rec["ldmatrix"] > 0, rec
    else:
        assert rec["mma_sync"] == 0, rec
    # its K/V copies (inline cp.async, K and V per 16-byte unit, at the prologue's and the loop's issue sites)
    assert (rec["attn_copies"] > 0) == (tc > 0), rec
    # a cache of 1024 positions (16 splits of 64 per KV head): the runs walk only their live tiles (stream_attn_runs)
    assert rec["attn_skip"] > 0, rec
    # the activation tiles go through 16-byte cp.async copies exactly where more than one 4-row quad would sit in
    # registers (CK 1024 above batch 4), never on the CUDA-core body: at batch 5-8 into an 8-row raw tile (16 KB: one
    # ring slot fewer than batch 1's 11), above batch 8 into the staged tile itself (no raw tile: batch 1's slots)
    async_a = gemv == "mma" and rec["CK"] >= 1024 and ((batch + 3) // 4) * rec["CK"] > 1024  # CK 512: registers
    assert (rec["cp_async_16"] > 0) == async_a, rec
    if async_a and model == "llama-3.2-1b":
        assert rec["SLOTS"] == (10 if batch <= 8 else 11), rec


def test_long_cache_kernel_compiles_for_sm90():
    """A serving cache of 4096 positions on Llama-3.2-1B (head dim 64, 8 KV heads): ops.attention.choose_split's
    2-wave bound gives SPLIT 128, 32 splits per KV head (session 32), and the batch-16 kernel compiles for sm_90a
    within the spill bound, with the tensor-core attention double-buffered and the dead-tile walk (32 >= 16 splits)."""
    rec = _check("llama-3.2-1b", 16, "mma", seq=4096)
    assert (rec["SPLIT"], rec["NSPLIT"]) == (128, 32), rec
    assert rec["spill_bytes"] <= 32 and rec["smem"] <= 232448 and rec["ATTN_TC"] == 2 and rec["attn_skip"] > 0, rec


def test_profile_kernel_compiles_for_sm90():
    """The profiling build (``profile=True``: task stamps, and inside each tensor-core GEMV task the staging, ring
    wait and epilogue times, stream_mma.gemv_mma) compiles for sm_90a within the spill bound, on Llama-3.2-1B
    batch 1 (the non-profiling kernels' PTX does not change with it: scripts/ptx_compare.py)."""
    rec = _check("llama-3.2-1b", 1, "mma", STREAM_PROFILE="1")
    assert rec["spill_bytes"] <= 16 and rec["smem"] <= 232448 and rec["mma_sync"] > 0, rec


def test_dead_tile_skip_rule(monkeypatch):
    """exec.stream_attn_runs.skip_dead: by default ("auto") a run skips its dead tiles from 16 splits per KV head (a
    cache of 1024 positions at SPLIT 64), never with merge tasks (FOLD off: they read every split's partial) nor
    past 64 tiles per run (one int64 of live bits); STREAM_ATTN_SKIP=1 / 0 force it on / off; any other value is
    refused at import."""
    from triton.experimental.gluon import language as gl

    from onekernel.exec import stream_attn_runs as runs

    assert [runs.skip_dead(True, 8, n) for n in (1, 8, 15, 16, 64)] == [False, False, False, True, True]
    assert not runs.skip_dead(False, 8, 64) and not runs.skip_dead(True, 65, 64) and runs.skip_dead(True, 64, 64)
    monkeypatch.setattr(runs, "SKIP", gl.constexpr("1"))
    assert runs.skip_dead(True, 8, 8) and not runs.skip_dead(False, 8, 8)
    monkeypatch.setattr(runs, "SKIP", gl.constexpr("0"))
    assert not runs.skip_dead(True, 8, 64)
    out = subprocess.run([sys.executable, "-c", "import onekernel.exec.stream_attn_runs"], capture_output=True,
                         text=True, env=dict(os.environ, STREAM_ATTN_SKIP="yes"), cwd=ROOT)
    assert out.returncode != 0 and "InputError: STREAM_ATTN_SKIP must be auto, 1 or 0, got 'yes'" in out.stderr, out.stderr
