"""CPU test setup: the Triton interpreter and a private cache folder for generated kernels.

Both must be set (unless already in the environment) before triton is imported (triton reads TRITON_INTERPRET at import time).
Then the interpreter's speed-up (tests/fast_interpreter.py) and, under pytest-xdist (README's command runs the suite
on both cores with ``-n 2``), one torch thread per worker process.
"""
import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")  # a GPU run may pass TRITON_INTERPRET=0
os.environ.setdefault("ONEKERNEL_CACHE", tempfile.mkdtemp(prefix="onekernel_gen_"))


import pytest  # noqa: E402

import fast_interpreter  # noqa: E402

fast_interpreter.install()
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker and per process it starts (servers, CLI runs): the workers already fill
    # the cores; with torch's default (a thread per core in each) the suite took 679 s instead of 578 s on 2 cores
    # (session 18, one run each).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def twin_caches():
    """Factory: ``(caches, generator) = twin_caches(model, batch, max_len, lens, seed)`` gives two fp32 CPU KV
    caches holding the same random K/V and positions ``lens``, so a mode under test and the reference each
    step on their own copy; ``generator`` (seeded) draws the test's tokens."""
    import torch

    from onekernel.runtime.kv_cache import KVCache

    def make(model, batch, max_len, lens, seed):
        caches = [KVCache(model.config, batch, max_len, torch.float32, "cpu") for _ in range(2)]
        g = torch.Generator().manual_seed(seed)
        k, v = torch.randn(caches[0].k.shape, generator=g), torch.randn(caches[0].v.shape, generator=g)
        for c in caches:
            c.k.copy_(k)
            c.v.copy_(v)
            c.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        return caches, g
    return make


@pytest.fixture
def seed(request):
    """A fixed seed per test, from its id (the same on every run, different between tests); printed, so a
    failing test's captured output names it. ONEKERNEL_TEST_SEED=N overrides it to try other inputs."""
    import zlib

    s = int(os.environ.get("ONEKERNEL_TEST_SEED", zlib.crc32(request.node.nodeid.encode()) % 100_000))
    print(f"seed={s} (ONEKERNEL_TEST_SEED={s} reproduces it)")
    return s


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run only with ONEKERNEL_SLOW_TESTS=1 (the CI suite stays within its time)."""
    if os.environ.get("ONEKERNEL_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow (> ~45 s on 2 cores): set ONEKERNEL_SLOW_TESTS=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
