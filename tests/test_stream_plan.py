"""The streaming megakernel's host side on the CPU: which steps stream and how their buffers fit in shared memory
(exec/stream_support.py), and the plan (exec/stream_plan.py): schedule, queue records, events, attention runs,
Qwen3's whole-head qkv tasks. The weight stream it packs: tests/test_stream_pack.py (which takes ``_step`` and the
test configs from here); its sm_90a compile: tests/test_stream_compile.py; the device code runs on a GPU only
(tests/test_stream_gpu.py).
"""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from onekernel.errors import InputError
from onekernel.exec import make_runner
from onekernel.exec import stream_base as sd
from onekernel.exec.stream_pack import arg_table, scratch_tensors
from onekernel.exec.stream_plan import CHUNK_ELEMS, make_plan
from onekernel.exec.stream_records import records
from onekernel.exec.stream_support import prefer_stream
from onekernel.graph.schedule import validate
from onekernel.models.config import get_config
from onekernel.models.decode_graph import build_decode_step, decode_graph
from onekernel.models.random_init import random_weights
from onekernel.ops.tiling import Tiling
from onekernel.runtime.kv_cache import KVCache

# K of 128 / 256 / 384 (zero-padded to 256-column chunks), 32-row groups, a vocabulary that is no multiple of them
CFG = dataclasses.replace(get_config("tiny"), name="stream-test", vocab_size=300, dim=128, n_heads=4, n_kv_heads=2,
                          head_dim=64, ffn_dim=384)


def test_a_gemv_width_not_a_multiple_of_8_is_refused(monkeypatch):
    """The tensor-core body reads activations in 16-byte vectors and tells the compiler K % 8 == 0, so the plan
    refuses (with the reason) a step whose GEMV in_features is not a multiple of 8; the registry's models pass."""
    from types import SimpleNamespace

    from onekernel.exec.stream_support import unsupported
    from onekernel.models.decode_graph import decode_graph

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    cuda = SimpleNamespace(type="cuda")
    g, _, _ = decode_graph(CFG, 1, 64, torch.bfloat16)  # decode_graph itself wants widths % 16 == 0
    down = next(op for op in g.ops if op.name == "down.0")
    down.params["K"] = CFG.ffn_dim - 4  # a graph built another way: down_proj K % 8 == 4
    why = unsupported(SimpleNamespace(graph=g, device=cuda, batch=1))
    assert why is not None and "not a multiple of 8" in why and str(CFG.ffn_dim - 4) in why, why
    for name in ("smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"):
        g, _, _ = decode_graph(get_config(name), 1, 64, torch.bfloat16)
        assert unsupported(SimpleNamespace(graph=g, device=cuda, batch=1)) is None, name


# K of 1024 / 2048: 1024-column chunks of 8 rows (Llama's chunk shape), the MMA path's 8-group blocks
CFG8 = dataclasses.replace(CFG, name="stream-test-8", dim=1024, n_heads=8, n_kv_heads=2, head_dim=128, ffn_dim=2048,
                           n_layers=1)


# Qwen3's per-head q/k RMSNorm on CFG8's shapes (8 q heads, 2 KV heads, head_dim 128: 12 heads of 16 units)
CFGQ = dataclasses.replace(CFG8, name="stream-test-qwen3", qk_norm=True)


def _step(batch, seed, workers=8, cfg=CFG, gemv=None):
    w = random_weights(cfg, torch.bfloat16, "cpu", seed)
    cache = KVCache(cfg, batch, 48, torch.bfloat16, "cpu")
    return build_decode_step(cfg, w, cache, tiling=Tiling(workers, "fit"), gemv=gemv), workers


