"""A simulation of the streaming megakernel's queues on every tensor-parallel rank, for tests/test_stream_tp.py (pull)
and tests/test_tp_push.py (push): each rank's workers run their queue positions (exec/stream_records.py records) in
order, a position running once its local waits (its own counters) and its remote waits (counter cells the routing
names) are met; a run adds one to its signal's cells. The ranks run free: a rank starts its next step (the next
kernel launch, counters never reset) as soon as its own step ends, so one rank can be a step ahead of another.
That is more than the runners allow in ``step`` (the logits gather after each step lines the ranks up), but not
more than the kernel must survive (a launch without the gather, as the timed launches of scripts/tp_one_gpu.py, or
a host that queues steps ahead), and it is what the cross-step argument of dist/tp_megakernel.py covers. The order
is adversarial: at every move the first runnable position in ``order`` (rank order, then worker) runs; or, with a
seed, bursts: a random rank with a runnable position runs up to a random number of moves (1-256) before the next
draw, so one rank can get far ahead of the others.

Besides "no wait cycle" it checks the data each remote read sees: every task write is versioned by its writer's
step, and an all-reduce position of step k must find, for every producer on the peer of each event it waits on, the
rows of that producer's step k: not an older step (a wait met too early) and not a newer one (a peer a step ahead
overwrote them before they were read).
"""
from __future__ import annotations

import random

from onekernel.exec import stream_base as sd
from onekernel.exec.stream_records import records, remote_wait_list


class PullRouting:
    """The pull all-reduce: a remote wait reads the peer's own counter, a signal adds to this rank's own counter,
    and the rows are read where the producer wrote them (the peer's own buffer)."""
    push = False

    def __init__(self, n_ranks: int, n_events: int):
        self.mem = [[0] * n_events for _ in range(n_ranks)]

    def wait_cell(self, r, p, e):
        return p, e

    def signal_cells(self, r, sig, sys):
        return [(r, sig)]


def simulate(plans, routing, *, steps: int = 3, order=None, seed: int | None = None) -> None:
    """Run every rank's queues of ``plans`` (one stream plan per rank, the same tasks) for ``steps`` steps through
    ``routing`` (PullRouting, or an object with the same ``mem``, ``wait_cell``, ``signal_cells`` and ``push``);
    ``order`` a rank priority list (default: reversed ranks), ``seed`` random bursts instead (module doc). Raises
    AssertionError on a wait cycle or on a remote read that saw another step's rows."""
    n = len(plans)
    order = list(order or reversed(range(n)))
    rng = random.Random(seed) if seed is not None else None
    tabs = []
    for p in plans:
        qrec, wl = records(p)
        queues = p.schedule.queues
        offs = [sum(len(q) for q in queues[:w]) for w in range(len(queues))]
        tabs.append((qrec.tolist(), wl.tolist(), remote_wait_list(p).tolist(), [len(q) for q in queues], offs))
    mem = routing.mem
    step = [1] * n
    pos = [[0] * len(t[3]) for t in tabs]
    version = {}  # (holder rank, writer rank, task) -> the writer's step

    def runnable(r, w):
        qrec, wl, rwl, lens, offs = tabs[r]
        if step[r] > steps or pos[r][w] >= lens[w]:
            return None
        row = qrec[offs[w] + pos[r][w]]
        k = step[r]
        if not all(mem[r][e] >= x * k for e, x in wl[row[sd.F_WB.value]:row[sd.F_WE.value]]):
            return None
        remote = rwl[row[sd.F_RWB.value]:row[sd.F_RWE.value]] if row[sd.F_KIND.value] == sd.K_ALLREDUCE.value else []
        for e, x, p in remote:
            rr, i = routing.wait_cell(r, p, e)
            if mem[rr][i] < x * k:
                return None
        return row, remote

    def run(r, w, row, remote):
        k = step[r]
        for e, _, p in remote:
            holder = r if routing.push else p
            for t in plans[p].events.producers[e]:
                seen = version.get((holder, p, t))
                assert seen == k, (f"rank {r} step {k}: all-reduce task {row[sd.F_TASK.value]} read rank {p}'s rows "
                                   f"of task {t} from step {seen}")
        task, sig = row[sd.F_TASK.value], row[sd.F_SIGNAL.value]
        version[(r, r, task)] = k
        if routing.push and row[sd.F_SYS.value]:
            for q in range(n):
                if q != r:
                    version[(q, r, task)] = k
        if sig >= 0:
            for rr, i in routing.signal_cells(r, sig, row[sd.F_SYS.value]):
                mem[rr][i] += 1
        pos[r][w] += 1
        if pos[r] == tabs[r][3]:  # the step's kernel ends; the rank launches the next at once
            step[r] += 1
            pos[r] = [0] * len(pos[r])

    def move(ranks) -> bool:  # run the first runnable position of ``ranks`` (in order, then worker)
        for r in ranks:
            for w in range(len(pos[r])):
                got = runnable(r, w)
                if got is not None:
                    run(r, w, *got)
                    return True
        return False

    while any(s <= steps for s in step):
        if rng is None:
            moved = move(order)
        else:  # a burst: one random rank that can move runs up to 1-256 moves
            live = [r for r in range(n) if any(runnable(r, w) is not None for w in range(len(pos[r])))]
            moved = bool(live)
            if live:
                r = rng.choice(live)
                for _ in range(rng.randint(1, 256)):
                    if not move([r]):
                        break
        if not moved:
            left = [sum(t[3]) - sum(p) if s <= steps else 0 for t, p, s in zip(tabs, pos, step)]
            raise AssertionError(f"steps per rank {step}: tasks left per rank {left} (a cross-rank wait cycle)")
