"""Static schedules: both policies valid on random DAGs, validate == simulated execution, residency limits."""
import random

import pytest

from onekernel.errors import DeviceError, ScheduleError
from onekernel.graph.deps import derive_dependencies
from onekernel.graph.paths import topological_order
from onekernel.graph.schedule import Schedule, critical_path_list, residency_check, round_robin, validate
from test_graph import chain_graph, random_dag, random_region_graph


def simulate(schedule, deps):
    """Each worker runs its queue in order; a task runs only when its deps are done. True iff all tasks ran."""
    done = [False] * len(deps)
    pos = [0] * len(schedule.queues)
    ran, progress = 0, True
    while progress:
        progress = False
        for w, q in enumerate(schedule.queues):
            while pos[w] < len(q) and all(done[d] for d in deps[q[pos[w]]]):
                done[q[pos[w]]] = True
                pos[w] += 1
                ran += 1
                progress = True
    return ran == len(deps)


def random_case(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 5, 20, 60, 150, 300])
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.randint(1, 20))
    sizes[-1] -= sum(sizes) - n
    g = chain_graph(sizes)
    for t in g.tasks:
        t.bytes = rng.choice([0, 1, 10, 1000])
    deps = random_dag(rng, n, p_edge=rng.choice([0.0, 0.01, 0.05, 0.3]), program_order=seed % 4 != 0)
    return rng, g, deps, rng.choice([1, 2, 3, 8, 33, 132])


@pytest.mark.parametrize("seed", range(200))
def test_policies_valid_on_random_dags(seed):
    rng, g, deps, workers = random_case(seed)
    for sched in (round_robin(g, deps, workers), critical_path_list(g, deps, workers)):
        assert sched.n_workers == workers == len(sched.queues)
        assert sorted(t for q in sched.queues for t in q) == list(range(len(g.tasks)))
        validate(sched, g, deps)
        assert simulate(sched, deps)
        a = sched.arrays()
        assert a["queue_ptr"][-1] == len(g.tasks)


@pytest.mark.parametrize("seed", range(50))
def test_policies_on_region_graphs(seed):
    g = random_region_graph(random.Random(seed))
    deps = derive_dependencies(g)
    for w in (1, 4, 132):
        for sched in (round_robin(g, deps, w), critical_path_list(g, deps, w)):
            validate(sched, g, deps)
            assert simulate(sched, deps)


@pytest.mark.parametrize("seed", range(300))
def test_validate_agrees_with_simulation(seed):
    """Random (often invalid) schedules: validate accepts exactly those that run to completion."""
    rng, g, deps, workers = random_case(seed)
    n = len(g.tasks)
    order = topological_order(g, deps)
    for _ in range(rng.randint(0, 3)):  # a few swaps of a valid order
        i, j = rng.randrange(n), rng.randrange(n)
        order[i], order[j] = order[j], order[i]
    if seed % 5 == 0:
        rng.shuffle(order)
    workers = min(workers, 8)
    queues = [[] for _ in range(workers)]
    for t in order:
        queues[rng.randrange(workers)].append(t)
    sched = Schedule(queues, workers, "random")
    ok = simulate(sched, deps)
    if ok:
        validate(sched, g, deps)
    else:
        with pytest.raises(ScheduleError):
            validate(sched, g, deps)


def test_same_queue_order_rejected():
    g = chain_graph([2, 1])
    deps = [[], [0], [1]]
    with pytest.raises(ScheduleError, match=r"task 2 \(op1 tile 0, worker 0\).*task 1 \(op0 tile 1, worker 0\)"):
        validate(Schedule([[0, 2, 1]], 1, "bad"), g, deps)
    with pytest.raises(ScheduleError, match=r"task 2 .*worker 1\).*position 0.*task 1 .*position 1"):
        validate(Schedule([[0], [2, 1]], 2, "bad"), g, [[], [], [1]])


def test_cross_queue_cycle_rejected():
    g = chain_graph([4])
    deps = [[], [0], [], [2]]  # 1 waits on 0, 3 waits on 2
    validate(Schedule([[0, 3], [2, 1]], 2, "ok"), g, deps)
    with pytest.raises(ScheduleError, match="cyclic wait") as e:
        validate(Schedule([[1, 2], [3, 0]], 2, "bad"), g, deps)
    msg = str(e.value)
    assert all(f"task {t} " in msg for t in range(4)) and "worker 0" in msg and "worker 1" in msg


def test_missing_and_duplicate_rejected():
    g = chain_graph([3])
    deps = [[], [], []]
    with pytest.raises(ScheduleError, match=r"in no queue: \[2\]"):
        validate(Schedule([[0, 1], []], 2, "bad"), g, deps)
    with pytest.raises(ScheduleError, match="task 1 on worker 0 .* and worker 1"):
        validate(Schedule([[0, 1], [1, 2]], 2, "bad"), g, deps)
    with pytest.raises(ScheduleError, match="queues"):
        validate(Schedule([[0, 1, 2]], 2, "bad"), g, deps)


def test_critical_path_list_prefers_long_chain():
    g = chain_graph([6])
    for t in g.tasks:
        t.bytes = 1
    deps = [[], [0], [1], [], [], []]  # chain 0-1-2 and independent 3, 4, 5
    s = critical_path_list(g, deps, 2)
    assert s.queues[0][0] == 0 and s.queues[0][:3] == [0, 1, 2]
    assert round_robin(g, deps, 2).queues == [[0, 2, 4], [1, 3, 5]]


def test_large_schedule_validates():
    rng = random.Random(7)
    n = 4000
    g = chain_graph([n])
    deps = random_dag(rng, n, p_edge=0.001)
    for sched in (round_robin(g, deps, 132), critical_path_list(g, deps, 132)):
        validate(sched, g, deps)


H200 = {"sm_count": 132, "smem_per_sm": 233472}


@pytest.mark.parametrize("regs,warps,smem,per_sm", [
    (128, 4, 0, 4),          # 128*32 = 4096 regs/warp -> 16 warps -> 4 CTAs of 4 warps
    (255, 8, 0, 1),          # 8160 -> 8192 regs/warp -> 8 warps -> 1 CTA of 8 warps
    (32, 1, 0, 32),          # registers allow 64, threads 64, block limit 32
    (64, 16, 0, 2),          # 2048 regs/warp -> 32 warps -> 2 CTAs; threads 2048/512 = 4
    (32, 4, 150000, 1),      # 233472 // (150000 + 1024) = 1
    (32, 4, 56000, 4),       # 233472 // 57024 = 4
])
def test_residency(regs, warps, smem, per_sm):
    meta = {"n_regs": regs, "num_warps": warps, "shared": smem}
    assert residency_check(per_sm * 132, meta, H200) == per_sm * 132
    with pytest.raises(DeviceError) as e:
        residency_check(per_sm * 132 + 1, meta, H200)
    assert str(e.value).startswith(f"{per_sm * 132 + 1} workers need {per_sm * 132 + 1} co-resident CTAs but only "
                                   f"{per_sm * 132} fit: {per_sm} per SM x 132 SMs given {regs} registers/thread, "
                                   f"{warps} warps, {smem} bytes shared memory")
    assert str(e.value).endswith(f"use --workers <= {per_sm * 132}")


def test_residency_kernel_too_big():
    with pytest.raises(DeviceError, match="only 0 fit"):
        residency_check(1, {"n_regs": 32, "num_warps": 4, "shared": 240000}, H200)
    assert residency_check(1, {"n_regs": 32, "num_warps": 4, "shared": 1000},
                           {"sm_count": 2, "smem_per_sm": 4000, "smem_reserved_per_block": 0}) == 8
