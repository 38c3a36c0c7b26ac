"""A megakernel timeout names the wait the step stopped at, not only the first wait to give up: the streaming
kernel's per-task slots (stream_base.record_task, after the error word's head) list every wait that gave up, and
``PersistentRunner._raise_if`` names the one none of whose event's producers gave up (exec/persistent.py). The
kernel side runs on the H200 (scripts/replay_check.py's forced timeout); here the host side reads error words
written as the kernel writes them."""
from types import SimpleNamespace

import pytest
import torch

from onekernel.errors import KernelTimeoutError
from onekernel.exec.persistent import PersistentRunner
from onekernel.graph.deps import EventTable

HEAD = 16  # stream_base.ERR_TASKS
# tasks: 0 embed; 1, 2 down.1 (wait e0); 3, 4 qkv_rope.2 (wait e1); 5 attn_partial.2 (waits e2)
NAMES = ["embed", "down.1", "down.1", "qkv_rope.2", "qkv_rope.2", "attn_partial.2"]
EVENTS = EventTable(signal=[0, 1, 1, 2, 2, -1], waits=[[], [0], [0], [1], [1], [2]], expected=[1, 2, 2, 1],
                    producers=[[0], [1, 2], [3, 4], [5]])


class _Runner(PersistentRunner):
    """The host side of a megakernel runner, without a kernel."""
    task_graph = property(lambda self: self._graph)


def _runner(gave_up: dict, first: int, slots: bool = True, queues=None):
    """A runner whose error word says task ``first`` gave up first and whose slots hold ``gave_up`` (task ->
    (event, seen, want)); ``queues``: its workers' task orders (None: unknown, as the Triton megakernel's)."""
    r = object.__new__(_Runner)
    r.queues = lambda: queues
    ops = [SimpleNamespace(name=n, kind=SimpleNamespace(name=n.split(".")[0])) for n in NAMES]
    graph = SimpleNamespace(ops=ops, tasks=[SimpleNamespace(op=i, tile=0) for i in range(len(NAMES))])
    r.__dict__.update(_graph=graph, events=EVENTS, wait_limit="200 ms", _failed=None, err_head=HEAD)
    err = torch.zeros(HEAD + 3 * len(NAMES) if slots else 5, dtype=torch.int32)
    e, seen, want = gave_up[first]
    err[:5] = torch.tensor([1, first, e, seen, want])
    if slots:
        for t, (e, seen, want) in gave_up.items():
            err[HEAD + 3 * t: HEAD + 3 * t + 3] = torch.tensor([e + 1, seen, want])
    r.err = err
    return r


def _message(r) -> str:
    with pytest.raises(KernelTimeoutError) as info:
        r._raise_if(r.err[:r.err_head].tolist())
    return str(info.value)


def test_the_wait_the_step_stopped_at_comes_first():
    # task 2 (down.1) waits on a count no producer reaches; qkv_rope.2 and attn_partial.2 gave up behind it, and the
    # attention wait gave up first (it started waiting first)
    gave_up = {2: (0, 1, 1 << 20), 3: (1, 1, 2), 4: (1, 1, 2), 5: (2, 0, 2)}
    msg = _message(_runner(gave_up, first=5))
    assert msg.startswith("megakernel: task 2 (down.1, op kind down, tile 0) waited on event 0 (producers: "
                          "1 task of embed) and saw count 1 < expected 1048576"), msg
    assert "3 other wait(s) gave up as its consequences, the first of them: task 5 (attn_partial.2" in msg, msg


def test_the_first_wait_to_give_up_when_it_is_where_the_step_stopped():
    """Task 5 waits on event 2, which task 0 produces (it ran): task 5 stopped on its own, and so did task 2."""
    gave_up = {2: (0, 1, 1 << 20), 5: (2, 0, 2)}
    r = _runner(gave_up, first=5)
    r.events = EventTable(signal=EVENTS.signal, waits=EVENTS.waits, expected=EVENTS.expected,
                          producers=[[0], [1, 2], [0], [5]])
    msg = _message(r)
    assert msg.startswith("megakernel: task 5 (attn_partial.2"), msg
    assert "consequences" not in msg


def test_a_wait_downstream_of_one_that_gave_up_is_its_consequence():
    """Session 21's fresh-user review (SmolLM2-135M, 132 workers): a worker that holds only attention tasks starts
    waiting at the kernel's start, so an attention wait can give up first although it waits, through qkv_rope.2
    (tasks 3, 4, on other workers, after no failed wait: released when task 2 gave up and ran, so no slot), on the
    down.1 task that stopped the step. Neither its producers' slots nor the queues show it; the events do."""
    gave_up = {2: (0, 1, 1 << 20), 5: (2, 0, 2)}
    msg = _message(_runner(gave_up, first=5, queues=[[0, 1, 3], [2], [4], [5]]))
    assert msg.startswith("megakernel: task 2 (down.1, op kind down, tile 0) waited on event 0"), msg
    assert "1 other wait(s) gave up as its consequences, the first of them: task 5 (attn_partial.2" in msg, msg


