"""The megakernel executor: one persistent Triton kernel runs the whole decode step.

Built from the same bound step and tile functions as the separate-kernel modes (its graph is normally tiled
with ``Tiling(policy="fit")``: at most one tile per worker per op, see ops/tiling.py):

1. dependencies from overlapping regions (``graph.deps``), then events: tile-level (producers grouped by the
   consumers they feed) or, with ``events="op"``, one event per op (to measure dependency granularity);
2. a static schedule (``critical_path`` list scheduling or ``round_robin``), checked before launch: no task
   waits on a later task of its own queue, the wait-for graph is acyclic (``schedule.validate``);
3. the queue records (``exec.queue``) and the kernel: the worker loop of ``exec.mk_device`` with the generated
   dispatch ``run_task`` (``exec.megakernel_src``), compiled once; a residency check refuses more workers
   than can be co-resident for the compiled kernel's registers and shared memory (a persistent grid that
   doesn't fit in one wave deadlocks);
4. per step: one launch (optionally inside a CUDA graph). Counters are monotonic, never reset.

Tensor parallel (a graph that reads *peer* buffers: another rank's copy of one of its buffers, ``graph.meta
["peers"]``; built by ``models.decode_graph(tp=...)``, run by ``dist.tp_megakernel``): every rank runs the same
graph (same shapes, built deterministically), so the same task and event ids. A task reading a peer buffer gets
*remote* dependencies (``graph.deps.derive_remote_dependencies``: the producers of those rows, on that rank),
which become remote waits on that rank's event counters (``counters``: every rank's counter array as mapped in
this process, in rank order; ``rank``: this one). The schedule is built and validated on the local and remote
dependencies merged (``merged_dependencies``), and is the same on every rank; then no cross-rank wait can
deadlock: every wait-for edge, remote ones included, projects onto an edge of one rank's wait-for graph (a
dependency, or "queued right after"), which ``validate`` proves acyclic, so a cycle across ranks would project
onto a cycle there. ``check_cross_step`` proves that no rank overwrites a buffer that a peer still reads from the
previous step. ``fingerprint()`` lets the ranks compare their schedules and events before the first launch.

A bounded spin that gave up leaves (task, event, seen, expected[, peer rank]) in the error word; ``check()`` reads
it (a device sync) and raises ``KernelTimeoutError`` naming the task, its op and tile (and the peer rank); ``poll()`` reads it
through a side stream, without waiting for the steps still queued (for a caller that synchronised on the
step it wants checked). By default ``step`` reads it never (the caller calls ``check()`` or ``poll()``, as
every runner offers them); ``check_every=N`` makes ``step`` call ``check()`` every N-th step.
"""
from __future__ import annotations

import logging

import torch

from onekernel.errors import InputError
from onekernel.exec import host_cache, mk_device
from onekernel.exec.codegen import load_source, variant_of
from onekernel.exec.megakernel_src import run_task_source
from onekernel.exec.persistent import RSLOT, PersistentRunner, jit_hooks_off, peer_counters
from onekernel.exec.queue import build_queue
from onekernel.graph.deps import (derive_dependencies, derive_remote_dependencies, events_and_order,
                                  transitive_reduction)
from onekernel.graph.ir import gc_paused
from onekernel.graph.schedule import (critical_path_list, reserved_critical_path, residency_check, round_robin,
                                     validate)

log = logging.getLogger("onekernel")
POLICIES = {"critical_path": critical_path_list, "round_robin": round_robin}
PREFETCH_CAP = 1 << 20  # bytes of next-task weights prefetched into L2 at most


def weight_span(graph, tensors, task) -> tuple[int, int]:
    """(address, bytes) of the first weight region a task reads, as one contiguous span (row-major)."""
    for r in task.reads:
        if graph.buffers[r.buffer].kind != "weight":
            continue
        t = tensors[r.buffer]
        if not t.is_contiguous():
            continue
        lo = hi = 0
        for d, (a, b) in enumerate(r.box):
            lo += a * t.stride(d)
            hi += (b - 1) * t.stride(d)
        return t.data_ptr() + lo * t.element_size(), min((hi - lo + 1) * t.element_size(), PREFETCH_CAP)
    return 0, 0


