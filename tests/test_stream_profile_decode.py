"""scripts/stream_profile.gemv_sub_times: a tensor-core GEMV task's packed sub-stamps (exec.stream_mma.gemv_mma's
prof_sub row: the time before the first block above bit 32 of the epilogue word, the staging's load wait above bit
16 of the tile count) decoded into microseconds, on random stamps against the packing done here."""
import importlib.util
import random
from pathlib import Path

spec = importlib.util.spec_from_file_location("stream_profile",
                                              Path(__file__).resolve().parents[1] / "scripts/stream_profile.py")
sp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sp)


def test_gemv_sub_times_unpacks_what_the_kernel_packs():
    rng = random.Random(30)
    for _ in range(200):
        staging, ring, epi, pre = (rng.randrange(0, 50_000) for _ in range(4))
        tiles, swait = rng.randrange(1, 64), rng.randrange(0, staging + 1)
        start = rng.randrange(10**12, 2 * 10**12)
        ready = start + rng.randrange(0, 10_000)
        end = ready + staging + ring + epi + pre + rng.randrange(0, 20_000)
        got = sp.gemv_sub_times([start, ready, end, 7], [staging, ring, epi + (pre << 32), tiles + (swait << 16)])
        want = {"staging_us": staging / 1e3, "staging_wait_us": swait / 1e3, "ring_wait_us": ring / 1e3,
                "epilogue_us": epi / 1e3, "pre_us": pre / 1e3,
                "rest_us": (end - ready - staging - ring - epi - pre) / 1e3, "tiles": tiles}
        assert got == want
