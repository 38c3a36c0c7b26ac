"""The streaming (Gluon) megakernel's profile at tensor-parallel size 2, on the CPU: its stamps turned into the
Triton TP megakernel's rows (``profile.tp_trace.stream_rows``: local waits done of the all-reduce tasks from
``prof_sub``), on synthetic stamps and on a real rank's plan, and the profiling TP kernel's sm_90a compile with
the local-waits stamp before the remote waits (exec/stream_device.py). The kernel runs on GPUs only
(scripts/tp_profile.py)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from onekernel.dist.sharding import shard_config
from onekernel.exec import stream_base as sd
from onekernel.exec.stream_plan import make_plan
from onekernel.models.config import get_config
from onekernel.models.decode_graph import decode_graph
from onekernel.ops.tiling import Tiling
from onekernel.profile.tp_trace import rank_breakdown, remote_task_ids, stream_rows

ROOT = Path(__file__).resolve().parents[1]
CFG = dataclasses.replace(get_config("tiny"), name="stream-tp-prof-test", vocab_size=300, dim=128, n_heads=4,
                          n_kv_heads=2, head_dim=64, ffn_dim=384)


def test_stream_rows_by_hand():
    """Five tasks, tasks 1 and 3 with remote waits: their local waits done come from prof_sub column 0, every other
    task's is its ready stamp; the other prof_sub columns (a GEMV task's sub-timings) and the rows past n are
    ignored; the result is int64 [5, 5] on the CPU."""
    prof = torch.tensor([[100, 110, 150, 0], [120, 300, 330, 1], [160, 170, 200, 0], [210, 400, 420, 2],
                         [5, 5, 9, 3]], dtype=torch.int64)
    sub = torch.tensor([[7, 8, 9, 10], [180, 0, 0, 0], [11, 12, 13, 14], [250, 1, 2, 3], [0, 0, 0, 0],
                        [99, 99, 99, 99]], dtype=torch.int64)
    rows = stream_rows(prof, sub, {1, 3})
    want = [[100, 110, 150, 0, 110], [120, 300, 330, 1, 180], [160, 170, 200, 0, 170], [210, 400, 420, 2, 250],
            [5, 5, 9, 3, 5]]
    assert rows.dtype == torch.int64 and rows.device.type == "cpu" and rows.tolist() == want
    assert prof.tolist()[1] == [120, 300, 330, 1]  # the inputs untouched
    assert stream_rows(prof, sub, set()).tolist() == [r[:4] + [r[1]] for r in prof.tolist()]


def test_stream_rows_refuses_other_shapes():
    prof = torch.zeros(3, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="prof int64"):
        stream_rows(torch.zeros(3, 5, dtype=torch.int64), prof, set())
    with pytest.raises(ValueError, match="prof int64"):
        stream_rows(prof, torch.zeros(2, 4, dtype=torch.int64), set())
    with pytest.raises(ValueError, match="prof int64"):
        stream_rows(prof.float(), prof, set())
    with pytest.raises(ValueError, match=r"remote task ids \[3\]"):
        stream_rows(prof, prof, {0, 3})


@pytest.mark.parametrize("local", [0, 119, 301, 5000])
def test_stream_rows_refuses_a_local_stamp_outside_the_task(local):
    """A remote task's local waits done must lie in [start, ready]: 0 (a build without the stamp) or any value
    outside is one ValueError naming the task; the bounds themselves pass."""
    prof = torch.tensor([[100, 110, 150, 0], [120, 300, 330, 1]], dtype=torch.int64)
    sub = torch.zeros(2, 4, dtype=torch.int64)
    sub[1, 0] = local
    with pytest.raises(ValueError, match="task 1's local waits done"):
        stream_rows(prof, sub, {1})
    for ok in (120, 300):
        sub[1, 0] = ok
        assert stream_rows(prof, sub, {1})[1, 4].item() == ok


def test_stream_rows_on_a_rank_plan():
    """Rank 0 of 2's streaming plan (re-tiled graph): the tasks with remote waits are exactly its all-reduce tasks;
    on synthetic stamps every element of the rows is (start, ready, end, worker, local), local = prof_sub[t, 0] for
    those and ready for the others; rank_breakdown's remote waiting is the all-reduce tasks' ready - local summed."""
    local = shard_config(CFG, 2, 0).config
    g0, _, _ = decode_graph(local, 2, 48, torch.bfloat16, tiling=Tiling(8, "fit"), tp=(0, 2), gemv="mma")
    plan = make_plan(SimpleNamespace(graph=g0, batch=2, device=torch.device("cpu")), 8)
    g, n = plan.graph, len(plan.graph.tasks)
    ar = {t for t, task in enumerate(g.tasks) if plan.kinds[task.op] == sd.K_ALLREDUCE.value}
    rt = remote_task_ids(plan.events)
    assert ar and rt == ar and n > len(ar)
    gen = torch.Generator().manual_seed(1)
    start = torch.randint(0, 10_000, (n,), generator=gen, dtype=torch.int64) + 1_000_000
    ready = start + torch.randint(0, 5_000, (n,), generator=gen, dtype=torch.int64)
    prof = torch.stack([start, ready, ready + 700, torch.arange(n) % 8], dim=1)
    sub = torch.randint(1, 1 << 40, (2 * n, 4), generator=gen, dtype=torch.int64)  # GEMV/attention sub-stamps too
    for t in ar:  # local waits done between start and ready
        sub[t, 0] = (start[t] + ready[t]) // 2
    rows = stream_rows(prof, sub, rt)
    assert rows.shape == (n, 5)
    for t in range(n):
        want = [int(start[t]), int(ready[t]), int(ready[t]) + 700, t % 8, int(sub[t, 0] if t in ar else ready[t])]
        assert rows[t].tolist() == want, t
    b = rank_breakdown(g, rows, rt)
    assert b["tasks"] == n and b["allreduce_tasks"] == len(ar)
    assert b["remote_wait_us"] == pytest.approx(sum(int(ready[t] - sub[t, 0]) for t in ar) / 1e3)
    assert b["local_wait_us"] == pytest.approx(
        sum(int((sub[t, 0] if t in ar else ready[t]) - start[t]) for t in range(n)) / 1e3)


_COMPILE = """
import json, os, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/scripts"]
from stream_compile_check import compile_stream, report
k, plan, c = compile_stream("llama-3.2-1b", 1, 132, 512, gemv="mma", tp=(0, 2))
open(sys.argv[2], "w").write(k.asm["ptx"])
print(json.dumps({**report(k), "SLOTS": c["SLOTS"], "TP": c["TP"], "PROFILE": c["PROFILE"]}))
"""


def test_profiling_tp_kernel_compiles_with_the_local_wait_stamp(tmp_path):
    """The profiling TP kernel (PROFILE, rank 0 of 2, Llama-3.2-1B batch 1, tensor cores) compiles for sm_90a on
    this CPU with at most 16 bytes of spills, and its PTX has the new stamp: a %globaltimer read and a 64-bit store
    attributed to the source line that writes an all-reduce task's prof_sub column 0 in stream_device._consumer
    (the remote waits' ld.global.acquire.sys in the kernel too)."""
    ptx_path = tmp_path / "k.ptx"
    out = subprocess.run([sys.executable, "-c", _COMPILE, str(ROOT), str(ptx_path)], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="0", STREAM_PROFILE="1"), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["TP"] and rec["PROFILE"] and rec["spill_bytes"] <= 16 and rec["smem"] <= 232448, rec
    src = (ROOT / "onekernel/exec/stream_device.py").read_text().splitlines()
    line = [i + 1 for i, s in enumerate(src) if "gl.store(prof + (n_prof + t) * 4, now())" in s]
    assert len(line) == 1, line
    at = re.compile(rf"stream_device\.py:{line[0]}:\d+")
    loc, timer, store, first_sys = "", None, None, None
    for i, s in enumerate(ptx_path.read_text().splitlines()):
        if s.strip().startswith(".loc"):
            loc = s
        elif "%globaltimer" in s and at.search(loc) and timer is None:
            timer = i
        elif "st.global.b64" in s and at.search(loc) and store is None:
            store = i
        elif "ld.global.acquire.sys" in s and first_sys is None:
            first_sys = i
    assert timer is not None and store is not None and first_sys is not None, (timer, store, first_sys)
    assert timer < store
