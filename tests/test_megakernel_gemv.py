"""The megakernel's GEMV path when none is asked for (runtime.runners.megakernel_step): the tensor cores where the
streaming kernel then runs the step on a Hopper GPU, the model's own path otherwise, and the same path at every
batch. The GPU is faked (device capability, no weights bound): only the choice is under test; the kernels it picks
are checked on the H200 (tests/test_stream_gpu.py)."""
from types import SimpleNamespace

import pytest
import torch

from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.tiling import Tiling
from onekernel.runtime import runners


@pytest.fixture
def fake_hopper(monkeypatch):
    """build_decode_step builds the graph only (no tensors), on a device that reports sm_90; returns the gemv
    arguments build_decode_step was called with."""
    calls = []

    def build(cfg, weights, cache, *, tiling, fuse_merge=False, gemv=None):
        calls.append(gemv)
        g, _, _ = decode_graph(cfg, cache.batch, cache.max_seq_len, cache.k.dtype, tiling=tiling,
                               fuse_merge=fuse_merge, gemv=gemv)
        return SimpleNamespace(graph=g, batch=cache.batch, device=cache.k.device)
    monkeypatch.setattr(runners, "build_decode_step", build)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    return calls


def _choose(name, batch, dtype=torch.bfloat16, **options):
    cfg = get_config(name)
    cache = SimpleNamespace(batch=batch, max_seq_len=96,
                            k=SimpleNamespace(dtype=dtype, device=torch.device("cuda", 0)))
    model = SimpleNamespace(config=cfg, weights={})
    step = runners.megakernel_step(model, cache, Tiling(132, "fit"), False, {"n_workers": 132, **options})
    return step.graph.meta["gemv"]


def test_small_model_megakernel_takes_the_tensor_cores_at_every_batch(fake_hopper):
    assert [_choose("smollm2-135m", b) for b in (1, 3, 8, 16)] == ["mma"] * 4
    assert fake_hopper == ["mma"] * 4  # bound once: the tensor-core step streams
    assert _choose("smollm2-135m", 5, backend="gluon") == "mma"
    # options the streaming runner takes keep it; "gluon" profiles the kernel it runs
    assert _choose("smollm2-135m", 2, wait_ms=500, use_cuda_graph=False) == "mma"
    assert _choose("smollm2-135m", 2, backend="gluon", profile=True) == "mma"
    # Qwen3-0.6B (hidden size 1024: its own path is the tensor cores since session 29) streams them, its q/k norm in
    # the qkv tasks (session 23), bound once on its own path
    fake_hopper.clear()
    assert [_choose("qwen3-0.6b", b) for b in (1, 16)] == ["mma", "mma"]
    assert fake_hopper == [None, None]


def test_the_model_path_where_the_streaming_kernel_does_not_run(fake_hopper):
    # the Triton megakernel asked for, or a profile (the Triton kernel's task stamps): the model's CUDA-core path
    assert _choose("smollm2-135m", 2, backend="triton") == "fma"
    assert _choose("smollm2-135m", 2, profile=True) == "fma"
    assert fake_hopper == [None, None]
    # an option only the Triton megakernel takes: "auto" runs that one, so the tensor-core step is bound, refused
    fake_hopper.clear()
    assert _choose("smollm2-135m", 2, spin_limit=1000) == "fma"
    assert fake_hopper == ["mma", None]
    # fp32 steps keep the CUDA cores; models of hidden size >= 1024 already run the tensor cores
    fake_hopper.clear()
    assert _choose("smollm2-135m", 4, dtype=torch.float32) == "fma"
    assert _choose("llama-3.2-1b", 4) == "mma"
    assert fake_hopper == [None, None]


def test_off_hopper_the_model_path(fake_hopper, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    assert _choose("smollm2-135m", 1) == "fma"
    assert fake_hopper == [None]


def test_a_fallback_to_the_triton_megakernel_rebinds_the_model_path(monkeypatch):
    """When "auto" could not build the streaming kernel and fell back to the Triton megakernel, make_step_runner
    binds the model's own (CUDA-core) step for it instead of the tensor-core one megakernel_step chose."""
    from onekernel.exec.megakernel import MegakernelRunner

    def step_of(gemv):
        return SimpleNamespace(graph=SimpleNamespace(meta={"gemv": gemv}))
    built, ran = [], []
    for name in ("check_model", "_check_cache", "check_mode"):
        monkeypatch.setattr(runners, name, lambda *a, **k: None)
    monkeypatch.setattr(runners, "megakernel_step", lambda *a: step_of("mma"))
    monkeypatch.setattr(runners, "build_decode_step", lambda *a, **k: built.append(k.get("gemv")) or step_of("fma"))

    def make_runner(mode, step, **options):
        ran.append(step.graph.meta["gemv"])
        return object.__new__(MegakernelRunner) if len(ran) == 1 else "the Triton megakernel on its own path"
    monkeypatch.setattr(runners, "make_runner", make_runner)
    cfg = get_config("smollm2-135m")
    cache = SimpleNamespace(batch=2, max_seq_len=64,
                            k=SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cuda")))
    model = SimpleNamespace(config=cfg, weights={})
    got = runners.make_step_runner("megakernel", model, cache, n_sm=132)
    assert got == "the Triton megakernel on its own path"
    assert ran == ["mma", "fma"] and built == [None]


def test_pdl_takes_the_streaming_bodies_for_tensor_core_steps(monkeypatch):
    """exec.pdl_streams (mode "pdl", backend "auto"): a tensor-core step the streaming kernel runs takes its bodies,
    one persistent kernel per op, at every batch; a CUDA-core step, an option only the Triton kernels take, or a GPU
    that is not a Hopper keeps the Triton per-op kernels."""
    from onekernel.exec import pdl_streams

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    dev = torch.device("cuda", 0)

    def graph(name, batch, gemv=None):
        return decode_graph(get_config(name), batch, 96, torch.bfloat16, tiling=Tiling(132, "cover"), gemv=gemv)[0]

    w = {"n_workers": 132}  # the SM count, which the faked GPU cannot give
    assert [pdl_streams(graph("llama-3.2-1b", b), b, dev, w) for b in (1, 5, 16)] == [True] * 3
    assert pdl_streams(graph("llama-3.2-1b", 2), 2, dev, {"use_cuda_graph": False, "wait_ms": 500, **w})
    for opts in ({"after": {}}, {"trigger": "entry"}, {"prologue_split": False}, {"profile": True}):
        assert not pdl_streams(graph("llama-3.2-1b", 2), 2, dev, {**opts, **w}), opts
    assert not pdl_streams(graph("smollm2-135m", 1), 1, dev, w)  # its own path: the CUDA cores
    assert pdl_streams(graph("smollm2-135m", 1, "mma"), 1, dev, w)  # asked for the tensor cores
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    assert not pdl_streams(graph("llama-3.2-1b", 1), 1, dev, w)