@gc_paused()
def host_products(g, *, n_workers: int, policy: str = "critical_path", events: str = "tile", comm_workers: int = 0,
                  schedule=None, check_options=lambda tp: None):
    """((reduced deps, remote deps, events, validated schedule), cache hit) of graph ``g`` for the Triton
    megakernel (module doc, steps 1-2): from ``exec.host_cache`` when an earlier process stored them for the same
    graph, options and code, else computed (and stored). ``check_options(tp)`` raises for options a
    tensor-parallel (or not) graph does not take; it runs before the events are derived, and after a hit. A
    caller's ``schedule`` is validated every time and nothing is cached."""

    def compute():
        deps = transitive_reduction(derive_dependencies(g))
        remote = derive_remote_dependencies(g)
        tp = any(remote)
        check_options(tp)
        ev, order = events_and_order(g, deps, remote, events)
        if comm_workers:  # the communication tasks: those waiting on other ranks (the all-reduce tiles)
            sched = reserved_critical_path(g, order, n_workers, [bool(r) for r in remote], comm_workers)
        else:
            sched = schedule if schedule is not None else POLICIES[policy](g, order, n_workers)
        validate(sched, g, order)
        return deps, remote, ev, sched

    if schedule is not None:
        return compute(), False
    products, hit = host_cache.cached("triton", g, compute, _encode_products,
                                      lambda a: _decode_products(a, len(g.tasks)), n_workers=n_workers,
                                      policy=policy, events=events, comm_workers=comm_workers)
    if hit:
        check_options(any(products[1]))
    return products, hit


def _encode_products(p) -> dict:
    deps, remote, ev, sched = p
    out = {**host_cache.encode_events(ev), **host_cache.encode_schedule(sched)}
    out["deps.ptr"], out["deps.v"] = host_cache.pack_lists(deps)
    out["remote.ptr"], out["remote.v"] = host_cache.pack_lists(remote, 2)
    return out


def _decode_products(a: dict, n: int):
    deps = host_cache.unpack_lists(a["deps.ptr"], a["deps.v"], n)
    remote = host_cache.unpack_lists(a["remote.ptr"], a["remote.v"].reshape(-1, 2), n, tuples=True)
    return deps, remote, host_cache.decode_events(a, n), host_cache.decode_schedule(a, n)