def test_schedule_records_and_tables(seed):
    step, W = _step(2, seed)
    plan = make_plan(step, W)
    g = plan.graph
    validate(plan.schedule, g, [[] for _ in g.tasks])  # every task once, queues well formed
    where = {t: w for w, q in enumerate(plan.schedule.queues) for t in q}
    for op, kind in zip(g.ops, plan.kinds):
        per = torch.bincount(torch.tensor([where[t] for t in op.task_ids]), minlength=W)
        if op.kind.name in ("qkv_rope", "gemv_residual", "gate_up", "lm_head"):
            assert per.max() == 1, f"{op.name}: a GEMV op has one task per worker at most"
        else:  # tiles of one op are spread before any worker gets a second one
            assert per.max() - per.min() <= 1, f"{op.name}: tasks per worker {per.tolist()}"
        for q in plan.schedule.queues:  # program order inside every queue
            ops = [g.tasks[t].op for t in q]
            assert ops == sorted(ops)
    qrec, wl = records(plan)
    assert qrec.shape == (len(g.tasks) + 1, sd.REC.value)
    for row, t in zip(qrec.tolist(), [t for q in plan.schedule.queues for t in q]):
        task = g.tasks[t]
        assert row[sd.F_TASK.value] == t and row[sd.F_KIND.value] == plan.kinds[task.op]
        waits = plan.events.waits[t]
        assert row[sd.F_WE.value] - row[sd.F_WB.value] == len(waits)
        assert [e for e, _ in wl[row[sd.F_WB.value]:row[sd.F_WE.value]].tolist()] == waits
        if "NKB" in g.ops[task.op].params:
            assert row[sd.F_NKB.value] * plan.consts["CK"] >= row[sd.F_K.value] > 0
    bases = {dt: torch.zeros(8, dtype=dt) for dt in (torch.bfloat16, torch.float32, torch.int32)}
    tensors = dict(step.tensors, **scratch_tensors(plan, "cpu"))
    tab = arg_table(plan, tensors, bases)
    op = next(o for o in g.ops if o.kind.name == "qkv_rope")
    assert tab[op.index, 2] * 16 == tensors[op.args["q"]].data_ptr() - bases[torch.bfloat16].data_ptr()


@pytest.mark.parametrize("op_events", [True, False])
def test_every_task_waits_on_whole_producer_ops(op_events, seed, monkeypatch):
    """STREAM_OP_EVENTS=1 (one GPU; the default since run 21): every task spins on one counter per producer op, so an attention task
    waits on one event that every qkv task of its layer signals (expected: their count), not on the 1-5 tile events
    of the qkv tasks that write its heads (each a dependent round trip on the GPU). Either way every task's events
    cover its real dependencies (graph.deps, from the regions) and the schedule stays valid."""
    from onekernel.exec import stream_plan
    from onekernel.graph.deps import derive_dependencies
    monkeypatch.setattr(stream_plan, "OP_EVENTS", op_events)
    step, W = _step(3, seed)
    plan = make_plan(step, W, fold=False)
    g, ev = plan.graph, plan.events
    validate(plan.schedule, g, [[] for _ in g.tasks])
    deps = derive_dependencies(g)
    reach = []  # tasks each task's waits order it after, directly or through its producers' waits (ids ascend)
    for t in range(len(g.tasks)):
        direct = {p for e in ev.waits[t] for p in ev.producers[e]}
        reach.append(direct.union(*(reach[p] for p in direct)))
        assert set(deps[t]) <= reach[t], (t, sorted(set(deps[t]) - reach[t]))
    for op in g.ops:
        if op.kind.name != "attn_partial":
            continue
        qkv = next(o for o in g.ops if o.name == op.name.replace("attn_partial", "qkv_rope"))
        for t in op.task_ids:
            if op_events:
                assert len(ev.waits[t]) == 1, ev.waits[t]
                e = ev.waits[t][0]
                assert sorted(ev.producers[e]) == sorted(qkv.task_ids) and ev.expected[e] == len(qkv.task_ids)
            else:
                assert all(set(ev.producers[e]) <= set(qkv.task_ids) for e in ev.waits[t])


