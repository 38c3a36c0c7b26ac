"""The tensor-core GEMV path (``gemv="mma"``, ops/gemv_mma.py) of every GEMV op under the Triton interpreter.

Each op is built with ``gemv="mma"`` at B = 1, 3 and 16 (the padded width is 16: B = 16 fills it), launched
with ``launch_op`` on seeded random fp32 inputs with every output poisoned (NaN / -1) first, and every element
is compared with the op's PyTorch reference (``OpKind.reference``: ``F.linear`` in fp32).

Tolerance: under the interpreter the model dtype is fp32 (the interpreter has no bf16 dot), so ``rnd`` is the
identity and the only difference from the reference is the order of the fp32 sums: K <= 600 products of
|w x| ~ 0.2 give a relative error of a few 1e-7 (2e-5, the other op tests' bound, leaves a margin); a missed
row, column, chunk or mask shows as O(1). The bf16 numerics on the tensor cores (outputs within bf16 rounding
of the reference) are checked on the GPU: tests/test_mma_gpu.py.
"""
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from onekernel.ops.tiling import GEMV_PATHS, MMA_COLS, Tiling, gemv_blocks

from test_batch_invariance import MMA_BUILDERS, _inputs, _written
from test_ops_gemv import _run_both

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("B", [1, 3, 16])
@pytest.mark.parametrize("builder", MMA_BUILDERS, ids=[b.__name__[2:] for b in MMA_BUILDERS])
def test_mma_op_matches_reference(builder, B):
    g = builder(B, gemv="mma")
    gemv_ops = [op for op in g.ops if "MMA" in op.kind.consts]
    assert gemv_ops and all(op.params["MMA"] and op.params["BLOCK_B"] == MMA_COLS for op in gemv_ops)
    t = _inputs(g, torch.Generator().manual_seed(zlib.crc32(builder.__name__.encode()) + B))
    rows = (torch.arange(B), slice(None), t["seq_lens"].long()) if "kc" in _written(g) else None
    for name in ("kc", "vc") if rows else ():  # the cache rows the step writes: poisoned too
        t[name][rows] = float("nan")
    t, ref = _run_both(g, t)
    for name in sorted(_written(g)):
        a, want = t[name], ref[name]
        if name in ("kc", "vc"):  # compared where written (elsewhere the same random data in both)
            a, want = a[rows], want[rows]
        if a.is_floating_point():
            assert not torch.isnan(a).any(), f"{name}: not every element written"
            torch.testing.assert_close(a, want, rtol=2e-5, atol=2e-5, msg=lambda m: f"{name}: {m}")
        else:
            assert torch.equal(a, want), f"{name} differs from the reference"


def test_mma_tiles_and_errors():
    """The MMA path pads every batch to 16 columns (BLOCK_B) and keeps tiles >= 16 rows (tl.dot's minimum);
    tiles never depend on B; an unknown path or a batch over 16 is refused."""
    small = Tiling(n_sm=1000)  # asks for the smallest tiles
    fma, mma = (gemv_blocks(64, 256, 3, small, gemv=k) for k in GEMV_PATHS)
    assert (fma["BLOCK_B"], fma["BLOCK_N"], fma["MMA"]) == (4, 4, False)
    assert (mma["BLOCK_B"], mma["BLOCK_N"], mma["MMA"]) == (MMA_COLS, 16, True)
    assert all(gemv_blocks(64, 256, b, small, gemv="mma") == mma for b in (1, 2, 9, 16))
    with pytest.raises(ValueError, match="unknown gemv path"):
        gemv_blocks(64, 256, 3, small, gemv="tensor")
    with pytest.raises(ValueError, match="batch 17"):
        gemv_blocks(64, 256, 17, small, gemv="mma")


