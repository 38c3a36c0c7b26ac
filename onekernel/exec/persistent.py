"""What both persistent megakernels share (the Triton one, ``exec.megakernel``; the streaming Gluon one,
``exec.stream_runner``): ``PersistentRunner`` (the launch or CUDA-graph replay of one persistent kernel, its
monotonic counters, the error word that ``check()`` / ``poll()`` turn into ``KernelTimeoutError``),
``peer_counters`` (a tensor-parallel rank's view of every rank's event counters), ``push_counters`` (the push
all-reduce's counter sets and offset tables) and ``jit_hooks_off``."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from onekernel.errors import InputError, KernelTimeoutError
from onekernel.exec import mk_device
from onekernel.exec.base import StepRunner, cuda_graphs_enabled

RSLOT = int(mk_device.ERR_RSLOT)  # the error word's remote slot (TP > 1)
# The event counters only grow: a wait on (event, n) spins until count >= n * epoch, compared as int32, and the done
# counter reaches n_workers * epoch. When n * epoch crosses 2^31 the target is negative while the count is not, and
# that step's wait passes at once: every 2^32 / n steps per event, the first after 16.3M steps at the streaming plans'
# 132 producers (2.8 h of SmolLM2-135M decoding), after 904,585 at the Triton megakernel's 2,374 LM-head tiles of
# Qwen3 (one argmax event). The runner puts the counters, the done counter and the epoch back to their initial
# values between two steps every REWIND_EVERY steps, or sooner where an event's count or the grid needs it
# (PersistentRunner._rewind_steps).
REWIND_EVERY = 1 << 20


def peer_counters(counters, rank: int, n_events: int, dev, peers=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's counters [n_events], peer_off int64 [n_ranks]: int32 elements from them to each rank's), for
    a tensor-parallel megakernel of either backend. ``peers``: the ranks the graph reads (checked when given).
    Raises InputError for a rank out of range, counters too small, misaligned or on another device, or peers
    without counters."""
    n = max(n_events, 1)
    if not isinstance(rank, int) or not 0 <= rank < len(counters):
        raise InputError(f"rank {rank!r} is not one of the {len(counters)} ranks whose counters were given")
    for p, c in enumerate(counters):
        if c.dtype != torch.int32 or c.numel() < n or not c.is_contiguous() or c.data_ptr() % 16:
            raise InputError(f"rank {p}'s event counters must be a contiguous, 16-byte aligned int32 tensor of at "
                             f"least {n} entries, got {tuple(c.shape)} {c.dtype}")
    if peers is not None and not set(peers) <= set(range(len(counters))) - {rank}:
        raise InputError(f"the graph reads ranks {sorted(peers)}; counters were given for {len(counters)} ranks "
                         f"and this is rank {rank}")
    own = counters[rank]
    if own.device != torch.device(dev):
        raise InputError(f"rank {rank}'s counters are on {own.device}, the step on {dev}")
    off = [(c.data_ptr() - own.data_ptr()) // 4 for c in counters]
    return own[:n], torch.tensor(off, dtype=torch.int64, device=dev)


def push_counters(counters, rank: int, n_events: int, elem_size: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """The push all-reduce's counters (the streaming megakernel, constexpr PUSH; dist/tp_megakernel.py's pools):
    each rank's int32 array holds n + 1 sets of ``n_events`` counters, its own, then one receive set per sending
    rank p (set 1 + p), each array at the start of its rank's pool (model-dtype data of ``elem_size`` bytes
    follows at the same offsets on every rank). Returns (this rank's counters, all n + 1 sets: what a rewind
    zeroes; peer_off int64 [3 n]): [0:n] where a remote wait on rank p spins (this rank's receive set of p, as
    int32 elements from its counters), [n:2n] where this rank signals rank q (q's receive set of this rank),
    [2n:3n] the model-dtype elements from this rank's pool to rank q's (0 for itself: nothing pushed there).
    Raises InputError as ``peer_counters``."""
    n, ne = len(counters), max(n_events, 1)
    own, off = peer_counters(counters, rank, ne * (1 + n), dev)
    off = off.tolist()  # 16-byte aligned (peer_counters): whole elements of any dtype up to 16 bytes
    table = [ne * (1 + p) for p in range(n)] + [o + ne * (1 + rank) for o in off] + [4 * o // elem_size for o in off]
    return own, torch.tensor(table, dtype=torch.int64, device=dev)


@contextmanager
def jit_hooks_off():
    """Run the block with Triton's JIT hooks (``knobs.runtime.jit_cache_hook`` / ``jit_post_compile_hook``)
    unset, then put them back. Triton JSON-serialises every constexpr of a kernel before calling a hook, and the
    megakernel's ``RUN_TASK`` is a JITFunction, which json cannot encode: with a hook set (a profiler's, or the
    CLI's first compile watch, since rewritten without hooks) its launch raised ``TypeError: Object of type
    JITFunction is not JSON serializable`` (H200, session 6). So the hooks never see this kernel."""
    from triton import knobs

    rt = knobs.runtime
    saved = rt.jit_cache_hook, rt.jit_post_compile_hook
    rt.jit_cache_hook = rt.jit_post_compile_hook = None
    try:
        yield
    finally:
        rt.jit_cache_hook, rt.jit_post_compile_hook = saved


class PersistentRunner(StepRunner):
    """What both megakernels (Triton: ``MegakernelRunner``; Gluon streaming: ``exec.stream_runner``) share:
    the launch / CUDA-graph replay of one persistent kernel, monotonic counters, and the error word
    err int32 [5] = (code, task, a, b, c) that ``check()`` / ``poll()`` read (code 1: a dependency wait gave
    up: a = event, b = seen, c = expected; other codes: ``wait_errors``). The Triton megakernel at TP > 1 has
    err int32 [RSLOT + 6]: its remote slot err[RSLOT:] = (5, task, event, seen, expected, peer rank) is written
    by the first remote wait that gave up, whatever err[0] holds (a local failure never blocks it; err[0] = 6
    then only stops the local spins: ``mk_device.ERR_RSLOT``); ``check()`` reports the remote failure first and
    a local one as its consequence. ``self._after``: a callable run right after
    each launch, inside the CUDA graph when one is captured (the tensor-parallel runner's logits gather). Subclasses set ``self.err``,
    ``self._side``, ``self._err_host``, ``self.use_cuda_graph``, ``self.check_every``, ``self.wait_limit``
    (words) and implement ``launch()``, ``_write_addresses()``, ``task_graph`` and ``events``."""

    mode = "megakernel"
    wait_errors: dict = {}
    _after = None

    def _init_run_state(self, on_gpu: bool, use_cuda_graph: bool | None, check_every: int) -> None:
        dev = self.bound.device
        self.use_cuda_graph = cuda_graphs_enabled(use_cuda_graph) and on_gpu
        self._side = torch.cuda.Stream(dev) if on_gpu else None  # poll(): reads err beside the queued steps
        # the words check() / poll() read every time: the streaming kernel's per-task slots after them only on a failure
        self.err_head = getattr(self, "err_head", self.err.numel())
        self._err_host = torch.zeros(self.err_head, dtype=torch.int32, pin_memory=on_gpu)
        self._cuda_graph = None
        self.check_every, self._steps, self._failed = check_every, 0, None

    def _run(self, moved: bool) -> None:
        if self._failed:
            raise KernelTimeoutError(f"{self._failed}; this runner's counters are inconsistent after the timeout: "
                                     "build a new runner")
        if moved:
            self._write_addresses()  # the kernel reads addresses from its tables at run time: graphs stay valid
        if not self.use_cuda_graph:
            self._launch_and_after()
        else:
            if self._cuda_graph is None:
                self._launch_and_after()
                torch.cuda.synchronize()
                self.check()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    self._launch_and_after()
                self._cuda_graph = g
            self._cuda_graph.replay()
        self._steps += 1
        if self.check_every and self._steps % self.check_every == 0:
            self.check()
        if self._steps % self._rewind_steps() == 0:
            self.rewind()

    def _rewind_steps(self) -> int:
        """Steps between two rewinds: REWIND_EVERY, or fewer so that no target (an event's expected count x epoch,
        the done counter's n_workers x epoch) reaches 2^31 first. Computed once (the plan's events are fixed)."""
        if getattr(self, "_rewind_n", None) is None:
            big = max(max(self.events.expected, default=1), getattr(self, "n_workers", 1), 1)
            self._rewind_n = max(1, min(REWIND_EVERY, (2 ** 31 - 1) // big - 2))
        return self._rewind_n

    _rank_barrier = None  # TP: a callable every rank of the group joins (dist.tp_megakernel sets it)

    def rewind(self) -> None:
        """Event counters and the done counter to 0, the epoch to 1, between the last queued step and the next,
        in stream order (a CUDA graph reads them from memory at each replay, so it stays valid); ``_run`` calls it
        every ``_rewind_steps()`` steps so that no wait target (expected count x epoch, int32) wraps. Tensor parallel
        (``self.tp``): the peers read this rank's counters, so every rank first finishes its step and only then
        rewinds, and no rank starts the next step before all have (``_rank_barrier`` before and after; RuntimeError
        without one)."""
        tp = getattr(self, "tp", False)
        if tp and self._rank_barrier is None:
            raise RuntimeError("a tensor-parallel megakernel rank cannot rewind its event counters without a "
                               "barrier over the ranks (dist.tp_megakernel.TPMegakernelRunner sets one)")
        if tp:
            self._rank_barrier()
        self.ev_cnt.zero_()
        self.done.zero_()
        self.epoch.fill_(1)
        if tp:
            self._rank_barrier()

    def _launch_and_after(self) -> None:
        self.launch()
        if self._after is not None:
            self._after()

    def check(self) -> None:
        """Raise KernelTimeoutError if a bounded wait gave up (reads the error word from the device: a sync)."""
        self._raise_if(self.err[:self.err_head].tolist())

    def poll(self) -> None:
        """Raise KernelTimeoutError if a finished step's wait gave up: copies the error word on a side stream,
        so it waits for that copy only, not for the steps queued on the main stream."""
        if self._side is None:
            return self.check()
        with torch.cuda.stream(self._side):
            self._err_host.copy_(self.err[:self.err_head], non_blocking=True)
        self._side.synchronize()
        self._raise_if(self._err_host.tolist())

    def queues(self) -> list[list[int]] | None:
        """Each worker's tasks in the order it runs them (task ids of ``self.events``), or None where the runner
        does not know them; ``_wait_origin`` uses them. The streaming runner returns its plan's schedule."""
        return None

    def _held_up(self, gave_up: dict) -> set[int]:
        """The tasks a failed wait held up: every task that gave up, and each task after one in its worker's queue
        (a worker runs its queue in order: such a task started late, and its own wait may have stopped at the error
        word without a slot of its own, stream_base._spin)."""
        held = set(gave_up)
        for q in self.queues() or ():
            late = False
            for t in q:
                late = late or t in gave_up
                if late:
                    held.add(t)
        return held

    def _downstream(self, gave_up: dict) -> set[int]:
        """The events a task that gave up feeds, directly or through the tasks that wait on them: a failed wait on
        one of them is a consequence even when no producer of its event was held up (a task that gave up still runs
        and signals, so the tasks between it and the wait were released without a slot of their own: SmolLM2-135M's
        attention-only workers start waiting on attn_partial.3 at the kernel's start, as a forced attn_partial.2
        does). A wait that gave up on another event stopped on its own, whatever else its task waits on."""
        ev = self.events
        consumers = [[] for _ in range(ev.n_events)]  # event -> the tasks waiting on it
        for t, waits in enumerate(ev.waits):
            for e in waits:
                if 0 <= e < ev.n_events:
                    consumers[e].append(t)
        signals = {}  # task -> the events it produces
        for e, ps in enumerate(ev.producers):
            for p in ps:
                signals.setdefault(p, []).append(e)
        todo = [e for t in gave_up for e in signals.get(t, ())]
        seen, done = set(todo), set()
        while todo:
            for t in consumers[todo.pop()]:
                if t not in done:
                    done.add(t)
                    new = [e for e in signals.get(t, ()) if e not in seen]
                    seen.update(new)
                    todo += new
        return seen

    def _wait_origin(self, first: int, where, producers) -> str:
        """Where the step stopped when the first wait to give up (task ``first``) is not it: the streaming kernel's
        per-task slots (err[err_head:], stream_base.record_task) hold every local wait that gave up, and a wait is a
        consequence when a producer of its event was held up too (``_held_up``: it gave up, or it comes after a
        task that did in its worker's queue) or when its event depends, through the events, on a task that gave up
        (``_downstream``). Returns a sentence naming the first wait (lowest task id) none of
        whose event's producers was held up when it is another task than ``first``; else ""."""
        if self.err.numel() <= self.err_head:
            return ""
        tail = self.err[self.err_head:]
        slots = tail[:tail.numel() // 3 * 3].view(-1, 3).tolist()
        gave_up = {t: (e - 1, seen, want) for t, (e, seen, want) in enumerate(slots) if e > 0}
        held = self._held_up(gave_up)
        down = self._downstream(gave_up)
        roots = [t for t, (e, _, _) in gave_up.items()
                 if 0 <= e < self.events.n_events and not any(p in held for p in self.events.producers[e])
                 and e not in down]
        if not roots or first in roots:
            return ""
        t = roots[0]
        e, seen, want = gave_up[t]
        same = sum(1 for r in roots[1:] if gave_up[r][0] == e)  # the op's other tiles on the same event
        others = [r for r in roots if gave_up[r][0] != e]  # waits on other events that stopped on their own too
        also = f" (and {same} other task(s) on that event)" if same else ""
        if others:
            also += (f"; {len(others)} wait(s) on other events stopped on their own too (tasks "
                     f"{', '.join(str(r) for r in others[:3])}{'...' if len(others) > 3 else ''})")
        return (f"{where(t)} waited on event {e} (producers: {producers(e)}) and saw count {seen} < expected {want}, "
                f"and no producer of that event was held up by a failed wait: the step stopped there{also}; "
                f"{len(gave_up) - len(roots)} other wait(s) gave up as its consequences, the first of them: ")

    def _raise_if(self, err: list[int]) -> None:
        remote = err[RSLOT] == 5 if len(err) > RSLOT + 5 else False
        if not err[0] and not remote:
            return
        g = self.task_graph

        def where(t: int) -> str:
            if 0 <= t < len(g.tasks):
                task = g.tasks[t]
                op = g.ops[task.op]
                return f"task {t} ({op.name}, op kind {op.kind.name}, tile {task.tile})"
            return "a worker's ring"

        def producers(e: int) -> str:
            """'48 tasks of gate_up.1' (each op of the event's producers, in order, with its count)."""
            if not 0 <= e < self.events.n_events:  # a corrupt error word: say so, do not index with it
                return f"unknown event: the plan has {self.events.n_events}"
            counts = {}
            for p in self.events.producers[e]:
                name = g.ops[g.tasks[p].op].name
                counts[name] = counts.get(name, 0) + 1
            return ", ".join(f"{k} task{'s' if k > 1 else ''} of {name}" for name, k in counts.items())

        code, t, a, b, c = err[:5]
        local = ""
        if code == 1:
            local = (f"{where(t)} waited on event {a} (producers: {producers(a)}) and saw count {b} < expected {c} "
                     f"after {self.wait_limit}")
        if remote:  # the cause: reported first, the local wait that gave up (if any) as its consequence
            _, t, a, b, c, peer = err[RSLOT:RSLOT + 6]
            self._failed = (
                f"megakernel: {where(t)} waited on event {a} (producers: {producers(a)}) of peer rank {peer} and "
                f"saw count {b} < expected {c} after {self.wait_limit}; rank {peer} did not run that part of its step "
                f"(it failed, hung, was not launched, or ran another number of steps)")
            if local:
                self._failed += f". A local wait gave up too (a consequence of the remote one): {local}"
        elif code == 1:
            self._failed = (f"megakernel: {self._wait_origin(t, where, producers)}{local}; the schedule, the events "
                            f"or a producer is wrong (or workers were not co-resident)")
        else:
            what, *names = self.wait_errors.get(code, ("unknown failure", "a", "b", "c"))
            detail = " ".join(f"{n} {v}" for n, v in zip(names, (a, b, c)))
            self._failed = f"megakernel: {where(t)}: {what} failed ({detail}) after {self.wait_limit}"
        raise KernelTimeoutError(self._failed)
