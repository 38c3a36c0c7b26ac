"""The separate-kernel modes on the streaming megakernel's Gluon bodies (exec.stream_segments): the plan cut into
one kernel per op. CPU only: the cut (every worker's queue and chunk stream split at op boundaries, nothing lost,
nothing run twice, each kernel's chunks those of its own tasks' weights) and the option checks; the kernels run
on a Hopper GPU (scripts/gpu_call.sh)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from onekernel.errors import InputError
from onekernel.exec.stream_pack import pack_weights
from onekernel.exec.stream_plan import CHUNK_ELEMS, make_plan
from onekernel.exec.stream_segments import segments
from onekernel.models.config import get_config
from onekernel.models.decode_graph import build_decode_step
from onekernel.models.random_init import random_weights
from onekernel.ops.tiling import Tiling
from onekernel.runtime.kv_cache import KVCache

CFG = dataclasses.replace(get_config("tiny"), name="seg-test", vocab_size=300, dim=1024, n_heads=8, n_kv_heads=2,
                          head_dim=128, ffn_dim=2048, n_layers=2)


def _plan(batch, workers, gemv, seed):
    w = random_weights(CFG, torch.bfloat16, "cpu", seed)
    cache = KVCache(CFG, batch, 48, torch.bfloat16, "cpu")
    step = build_decode_step(CFG, w, cache, tiling=Tiling(workers, "fit"), gemv=gemv)
    return step, make_plan(step, workers)


@pytest.mark.parametrize("batch,workers,gemv,seed", [(1, 8, "mma", 0), (3, 5, "mma", 1), (2, 7, "fma", 2)])
def test_one_kernel_per_op_covers_every_queue_and_chunk_once(batch, workers, gemv, seed):
    """Concatenated in op order, the kernels' position ranges of worker w are exactly its queue (the megakernel's
    qoff range), each holding only tasks of its op; their chunk ranges are exactly the worker's packed chunks
    (pack_weights' chunk_off), and each kernel's chunks number its tasks' weight bytes / 16 KB."""
    step, plan = _plan(batch, workers, gemv, seed)
    _, off = pack_weights(plan, step.tensors)
    ptr = plan.schedule.arrays()["queue_ptr"].tolist()
    ids = plan.schedule.arrays()["queue_ids"].tolist()
    segs = segments(plan)
    assert [o for o, *_ in segs] == list(range(len(plan.graph.ops)))
    for w in range(workers):
        q, c = ptr[w], int(off[w])
        for o, qb, qe, cb, ce in segs:
            assert qb[w] == q and qe[w] >= qb[w] and cb[w] == c and ce[w] >= cb[w], (w, o)
            tasks = ids[qb[w]:qe[w]]
            assert all(plan.graph.tasks[t].op == o for t in tasks), (w, o, tasks)
            assert ce[w] - cb[w] == sum(plan.graph.tasks[t].bytes for t in tasks
                                        if o in plan.group_rows) // (CHUNK_ELEMS * 2), (w, o)
            q, c = qe[w], ce[w]
        assert q == ptr[w + 1] and c == int(off[w + 1]), w


def test_a_queue_out_of_op_order_is_refused():
    """A worker whose queue runs a later op's task before an earlier op's cannot be cut at op boundaries:
    segments raises ValueError naming the worker."""
    _, plan = _plan(1, 4, "mma", 3)
    q = plan.schedule.queues[1]
    q[0], q[-1] = q[-1], q[0]
    with pytest.raises(ValueError, match="worker 1's queue is not in op order"):
        segments(plan)


@pytest.mark.parametrize("mode", ["graph", "pdl"])
def test_the_gluon_backend_of_graph_and_pdl_is_checked(mode):
    """backend= of graph / pdl: an unknown name is refused with the choices, and "gluon" (a Hopper GPU's) is
    refused in the Triton interpreter; neither builds anything."""
    from onekernel.exec import make_runner

    w = random_weights(CFG, torch.bfloat16, "cpu", 4)
    step = build_decode_step(CFG, w, KVCache(CFG, 1, 48, torch.bfloat16, "cpu"), tiling=Tiling(4, "fit"))
    with pytest.raises(InputError, match="unknown .* backend 'cuda'.*auto, triton, gluon"):
        make_runner(mode, step, interpret=True, backend="cuda")
    with pytest.raises(InputError, match="Hopper GPU only"):
        make_runner(mode, step, interpret=True, backend="gluon")


@pytest.mark.parametrize("batch,workers,seed", [(1, 6, 5), (4, 9, 6)])
def test_one_kernel_per_layer_joins_the_ops_of_each_layer(batch, workers, seed):
    """segment="layer": one kernel per decoder layer (the embedding with layer 0, the LM head and argmax with the
    last), each kernel's ranges exactly the concatenation of its ops' per-op ranges for every worker."""
    from onekernel.exec.stream_segments import op_groups

    _, plan = _plan(batch, workers, "mma", seed)
    names = [op.name for op in plan.graph.ops]
    groups = op_groups(plan, "layer")
    assert groups == [0 if n == "embed" else CFG.n_layers - 1 if n.startswith("lm_head") else int(n.split(".")[1])
                      for n in names]
    per_op, per_layer = segments(plan, "op"), segments(plan, "layer")
    assert len(per_layer) == CFG.n_layers
    for k, (o, qb, qe, cb, ce) in enumerate(per_layer):
        mine = [s for s in per_op if groups[s[0]] == k]
        assert o == mine[0][0]
        for w in range(workers):
            assert (qb[w], cb[w]) == (mine[0][1][w], mine[0][3][w]) and (qe[w], ce[w]) == (mine[-1][2][w], mine[-1][4][w])
            assert all(a[2][w] == b[1][w] and a[4][w] == b[3][w] for a, b in zip(mine, mine[1:])), (k, w)


def test_an_unknown_segment_is_refused():
    """segment= other than "op" / "layer": InputError naming the choices."""
    from onekernel.exec.stream_segments import op_groups

    _, plan = _plan(1, 4, "mma", 7)
    with pytest.raises(InputError, match="segment must be 'op' or 'layer'.*'block'"):
        op_groups(plan, "block")
