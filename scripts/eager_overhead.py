"""Host time of one eager-mode decode step (Llama-3.2-1B shapes, random weights, batch 1): the wall time of
100 steps with the GPU synchronised after each, and the top functions of a cProfile of 50 steps. Runs
against either source tree (it takes the runner factory the tree has), to compare launch overheads.

    PYTHONPATH=TREE python scripts/eager_overhead.py
"""
import cProfile
import pstats
import time

import torch

from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache

try:
    from onekernel.runtime.runners import make_step_runner

    def make(model, cache):
        return make_step_runner("eager", model, cache)
except ImportError:  # the tree before the architecture change
    from onekernel.exec import make_runner

    def make(model, cache):
        return make_runner("eager", model, cache, cache.batch)

model = load_model("llama-3.2-1b", random_weights=True, dtype=torch.bfloat16, device="cuda")
cache = KVCache(model.config, 1, 512, torch.bfloat16, "cuda")
cache.seq_lens.fill_(511)
r = make(model, cache)
tok = torch.zeros(1, dtype=torch.int32, device="cuda")
for _ in range(10):
    r.step(tok)
torch.cuda.synchronize()
ts = []
for _ in range(100):
    t0 = time.perf_counter()
    r.step(tok)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    ts.append((t1 - t0) * 1e3)
ts.sort()
print(f"host launch time per step: median {ts[50]:.3f} ms, p10 {ts[10]:.3f}, p90 {ts[90]:.3f}")
prof = cProfile.Profile()
prof.enable()
for _ in range(50):
    r.step(tok)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(14)
