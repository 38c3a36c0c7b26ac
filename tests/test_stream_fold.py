"""The streaming megakernel's merge fold on the CPU (exec/stream_fold.py, stream_plan.make_plan(fold=...)): the
attention runs merge their own split-KV partials, so the plan has no merge tasks. Checked here: the arrival
arithmetic of stream_attn._arrive_and_merge (written again from the kernel, not taken from the planner) counts
every tile of every (sequence, KV head) group exactly once, and the dependencies are the unfolded plan's with each
merge task replaced by its own producers. The kernel itself runs on a GPU only (tests/test_stream_gpu.py)."""
import dataclasses

import pytest
import torch

from onekernel.exec import stream_base as sd
from onekernel.exec.stream_fold import fold_fits
from onekernel.exec.stream_pack import arg_table, scratch_tensors
from onekernel.exec.stream_plan import make_plan
from onekernel.graph.schedule import validate
from onekernel.models.config import get_config
from onekernel.models.decode_graph import build_decode_step
from onekernel.models.random_init import random_weights
from onekernel.ops.tiling import Tiling
from onekernel.runtime.kv_cache import KVCache

CFG = dataclasses.replace(get_config("tiny"), name="fold-test", vocab_size=300, dim=128, n_heads=4, n_kv_heads=2,
                          head_dim=64, ffn_dim=384)


def _step(batch, seed, workers, seq=48):
    w = random_weights(CFG, torch.bfloat16, "cpu", seed)
    return build_decode_step(CFG, w, KVCache(CFG, batch, seq, torch.bfloat16, "cpu"), tiling=Tiling(workers, "fit"))


def _producers(plan, t):
    """The tasks whose signals task t waits for."""
    ev = plan.events
    return {p for e in ev.waits[t] for p in ev.producers[e]}


def _ops(plan, tasks):
    g = plan.graph
    return {g.ops[g.tasks[p].op].name for p in tasks}


@pytest.mark.parametrize("batch,workers", [(1, 8), (3, 5), (5, 16)])
def test_folded_dependencies_are_the_merge_tasks_producers(batch, workers, seed):
    """Folded: no attn_merge op; each O-projection task waits for exactly the attention tasks its merge tasks
    waited for (every attention run of its layer), attention runs wait for no other attention run, and every
    other task waits on the same ops as without the fold. The schedule stays valid."""
    step = _step(batch, seed, workers)
    sep, fold = make_plan(step, workers, fold=False), make_plan(step, workers, fold=True)
    assert fold.consts["FOLD"] and not sep.consts["FOLD"]
    assert not [op for op in fold.graph.ops if op.kind.name == "attn_merge"]
    validate(fold.schedule, fold.graph, [sorted(_producers(fold, t)) for t in range(len(fold.graph.tasks))])
    sep_ops = {op.name: op for op in sep.graph.ops}
    for op in fold.graph.ops:
        twin = sep_ops[op.name]
        for t, u in zip(op.task_ids, twin.task_ids):
            got = _producers(fold, t)
            if op.name.startswith("o_proj."):
                merges = _producers(sep, u)
                assert _ops(sep, merges) == {op.name.replace("o_proj", "attn_merge")}
                want = set().union(*(_producers(sep, m) for m in merges))
                layer = next(o for o in fold.graph.ops if o.name == op.name.replace("o_proj", "attn_partial"))
                assert _ops(sep, want) == {layer.name}
                assert {fold.graph.tasks[p].tile for p in got} == {sep.graph.tasks[p].tile for p in want}
                assert got == set(layer.task_ids), f"{op.name} waits for {len(got)} of {len(layer.task_ids)} runs"
            else:
                assert _ops(fold, got) == _ops(sep, _producers(sep, u)), op.name
            if op.kind.name == "attn_partial":
                assert not _ops(fold, got) & {o.name for o in fold.graph.ops if o.kind.name == "attn_partial"}


@pytest.mark.parametrize("batch,workers,seq", [(1, 8, 48), (2, 3, 48), (5, 7, 300), (16, 132, 1024), (4, 2, 1024)])
def test_arrivals_count_every_tile_of_every_group_once(batch, workers, seq, seed):
    """The kernel's arrival (per run [u0, u0 + nu): groups g0 + j for j < NGP, g0 = u0 // NSPLIT, each adding
    min(u0 + nu, (g + 1) NSPLIT) - max(u0, g NSPLIT) when positive) adds exactly NSPLIT to every group's counter
    over the layer's runs, and every group a run touches is within its NGP window (else a counter never reaches
    NSPLIT and the O-projection waits forever)."""
    step = _step(batch, seed, workers, seq)
    plan = make_plan(step, workers, fold=True)
    c = plan.consts
    assert c["FOLD"] and c["NGP"] <= 32 and c["NGP"] & (c["NGP"] - 1) == 0
    nsplit = c["NSPLIT"]
    for op in (o for o in plan.graph.ops if o.kind.name == "attn_partial"):
        count = [0] * (batch * c["HKV"])
        for t in op.task_ids:
            u0, nu = plan.units[t]
            g0 = u0 // nsplit
            assert (u0 + nu - 1) // nsplit - g0 < c["NGP"], f"run {u0}+{nu} spans more than NGP={c['NGP']} groups"
            for j in range(c["NGP"]):
                n = min(u0 + nu, (g0 + j + 1) * nsplit) - max(u0, (g0 + j) * nsplit)
                if n > 0:
                    count[g0 + j] += n
        assert count == [nsplit] * len(count), op.name


def test_arrival_counters_and_merged_rows_are_in_the_argument_table(seed):
    """Each attention op gets its own zeroed counter buffer stream.arrive.<op> int32 [B * Hkv]; the argument
    table's roles 6 and 7 of the op point at its merge's output rows and at that counter."""
    step = _step(3, seed, 8)
    plan = make_plan(step, 8, fold=True)
    g = plan.graph
    scratch = scratch_tensors(plan, "cpu")
    tensors = dict(step.tensors, **scratch)
    bases = {dt: torch.zeros(8, dtype=dt) for dt in (torch.bfloat16, torch.float32, torch.int32)}
    tab = arg_table(plan, tensors, bases)
    attn = [op for op in g.ops if op.kind.name == "attn_partial"]
    assert len(attn) == CFG.n_layers
    for op in attn:
        arrive = scratch[f"stream.arrive.{op.name}"]
        assert arrive.shape == (3 * CFG.n_kv_heads,) and arrive.dtype == torch.int32 and not arrive.any()
        assert op.args["out"] == op.name.replace("attn_partial", "attn_merge") + ".out"
        assert int(tab[op.index, 6]) * 16 == tensors[op.args["out"]].data_ptr() - bases[torch.bfloat16].data_ptr()
        assert int(tab[op.index, 7]) * 16 == arrive.data_ptr() - bases[torch.int32].data_ptr()
        assert plan.kinds[op.index] == sd.K_ATTN.value


def test_a_run_spanning_too_many_groups_keeps_the_merge_tasks(seed):
    """With so few workers that a run of attention tiles spans more groups than the kernel's 32-bit mask,
    the plan keeps its merge tasks (fold_fits) instead of losing arrivals."""
    step = _step(16, seed, 1, seq=48)
    assert not fold_fits(step.graph, 1)
    plan = make_plan(step, 1, fold=True)
    assert not plan.consts["FOLD"] and any(op.kind.name == "attn_merge" for op in plan.graph.ops)
    assert fold_fits(step.graph, 8)