@pytest.mark.parametrize("model,extra", [("tiny", ["--megakernel"]), ("qwen3-0.6b", [])])
def test_mma_kernels_compile_for_sm90a_with_tensor_cores(model, extra):
    """Every GEMV kernel of the MMA path (the fused merge included) compiles for sm_90a on this CPU (Triton
    ships ptxas; scripts/mma_compile_check.py) with tensor-core instructions in its PTX (mma.sync or wgmma) and
    no register spills; so does the Triton megakernel built from them (tiny: its weights are made on the CPU);
    Qwen3-0.6B at its real shapes for the q/k-norm path."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, str(ROOT / "scripts/mma_compile_check.py"), model, "8", "--paths", "mma",
                          *extra], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    kinds = {r["kernel"] for r in recs}
    assert kinds == {"qkv_rope", "gemv_residual", "gate_up", "lm_head", "oproj_merge"} | \
        ({"megakernel"} if extra else set()), kinds
    for r in recs:
        assert r["mma"] + r["wgmma"] > 0 and r["spill_bytes"] == 0, r


def test_megakernel_backend_with_mma():
    """An MMA step picks its megakernel as an FMA step does (the streaming Gluon kernel has a tensor-core body):
    in the interpreter the Triton megakernel, and "gluon" is refused there for the interpreter, not the path."""
    from onekernel.errors import InputError
    from onekernel.exec import megakernel_class
    from onekernel.exec.megakernel import MegakernelRunner
    from onekernel.models.decode_graph import build_decode_step
    from onekernel.models.load import load_model
    from onekernel.runtime.kv_cache import KVCache

    m = load_model("tiny", random_weights=True)
    step = build_decode_step(m.config, m.weights, KVCache(m.config, 2, 16, torch.float32, "cpu"), gemv="mma")
    assert step.graph.meta["gemv"] == "mma"
    assert megakernel_class(step, "auto", True, {}) is MegakernelRunner
    assert megakernel_class(step, "triton", False, {}) is MegakernelRunner
    with pytest.raises(InputError, match="Hopper GPU only"):
        megakernel_class(step, "gluon", True, {})
    # off the interpreter a CPU step is unsupported by the streaming kernel for its device, not its GEMV path
    from onekernel.exec.stream_support import unsupported
    assert "CUDA device" in unsupported(step)
    assert megakernel_class(step, "auto", False, {}) is MegakernelRunner


def test_gemv_option_is_checked(capsys):
    """The path option is refused where it cannot apply: an unknown name (graph builder), the reference mode,
    and `onekernel bench --gemv` with --study (its variants run the model's default; --tp takes it:
    tests/test_tp.py)."""
    from onekernel.cli import main
    from onekernel.errors import InputError
    from onekernel.models.config import get_config
    from onekernel.models.decode_graph import decode_graph
    from onekernel.models.load import load_model
    from onekernel.runtime.kv_cache import KVCache
    from onekernel.runtime.runners import make_step_runner

    with pytest.raises(InputError, match="unknown gemv path"):
        decode_graph(get_config("tiny"), 2, 16, torch.float32, gemv="tensor")
    m = load_model("tiny", random_weights=True)
    with pytest.raises(InputError, match="no runner options, got gemv"):
        make_step_runner("reference", m, KVCache(m.config, 1, 16, torch.float32, "cpu"), gemv="mma")
    assert main(["bench", "--model", "tiny", "--random-weights", "--gemv", "mma", "--study"]) != 0
    assert "--gemv" in capsys.readouterr().err


def test_default_gemv_is_a_property_of_the_model_and_dtype():
    """Tensor cores for bf16/fp16 models with a hidden size >= MMA_MIN_DIM (measured faster there, runs 8 and 29), CUDA
    cores for smaller models and for fp32; never a function of the batch (decode_graph records it)."""
    import torch

    from onekernel.models.config import get_config
    from onekernel.models.decode_graph import MMA_MIN_DIM, decode_graph, default_gemv

    # the measured choice (run 29 call 303): hidden size 1024 (Qwen3-0.6B) on the tensor cores, 576 not
    paths = {"llama-3.2-1b": "mma", "llama-3.1-8b": "mma", "qwen3-8b": "mma", "qwen3-0.6b": "mma",
             "smollm2-135m": "fma", "tiny": "fma"}
    for name, path in paths.items():
        cfg = get_config(name)
        assert (cfg.dim >= MMA_MIN_DIM) == (path == "mma"), name
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            assert default_gemv(cfg, dt) == (path if dt != torch.float32 else "fma"), (name, dt)
    cfg = get_config("llama-3.2-1b")
    assert {decode_graph(cfg, b, 64, torch.bfloat16)[0].meta["gemv"] for b in (1, 3, 16)} == {"mma"}


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-3.1-8b", "smollm2-135m", "qwen3-0.6b"])
@pytest.mark.parametrize("n_sm", [132, 78, 20])
def test_qkv_tiles_fill_one_wave_with_the_fewest_rows(model, n_sm):
    """``qkv_tiles`` on the separate kernels' tensor-core path: at most one tile per SM, every unit of every head in
    exactly one tile, and no tile holding more than the rows per SM rounded up to the 8-row unit (P >= 4) or the
    MMA's 16 rows, whichever is more, in 16 to QKV_MAX_ROWS register rows; where no wave fits those (Llama-3.1-8B on
    20 SMs) ``qkv_pairs``' tiles; the megakernel's tiles ("fit") and Qwen3's whole heads keep U = 1."""
    import math

    from onekernel.models.config import get_config
    from onekernel.ops.qkv import QKV_MAX_ROWS, qkv_pairs, qkv_tiles

    cfg = get_config(model)
    nh, hd = cfg.n_heads + 2 * cfg.n_kv_heads, cfg.head_dim
    P, U = qkv_tiles(nh, hd, cfg.qk_norm, Tiling(n_sm, "cover"), True)
    if cfg.qk_norm:
        assert (P, U) == (hd // 2, 1)
        return
    assert 16 <= 2 * P * (1 << (U - 1).bit_length()) <= QKV_MAX_ROWS, (P, U)
    units = nh * hd // (2 * P)
    tiles = [list(range(t * U, min(units, t * U + U))) for t in range(math.ceil(units / U))]
    assert sorted(u for t in tiles for u in t) == list(range(units))
    if (model, n_sm) == ("llama-3.1-8b", 20):  # one wave would take 512 register rows (spills, sm_90a)
        assert (P, U) == (qkv_pairs(nh, hd, False, Tiling(n_sm, "fit").min_tiles), 1)
    else:
        assert len(tiles) <= n_sm
        assert max(len(t) for t in tiles) * 2 * P <= max(16, 8 * math.ceil(nh * hd / n_sm / 8)), (P, U)
    assert qkv_tiles(nh, hd, False, Tiling(n_sm, "fit"), True)[1] == 1
    assert qkv_tiles(nh, hd, False, Tiling(n_sm, "cover"), False)[1] == 1


def test_prenorm_options_are_checked_and_its_scratch_fits_each_op():
    """PRENORM's choices on the tensor-core path: bad P / U overrides and PRENORM on the CUDA cores are refused with a
    ValueError naming them (and leave no buffer behind); two qkv_rope ops of different batch in one graph each get a
    scratch of their own shape [B, n_tiles, D], one op's tiles reading and writing only their own rows of it."""
    from test_batch_invariance import _b_qkv
    from onekernel.ops.qkv import add_qkv_rope

    g = _b_qkv(2, False, "mma", torch.float32)
    qkv = g.ops[0]
    args = [g.buffers[qkv.args[r]] for r in ("x", "nw", "w", "inv_freq", "seq_lens", "k_cache", "v_cache")]
    before = set(g.buffers)
    for blocks, msg in (({"P": 0}, "P=0 and U=1 must be >= 1"), ({"P": 4, "U": 0}, "must be >= 1"),
                        ({"P": 3}, "must divide hd/2")):
        with pytest.raises(ValueError, match=msg):
            add_qkv_rope(g, "bad", *args, eps=1e-6, gemv="mma", tiling=Tiling(132, "cover"), blocks=blocks)
    with pytest.raises(ValueError, match="PRENORM needs gemv='mma'"):
        add_qkv_rope(g, "bad", *args, eps=1e-6, gemv="fma", tiling=Tiling(132, "cover"), blocks={"PRENORM": 1})
    assert set(g.buffers) == before
    x, nw, w, inv, sl, kc, vc = args  # a second op of batch 4 in the batch-2 graph, on the same weights
    a4 = [g.add_buffer(f"{b.name}4", (4, *b.shape[1:]), b.dtype, b.kind) if b.shape[0] == 2 else b
          for b in (x, nw, w, inv, sl, kc, vc)]
    add_qkv_rope(g, "qkv4", *a4, eps=1e-6, gemv="mma", tiling=Tiling(132, "cover"))
    xn2, xn4 = (g.buffers[op.args["xn"]] for op in g.ops)
    assert xn2.name != xn4.name and xn2.shape[0] == 2 and xn4.shape[0] == 4
    for op, xn in zip(g.ops, (xn2, xn4)):
        assert op.params["PRENORM"] and xn.shape[1] == op.n_tiles
        for t in op.task_ids:
            task = g.tasks[t]
            mine = [r for r in (*task.reads, *task.writes) if r.buffer == xn.name]
            assert len(mine) == 2 and all(r.box == ((0, xn.shape[0]), (task.tile, task.tile + 1), (0, xn.shape[2]))
                                          for r in mine)