def test_a_producer_that_stopped_without_a_slot_is_held_up_by_its_queue():
    """H200, run 20 call 202: on SmolLM2-135M the attention wait gave up first, and its producers (qkv_rope) never
    got a slot: their waits started after the failure was recorded and stopped at the error word. They run after a
    down.1 task that gave up in their workers' queues, so they were held up, and the step stopped at down.1."""
    gave_up = {1: (0, 1, 1 << 20), 2: (0, 1, 1 << 20), 5: (2, 0, 2)}
    msg = _message(_runner(gave_up, first=5, queues=[[0, 1, 3], [2, 4, 5]]))
    assert msg.startswith("megakernel: task 1 (down.1, op kind down, tile 0) waited on event 0"), msg
    assert "the step stopped there (and 1 other task(s) on that event); 1 other wait(s) gave up as its " \
           "consequences, the first of them: task 5 (attn_partial.2" in msg, msg


def test_queues_before_the_failure_hold_nothing_up():
    """Producers that come before every failed wait in their queues ran normally: the attention wait whose
    producers they are is where the step stopped (task 5's producers 3 and 4 run first on their workers)."""
    gave_up = {2: (0, 1, 1 << 20), 5: (2, 0, 2)}
    msg = _message(_runner(gave_up, first=2, queues=[[0, 3, 1], [4, 2, 5]]))
    assert msg.startswith("megakernel: task 2 (down.1"), msg
    assert "consequences" not in msg, msg


def test_two_origins_are_both_named_and_not_counted_as_consequences():
    """Task 1 (event 0) and task 5 (event 2, produced by task 0, which ran normally) both stopped on their own; task 3
    gave up first, a consequence of task 1 (event 1's producers are the down.1 tasks)."""
    gave_up = {1: (0, 1, 1 << 20), 3: (1, 0, 2), 5: (2, 0, 1)}
    r = _runner(gave_up, first=3, queues=[[0, 1, 3], [2, 4, 5]])
    r.events = EventTable(signal=EVENTS.signal, waits=EVENTS.waits, expected=EVENTS.expected,
                          producers=[[0], [1, 2], [0], [5]])
    msg = _message(r)
    assert msg.startswith("megakernel: task 1 (down.1"), msg
    assert "the step stopped there; 1 wait(s) on other events stopped on their own too (tasks 5); 1 other " \
           "wait(s) gave up as its consequences, the first of them: task 3 (qkv_rope.2" in msg, msg


def test_a_wait_on_an_event_no_failure_feeds_stopped_on_its_own():
    """A task downstream of a failed wait can still stop on its own, on another event (session 21's second review):
    task 5 also waits on event 4, whose producer (task 6) ran and which no failed wait feeds, and gave up there."""
    gave_up = {2: (0, 1, 1 << 20), 3: (1, 1, 2), 5: (4, 1, 2)}  # task 3 (a consequence of task 2) gave up first
    r = _runner(gave_up, first=3, queues=[[0, 1, 3], [2], [4], [6, 5]])
    r.events = EventTable(signal=EVENTS.signal + [4], waits=EVENTS.waits[:5] + [[2, 4], []],
                          expected=EVENTS.expected + [2], producers=EVENTS.producers + [[6]])
    r._graph.ops.append(SimpleNamespace(name="other", kind=SimpleNamespace(name="other")))
    r._graph.tasks.append(SimpleNamespace(op=6, tile=0))
    msg = _message(r)
    assert msg.startswith("megakernel: task 2 (down.1"), msg
    assert "1 wait(s) on other events stopped on their own too (tasks 5); 1 other wait(s) gave up as its " \
           "consequences, the first of them: task 3 (qkv_rope.2" in msg, msg


def test_a_corrupt_error_word_still_raises_the_timeout():
    """An event id outside the plan in the head, and slots that are not whole triples: a KernelTimeoutError that
    says so, never an IndexError or a reshape error."""
    r = _runner({5: (2, 0, 2)}, first=5)
    r.err[2] = 99
    r.err = torch.cat([r.err, torch.tensor([7], dtype=torch.int32)])
    msg = _message(r)
    assert "waited on event 99 (producers: unknown event: the plan has 4)" in msg, msg


def test_no_slots_no_change():
    """The Triton megakernel's error word has no per-task slots: the first wait to give up, as before."""
    msg = _message(_runner({5: (2, 0, 2)}, first=5, slots=False))
    assert msg.startswith("megakernel: task 5 (attn_partial.2") and "consequences" not in msg, msg
