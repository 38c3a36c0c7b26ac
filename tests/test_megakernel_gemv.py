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


def test_the_model_path_where_the_streaming_kernel_does_not_run(fake_hopper):
    # the Triton megakernel asked for, or a profile (the Triton kernel's task stamps): the model's CUDA-core path
    assert _choose("smollm2-135m", 2, backend="triton") == "fma"
    assert _choose("smollm2-135m", 2, profile=True) == "fma"
    assert fake_hopper == [None, None]
    # Qwen3's q/k norm has no streaming body: the tensor-core step is bound, refused, then the model's own path
    fake_hopper.clear()
    assert [_choose("qwen3-0.6b", b) for b in (1, 16)] == ["fma", "fma"]
    assert fake_hopper == ["mma", None] * 2
    # fp32 steps keep the CUDA cores; models of hidden size >= 2048 already run the tensor cores
    fake_hopper.clear()
    assert _choose("smollm2-135m", 4, dtype=torch.float32) == "fma"
    assert _choose("llama-3.2-1b", 4) == "mma"
    assert fake_hopper == [None, None]


def test_off_hopper_the_model_path(fake_hopper, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    assert _choose("smollm2-135m", 1) == "fma"
    assert fake_hopper == [None]