class MegakernelRunner(PersistentRunner):
    """Options: ``n_workers`` (default: one per SM), ``policy`` ("critical_path" | "round_robin"), ``events``
    ("tile" | "op"), ``prefetch`` (next task's weights into L2), ``profile``, ``spin_limit`` (polls before a
    wait gives up), ``use_cuda_graph``, ``schedule`` (a ready-made Schedule), ``num_warps``, ``check_every``
    (module doc). ``interpret``: one worker, no inline asm, no prefetch or profile.

    Tensor parallel (module doc; needed when the graph reads peer buffers): ``rank`` (this rank) and ``counters``
    (every rank's event-counter array as mapped in this process, int32, zeroed, at least one entry per task,
    rank order; in symmetric memory on GPUs); ``after`` (a callable run after every launch, captured with it);
    ``comm_workers`` (k > 0: the tasks with remote waits, the all-reduce tiles, run only on the last k workers and
    every other task on the others: ``schedule.reserved_critical_path``; 0, the default: one mixed schedule).
    Raises InputError without them (or with events="op"), ScheduleError when the cross-step check fails."""

    mode = "megakernel"

    def __init__(self, step, *, n_workers: int | None = None, policy: str = "critical_path", events: str = "tile",
                 prefetch: bool = True, profile: bool = False, interpret: bool = False,
                 spin_limit: int | None = None, use_cuda_graph: bool | None = None, schedule=None,
                 num_warps: int | None = None, check_every: int = 0, rank: int = 0, counters=None, after=None,
                 comm_workers: int = 0):
        dev = step.device
        self.interpret = interpret
        if profile and (interpret or dev.type != "cuda"):
            raise InputError("profile=True reads the GPU's timers (globaltimer, SM id); it needs a CUDA device, "
                             "not the Triton interpreter")
        if interpret:
            n_workers, prefetch = 1, False
        elif n_workers is None:
            n_workers = torch.cuda.get_device_properties(dev).multi_processor_count
        if policy not in POLICIES:
            raise InputError(f"unknown schedule policy {policy!r}; choose from {sorted(POLICIES)}")
        if events not in ("tile", "op"):
            raise InputError(f"unknown events {events!r}; choose 'tile' (per group of producer tiles) or 'op'")
        if not isinstance(check_every, int) or isinstance(check_every, bool) or check_every < 0:
            raise InputError(f"check_every must be an int >= 0 (steps between error-word reads), got {check_every!r}")
        if spin_limit is not None and (not isinstance(spin_limit, int) or isinstance(spin_limit, bool)
                                       or spin_limit < 1):
            raise InputError(f"spin_limit must be an int >= 1 (polls before a wait gives up), got {spin_limit!r}")
        if num_warps not in (None, 4, 8, 16):
            raise InputError(f"num_warps must be 4, 8 or 16 (warps per worker), got {num_warps!r}")
        super().__init__(step, profile=profile)
        g = self.graph
        if not isinstance(comm_workers, int) or isinstance(comm_workers, bool) or comm_workers < 0:
            raise InputError(f"comm_workers must be an int >= 0 (workers reserved for the all-reduce), got "
                             f"{comm_workers!r}")
        self.comm_workers = comm_workers

        def check_options(tp: bool) -> None:  # the option checks that depend on the graph being tensor parallel
            if tp:
                if counters is None:
                    raise InputError("this step reads other ranks' buffers (a tensor-parallel graph): the megakernel "
                                     "needs every rank's event counters (counters=, rank=; onekernel.dist.tp_megakernel)")
                if events != "tile":
                    raise InputError("events='op' is not built for tensor-parallel graphs; use events='tile'")
            if comm_workers:
                if not tp:
                    raise InputError("comm_workers reserves workers for a tensor-parallel graph's all-reduce tasks; "
                                     "this graph has none")
                if policy != "critical_path" or schedule is not None:
                    raise InputError("comm_workers builds its own critical-path schedule (policy='critical_path', no "
                                     "schedule=)")
                if comm_workers >= n_workers:
                    raise InputError(f"comm_workers={comm_workers} leaves none of the {n_workers} workers for the "
                                     f"other tasks")

        products, self.host_cache_hit = host_products(g, n_workers=n_workers, policy=policy, events=events,
                                                      comm_workers=comm_workers, schedule=schedule,
                                                      check_options=check_options)
        self.deps, self.remote, self.events, self.schedule = products
        self.tp = any(self.remote)
        self._after = after
        self.n_workers, self.prefetch, self.policy, self.event_mode = self.schedule.n_workers, prefetch, policy, events
        self.spin_limit = spin_limit or (1 << 16 if interpret else 1 << 26)

        # Variants (compiled tile-function branches) and the device tables.
        self.variants, vid, self.op_var = [], {}, []
        for op in g.ops:
            v = variant_of(g, op)
            if v not in vid:
                vid[v] = len(self.variants)
                self.variants.append(v)
            self.op_var.append(vid[v])
        self.maxa = max(len(op.kind.args) for op in g.ops)
        i32 = dict(dtype=torch.int32, device=dev)
        self.qoff = self.schedule.arrays(dev)["queue_ptr"]
        self.qrec = self.wl = self.rwl = None
        if self.tp:
            self.ev_cnt, self.peer_off = peer_counters(counters, rank, self.events.n_events, dev,
                                                       {p for rs in self.remote for p, _ in rs})
            self._counters = list(counters)  # the kernel addresses the peers' counters by offset: keep them alive
        else:
            self.ev_cnt = torch.zeros(max(self.events.n_events, 1), **i32)
            self.peer_off = torch.zeros(1, dtype=torch.int64, device=dev)
        self.rank = rank
        self.epoch = torch.ones(1, **i32)
        self.done = torch.zeros(1, **i32)
        self.err = torch.zeros(RSLOT + 6 if self.tp else 5, **i32)
        self.argtab = torch.zeros(len(g.ops), self.maxa, dtype=torch.int64, device=dev)
        self.bases = {dt: torch.zeros(8, dtype=dt, device=dev) for dt in
                      (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64)}
        self._write_addresses()
        self.run_task = load_source(run_task_source(self.variants), "megakernel").run_task
        # num_warps: the tile functions' default (4), or more: with 8 warps and >= 128 registers per thread
        # only one worker fits per SM, so the hardware cannot put two workers on one SM and none on another.
        self.num_warps = num_warps or max(v.kind.num_warps for v in self.variants)
        if self.tp and self.prof is not None:  # TP: column 4 = local waits done, before the remote ones
            self.prof = torch.zeros(len(g.tasks), int(mk_device.PROF_W_TP), dtype=torch.int64, device=dev)
        self.prof_buf = self.prof if self.prof is not None else torch.zeros(1, 4, dtype=torch.int64, device=dev)
        self._init_run_state(dev.type == "cuda" and not interpret, use_cuda_graph, check_every)
        self.compiled = None
        if dev.type == "cuda" and not interpret:
            self._check_residency()

    def fingerprint(self) -> int:
        """A 63-bit hash of what every rank must share to wait on each other's counters: the variants, the
        queues, the events (signals, waits, expected counts) and the events of the remote waits (without the peer
        ranks, which differ by rank). The tensor-parallel runner compares it across ranks before a launch."""
        import hashlib

        ev = self.events
        parts = (tuple(v.name for v in self.variants), tuple(map(tuple, self.schedule.queues)), tuple(ev.signal),
                 tuple(map(tuple, ev.waits)), tuple(ev.expected),
                 tuple(tuple(sorted({e for _, e in rw})) for rw in ev.remote_waits))
        return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1

    # -- tables ----------------------------------------------------------------------------------------
    def _write_addresses(self) -> None:
        """Fill the pointer table (offsets from the per-dtype base pointer in 16-byte units; every address must
        be 16-byte aligned), then the queue records, which hold the next-task prefetch spans (host -> device)."""
        g = self.graph
        tab = torch.zeros(len(g.ops), self.maxa, dtype=torch.int64)
        for op in g.ops:
            for j, a in enumerate(op.kind.args):
                t = self.tensors[op.args[a]]
                delta = t.data_ptr() - self.bases[t.dtype].data_ptr()
                if t.data_ptr() % 16 or delta % 16:
                    raise ValueError(f"buffer {op.args[a]!r} of op {op.name!r} is not 16-byte aligned")
                tab[op.index, j] = delta // 16  # in 16-byte units (megakernel_src)
        self.argtab.copy_(tab)
        self.write_tables()

    def write_tables(self) -> None:
        """Write the queue records and the wait list from the schedule, the events (``self.events.expected``
        is read here: tests raise a count to provoke a timeout) and the next-task prefetch spans."""
        qrec, wl, *rwl = build_queue(self.graph, self.schedule, self.events, self.op_var,
                                     lambda task: weight_span(self.graph, self.tensors, task), remote=self.tp)
        rwl = rwl[0] if rwl else torch.zeros(1, 3, dtype=torch.int32)
        if self.qrec is None:
            dev = self.argtab.device
            self.qrec, self.wl, self.rwl = qrec.to(dev), wl.to(dev), rwl.to(dev)
        else:  # in place: a captured CUDA graph keeps reading the same tables
            self.qrec.copy_(qrec)
            self.wl.copy_(wl)
            self.rwl.copy_(rwl)

    def _args(self):
        return (self.qrec, self.qoff, self.wl, self.argtab, self.ev_cnt, self.epoch, self.done, self.err,
                self.prof_buf, *self.bases.values(), self.n_workers, self.spin_limit, self.rwl, self.peer_off)

    def _kw(self):
        return dict(RUN_TASK=self.run_task, MAXA=self.maxa, PROFILE=self.profile, PREFETCH=self.prefetch,
                    ACQ_LOAD=not self.interpret, TP=self.tp, num_warps=self.num_warps)

    def _check_residency(self) -> None:
        dev = self.bound.device
        with jit_hooks_off():
            self.compiled = mk_device.megakernel.warmup(*self._args(), grid=(self.n_workers,), **self._kw())
        self.compiled._init_handles()  # loads the binary: fills n_regs / n_spills
        p = torch.cuda.get_device_properties(dev)
        meta = {"n_regs": self.compiled.n_regs, "num_warps": self.num_warps,
                "shared": self.compiled.metadata.shared}
        props = {"sm_count": p.multi_processor_count, "smem_per_sm": p.shared_memory_per_multiprocessor,
                 "regs_per_sm": p.regs_per_multiprocessor, "max_threads_per_sm": p.max_threads_per_multi_processor}
        self.max_workers = residency_check(self.n_workers, meta, props)
        if self.compiled.n_spills:  # a performance note, never on stdout (it would corrupt --json output)
            log.info("megakernel register spills: n_spills=%d at %d registers per thread", self.compiled.n_spills,
                     self.compiled.n_regs)

    # -- running ---------------------------------------------------------------------------------------
    def launch(self) -> None:
        with jit_hooks_off():
            mk_device.megakernel[(self.n_workers,)](*self._args(), **self._kw())

    @property
    def task_graph(self):
        return self.graph

    @property
    def wait_limit(self) -> str:
        return f"{self.spin_limit} spins"