@pytest.mark.parametrize("batch", [1, 5])
def test_attention_and_merge_tiles_run_in_runs(batch, seed):
    """Attention partials and merges: the source graph's tiles in runs of consecutive tiles, every tile in
    exactly one run, at most one run per worker; the records carry (first tile, tiles) and NTA holds the
    longest attention run; a run's regions are its tiles' regions and each run waits for every producer of
    its tiles (its reads), so the schedule stays valid."""
    step, W = _step(batch, seed)
    plan = make_plan(step, W)
    g = plan.graph
    src = {op.name: op for op in step.graph.ops}
    where = {t: w for w, q in enumerate(plan.schedule.queues) for t in q}
    longest = 0
    for op in g.ops:
        if op.kind.name not in ("attn_partial", "attn_merge"):
            continue
        runs = [plan.units[t] for t in op.task_ids]
        tiles = [u for u0, n in runs for u in range(u0, u0 + n)]
        assert tiles == list(range(len(src[op.name].task_ids))), f"{op.name}: runs {runs}"
        assert len(runs) <= W and len({where[t] for t in op.task_ids}) == len(runs)
        for t, (u0, n) in zip(op.task_ids, runs):
            want = {r for i in range(u0, u0 + n) for r in step.graph.tasks[src[op.name].task_ids[i]].reads}
            assert set(g.tasks[t].reads) == want
        if op.kind.name == "attn_partial":
            longest = max(longest, max(n for _, n in runs))
    assert plan.consts["NTA"] >= longest and plan.consts["NTA"] & (plan.consts["NTA"] - 1) == 0
    if batch > 1:
        assert longest > 1  # the test's shapes do make runs
    qrec, _ = records(plan)
    for row, t in zip(qrec.tolist(), [t for q in plan.schedule.queues for t in q]):
        if g.ops[g.tasks[t].op].kind.name in ("attn_partial", "attn_merge"):
            assert (row[sd.F_U0.value], row[sd.F_NU.value]) == plan.units[t]


def test_prefer_stream_depends_on_the_model_only():
    """The choice depends on the model and its GEMV path, never on the batch: a tensor-core step always streams,
    a CUDA-core one from STREAM_MIN_LAYER_BYTES per worker and layer (SmolLM2-135M: 54 KB)."""
    from onekernel.models.decode_graph import decode_graph

    def pref(name, batch, gemv=None):
        g, _, _ = decode_graph(get_config(name), batch, 64, torch.bfloat16, gemv=gemv)
        return prefer_stream(g, 132)
    for name, gemv, want in (("smollm2-135m", None, False), ("smollm2-135m", "fma", False),
                             ("smollm2-135m", "mma", True), ("llama-3.2-1b", None, True),
                             ("llama-3.2-1b", "fma", True), ("llama-3.1-8b", None, True)):
        assert [pref(name, b, gemv) for b in (1, 5, 16)] == [want] * 3, (name, gemv)


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"])
def test_every_batch_to_16_fits_in_shared_memory(name):
    """The streaming kernel takes every batch 1..MAX_BATCH of a model it supports (the backend never depends on
    the batch): the activation rows that do not fit beside XBUF_SLOTS weight slots, or would make the activation
    buffer larger than the ring, go to the L2 path."""
    from onekernel.exec.stream_plan import CHUNK_ELEMS, SMEM_LIMIT, XBUF_SLOTS, _slots, xbuf_rows
    from onekernel.exec.stream_support import MAX_BATCH, chunk_shape
    from onekernel.models.decode_graph import decode_graph

    g, _, _ = decode_graph(get_config(name), 1, 64, torch.bfloat16)
    _, ck, rg, kxb = chunk_shape(g)
    for b in range(1, MAX_BATCH + 1):
        xb = xbuf_rows(b, kxb, ck)
        slots = _slots(xb, kxb, ck, rg)
        assert 1 <= xb <= b and slots >= min(12, XBUF_SLOTS), (b, xb, slots)
        assert xb * kxb * ck * 2 + slots * CHUNK_ELEMS * 2 + 2048 <= SMEM_LIMIT, (b, xb, slots)
        # the ring stays the largest buffer, so the allocator puts it at shared byte 0 where the loader's bulk copies
        # address it (stream_device._loader; fit_kernel refuses a kernel where it is not)
        assert xb * kxb * ck * 2 < slots * CHUNK_ELEMS * 2, (b, xb, slots)
        assert xb == b or xbuf_rows(b + 1, kxb, ck) == xb  # rows go to L2 only once xbuf is full
    assert xbuf_rows(MAX_BATCH, kxb, ck) < MAX_BATCH or name == "smollm2-135m"  # the L2 path is reachable


def test_backend_option_is_checked(seed):
    step, _ = _step(1, seed)
    with pytest.raises(InputError, match="unknown megakernel backend"):
        make_runner("megakernel", step, interpret=True, backend="cuda")
    with pytest.raises(InputError, match="Hopper GPU only"):
        make_runner("megakernel", step, interpret=True, backend="gluon")


def test_jit_hooks_are_off_inside_and_restored_after():
    """The Triton megakernel launches with Triton's JIT hooks unset (they JSON-serialise its RUN_TASK constexpr,
    a JITFunction: TypeError on the H200), and the caller's hooks come back afterwards, even after an error."""
    from triton import knobs

    from onekernel.exec.persistent import jit_hooks_off

    def hook(*a, **k):
        return False
    rt = knobs.runtime
    saved = rt.jit_cache_hook, rt.jit_post_compile_hook
    rt.jit_cache_hook = rt.jit_post_compile_hook = hook
    try:
        with pytest.raises(RuntimeError):
            with jit_hooks_off():
                assert rt.jit_cache_hook is None and rt.jit_post_compile_hook is None
                raise RuntimeError("a launch failed")
        assert rt.jit_cache_hook is hook and rt.jit_post_compile_hook is hook
    finally:
        rt.jit_cache_hook, rt.jit_post_compile_hook = saved


def test_qwen3_qkv_tasks_hold_whole_heads(seed):
    """Qwen3 streams on the tensor cores only: the q/k RMSNorm pass after a qkv task's last block
    (stream_epilogue.qk_norm_head) sums each head's HD rows, so every qkv task holds whole heads (its units a
    multiple of HD / RG) and the tasks cover every head once; the kernel's QKN is on, and the argument table's qn /
    kn slots hold the layer's q_norm / k_norm. A CUDA-core (fma) step is refused with the reason; Llama steps keep
    QKN off."""
    from onekernel.exec.stream_plan import ROLES
    from onekernel.exec.stream_support import unsupported_graph

    for workers in (8, 5, 132):
        step, W = _step(3, seed, workers=workers, cfg=CFGQ, gemv="mma")
        plan = make_plan(step, W)
        assert plan.consts["QKN"] and unsupported_graph(step.graph, 3) is None
        ch = CFGQ.head_dim // plan.consts["RG"]
        n_heads = CFGQ.n_heads + 2 * CFGQ.n_kv_heads
        for op in (o for o in plan.graph.ops if plan.kinds[o.index] == sd.K_QKV.value):
            spans = sorted(plan.units[t] for t in op.task_ids)
            assert all(u0 % ch == 0 and nu % ch == 0 and nu > 0 for u0, nu in spans), (workers, spans)
            assert spans[0][0] == 0 and sum(nu for _, nu in spans) == n_heads * ch, spans  # every head once
            assert all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
            assert len(spans) == min(workers, n_heads)
    bases = {dt: torch.zeros(8, dtype=dt) for dt in (torch.bfloat16, torch.float32, torch.int32)}
    tab = arg_table(plan, dict(step.tensors, **scratch_tensors(plan, "cpu")), bases)
    roles = ROLES[sd.K_QKV.value]
    for op in (o for o in plan.graph.ops if plan.kinds[o.index] == sd.K_QKV.value):
        for role in ("qn", "kn"):
            t = step.tensors[op.args[role]]
            assert op.args[role].endswith("q_norm" if role == "qn" else "k_norm"), op.args[role]
            assert bases[torch.bfloat16].data_ptr() + int(tab[op.index, roles.index(role)]) * 16 == t.data_ptr()
    fma, _ = _step(3, seed, cfg=CFGQ, gemv="fma")
    why = unsupported_graph(fma.graph, 3)
    assert why is not None and "tensor-core" in why, why
    # head_dim 16: the pass spreads a head over a warp's 32 lanes
    g16, _, _ = decode_graph(dataclasses.replace(CFGQ, n_heads=64, n_kv_heads=16, head_dim=16), 3, 48, torch.bfloat16,
                             gemv="mma")
    why = unsupported_graph(g16, 3)
    assert why is not None and "head_dim 16" in why and "multiple of 32" in why, why
    llama, W = _step(3, seed, cfg=CFG8, gemv="mma")
    assert not make_plan(llama, W).consts["QKN"]


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.1-8b", "qwen3-0.6b", "smollm2-135m"])
def test_mma_activation_prefetch_at_every_batch(name):
    """The tensor-core GEMV's next activation tile (stream_mma._mma_block) sits in registers while it holds one
    4-row quad of CK values at most (CK 1024: batch 1-4), in an own raw tile of the quads' rows at batch 5-8 and
    straight in the staged tile above that (no raw tile); CK 512 (SmolLM2-135M's, stream_support.attn_cols) and 256
    in registers at every batch: at every batch 1..MAX_BATCH the plan's shared memory
    (ring, staged tile, partial sums, raw tile, 2 KB) fits the H100/H200's 227 KB with the ring the largest buffer
    (the allocator puts it at shared byte 0, where the loader's bulk copies address it), the raw tile holds every
    batch row, and a batch without a raw tile keeps batch 1's ring slots."""
    from onekernel.exec.stream_plan import SMEM_LIMIT, _slots, acc_groups, mma_smem
    from onekernel.exec.stream_support import MAX_BATCH, chunk_shape

    g, _, _ = decode_graph(get_config(name), 1, 64, torch.bfloat16, gemv="mma")
    _, ck, rg, kxb = chunk_shape(g)
    slots1 = _slots(1, kxb, ck, rg, True, 1)
    for b in range(1, MAX_BATCH + 1):
        regs, raw, direct = not sd.mma_async_a(b, ck), sd.mma_raw_tile(b, ck), sd.mma_direct_a(b, ck)
        assert regs + raw + direct == 1, (b, regs, raw, direct)          # exactly one place for the next tile
        assert regs == (ck < 1024 or -(-b // 4) * ck <= 1024), b        # registers: one quad of CK 1024, or CK < 1024
        slots = _slots(1, kxb, ck, rg, True, b)
        assert mma_smem(ck, rg, b) + slots * CHUNK_ELEMS * 2 + 2048 <= SMEM_LIMIT, (b, slots)
        assert slots * CHUNK_ELEMS * 2 > max(sd.MMA_ROWS * ck * 2, acc_groups(rg) * 4 * sd.MMA_ROWS * rg * 4), b
        if raw:
            assert b <= sd.mma_raw_rows(b) <= 16 and sd.mma_raw_rows(b) % 4 == 0, b
            assert mma_smem(ck, rg, b) == mma_smem(ck, rg, 1) + sd.mma_raw_rows(b) * ck * 2, b
        else:
            assert slots == slots1, (b, slots, slots1)
    if ck == 1024:  # the three places all occur on the CK-1024 models
        assert [sd.mma_raw_tile(b, ck) for b in (4, 5, 8, 9)] == [False, True, True, False]
    for b in range(1, MAX_BATCH + 1):  # CK 512 (tensor-parallel shards) and 256 keep their registers at every batch
        assert not any(sd.mma_async_a(b, c) for c in (256, 512)), b
        rows = sd.mma_raw_rows(b)  # Gluon allocates power-of-two shapes only
        assert rows & (rows - 1) == 0 and b <= rows <= 16, (b, rows)


@pytest.mark.parametrize("gemv,mode,min_d,on", [("mma", "auto", 1024, True), ("mma", "auto", 4096, False),
                                                ("mma", "1", 4096, True), ("mma", "0", 1024, False),
                                                ("fma", "1", 1024, False)])
def test_rmsnorm_partials_link_each_residual_gemv_to_its_reader(gemv, mode, min_d, on, seed, monkeypatch):
    """stream_plan.SS_PARTIALS on a tensor-core step (2 layers, hidden size 1024): every residual GEMV gets its own fp32
    [B, NSS] partials buffer, NSS = its tasks (min(units, workers)); task j writes column j (region, F_IDX) and the
    reader of its output (gate_up, the next layer's qkv_rope, lm_head) reads all of it, at argument slot
    ROLES[kind].index("ss"); the first layer's qkv_rope (the embedding's reader) has none. The records flag exactly those
    tasks (F_SS) and every reader task waits, through its events, on every producer task. "auto" below SS_MIN_D, "0",
    or the CUDA-core path: no partials, NSS 0, no flag."""
    from onekernel.exec import stream_plan
    monkeypatch.setattr(stream_plan, "SS_PARTIALS", mode)
    monkeypatch.setattr(stream_plan, "SS_MIN_D", min_d)
    cfg = dataclasses.replace(CFG8, n_layers=2)
    step, W = _step(3, seed, workers=12, cfg=cfg, gemv=gemv)
    plan = make_plan(step, W)
    g, ev = plan.graph, plan.events
    nss = min(-(-cfg.dim // plan.consts["RG"]), W) if on else 0
    assert plan.consts["NSS"] == nss
    assert plan.consts["MAXA"] == stream_plan.MAXA == 10  # the all-reduce's 10 slots: "ss" widens no row
    qrec, _ = records(plan)
    flag = {row[sd.F_TASK.value]: row[sd.F_SS.value] for row in qrec[:-1].tolist()}
    idx = {row[sd.F_TASK.value]: row[sd.F_IDX.value] for row in qrec[:-1].tolist()}
    tensors = dict(step.tensors, **scratch_tensors(plan, "cpu"))
    bases = {dt: torch.zeros(8, dtype=dt) for dt in (torch.bfloat16, torch.float32, torch.int32)}
    tab = arg_table(plan, tensors, bases)
    assert tab.shape == (len(g.ops), plan.consts["MAXA"])
    producer = {op.args["out"]: op for op in g.ops if op.kind.name == "gemv_residual"}
    readers = [op for op in g.ops if op.kind.name in ("qkv_rope", "gate_up", "lm_head")]
    assert len(producer) == 2 * cfg.n_layers and len(readers) == 2 * cfg.n_layers + 1
    for op in producer.values():
        assert ("ss" in op.args) == on
        if not on:
            assert all(flag[task] == 0 for task in op.task_ids)
            continue
        buf = g.buffers[op.args["ss"]]
        assert buf.shape == (3, nss) and buf.dtype == torch.float32 and len(op.task_ids) == nss
        t = tensors[op.args["ss"]]
        assert tab[op.index, stream_plan.ROLES[sd.K_RESID.value].index("ss")] * 16 == \
            t.data_ptr() - bases[torch.float32].data_ptr()
        assert (t == -1).all()  # poisoned until the kernel writes it
        for j, task in enumerate(op.task_ids):
            assert idx[task] == j and flag[task] == 1
            assert [w.box for w in g.tasks[task].writes if w.buffer == op.args["ss"]] == [((0, 3), (j, j + 1))]
    for op in readers:
        src = producer.get(op.args["x"])
        assert ("ss" in op.args) == (on and src is not None), op.name
        for task in op.task_ids:
            assert flag[task] == int("ss" in op.args)
        if "ss" not in op.args:
            continue
        assert op.args["ss"] == src.args["ss"]
        slot = stream_plan.ROLES[plan.kinds[op.index]].index("ss")
        assert tab[op.index, slot] == tab[src.index, stream_plan.ROLES[sd.K_RESID.value].index("ss")]
        for task in op.task_ids:
            waited = {p for e in ev.waits[task] for p in ev.producers[e]}
            assert set(src.task_ids) <= waited, op.name



def test_a_bad_rmsnorm_partials_mode_stops_the_import():
    """STREAM_SS_PARTIALS other than auto / 1 / 0 is an InputError when exec.stream_plan is imported (raised inside a
    runner's build, backend="auto" would fall back to the Triton megakernel on it and change the bits silently)."""
    out = subprocess.run([sys.executable, "-c", "import onekernel.exec.stream_plan"], capture_output=True, text=True,
                         env=dict(os.environ, STREAM_SS_PARTIALS="on"), timeout=300)
    assert out.returncode != 0
    assert "InputError: STREAM_SS_PARTIALS must be auto, 1 or 0, got 'on'; unset it for the default (auto)" in out.stderr
