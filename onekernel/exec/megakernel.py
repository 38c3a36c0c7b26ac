"""The megakernel executor: one persistent Triton kernel runs the whole decode step.

Built from the same graph and tile functions as the separate-kernel modes (with ``tiles="fit"``, the default,
the graph's GEMV tiles are sized for at most one tile per worker per op; ``"cover"`` keeps the separate
kernels' 1-2 tiles per SM):

1. dependencies from overlapping regions (``graph.deps``), then events: tile-level (producers grouped by the
   consumers they feed) or, with ``events="op"``, one event per op (to measure dependency granularity);
2. a static schedule (``critical_path`` list scheduling or ``round_robin``), checked before launch: no task
   waits on a later task of its own queue, the wait-for graph is acyclic (``schedule.validate``);
3. the kernel source (``megakernel_src``), compiled once; a residency check refuses more workers than can be
   co-resident for the compiled kernel's registers and shared memory (a persistent grid that doesn't fit
   in one wave deadlocks);
4. per step: one launch (optionally inside a CUDA graph). Counters are monotonic, never reset.

After a step, :meth:`check` reads the error word: a bounded spin that gave up raises
``KernelTimeoutError`` naming the task, its op and tile, the event and the counts.
"""
from __future__ import annotations

import logging
import os

import torch

from onekernel.errors import DeviceError, KernelTimeoutError
from onekernel.exec.base import GraphRunnerBase
from onekernel.exec.codegen import load_source, variant_of
from onekernel.exec.megakernel_src import REC, REC_FIELDS, megakernel_source
from onekernel.graph.deps import derive_dependencies, derive_events, derive_op_events, transitive_reduction
from onekernel.graph.schedule import critical_path_list, residency_check, round_robin, validate
from onekernel.ops.base import OP_KINDS

log = logging.getLogger("onekernel")
POLICIES = {"critical_path": critical_path_list, "round_robin": round_robin}
PREFETCH_CAP = 1 << 20  # bytes of next-task weights prefetched into L2 at most


def _weight_span(graph, task, tensors) -> tuple[int, int]:
    """(address, bytes) of the first weight region a task reads, as one contiguous span (row-major)."""
    for r in task.reads:
        buf = graph.buffers[r.buffer]
        if buf.kind != "weight":
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


class MegakernelRunner(GraphRunnerBase):
    mode = "megakernel"

    def __init__(self, model, cache, batch, *, n_workers: int | None = None, policy: str = "critical_path",
                 events: str = "tile", prefetch: bool = True, profile: bool = False, interpret: bool = False,
                 spin_limit: int | None = None, use_cuda_graph: bool | None = None, n_sm: int | None = None,
                 schedule=None, tiles: str = "fit", num_warps: int | None = None, fuse_merge: bool = False):
        dev = cache.k.device
        self.interpret = interpret
        if interpret:
            n_workers, prefetch, profile = 1, False, False
        elif n_workers is None:
            n_workers = torch.cuda.get_device_properties(dev).multi_processor_count
        if tiles not in ("fit", "cover"):
            raise ValueError(f"unknown tiling {tiles!r}; choose 'fit' (at most one tile per worker per op where "
                             "the tile size limits allow) or 'cover' (the separate-kernel modes' tiles)")
        if tiles == "fit" and not interpret and n_sm is None:
            # The graph sizes an op's tiles so that it has >= n_sm of them (largest power-of-two BLOCK_N);
            # n_workers // 2 + 1 gives a count in (W/2, W]: every worker runs at most one tile of an op, where
            # the separate kernels' 1-2 tiles per SM would make some workers run two in a row.
            n_sm = n_workers // 2 + 1
        super().__init__(model, cache, batch, profile=profile, n_sm=n_sm, fuse_merge=fuse_merge)
        if policy not in POLICIES:
            raise ValueError(f"unknown schedule policy {policy!r}; choose from {sorted(POLICIES)}")
        g = self.graph
        self.deps = transitive_reduction(derive_dependencies(g))
        self.events = (derive_events if events == "tile" else derive_op_events)(g, self.deps)
        self.schedule = schedule if schedule is not None else POLICIES[policy](g, self.deps, n_workers)
        n_workers = self.schedule.n_workers
        validate(self.schedule, g, self.deps)
        self.n_workers, self.prefetch, self.policy, self.event_mode = n_workers, prefetch, policy, events
        self.spin_limit = spin_limit or (1 << 16 if interpret else 1 << 26)

        # Variants (compiled tile-function branches) and the per-task table.
        variants, vid = [], {}
        op_var = []
        for op in g.ops:
            v = variant_of(g, op)
            if v not in vid:
                vid[v] = len(variants)
                variants.append(v)
            op_var.append(vid[v])
        self.variants = variants
        self.maxa = max(len(OP_KINDS[op.kind].args) for op in g.ops)
        i32 = dict(dtype=torch.int32, device=dev)
        self.op_var = op_var
        self.qoff = self.schedule.arrays(dev)["queue_ptr"]
        n_pos = len(g.tasks)
        self.qrec = torch.zeros(n_pos + 1, REC, dtype=torch.int64, device=dev)  # + a pad row (pipelined load)
        self.wl = torch.zeros(max(self.events.n_waits, 1), 2, **i32)
        self.ev_cnt = torch.zeros(max(self.events.n_events, 1), **i32)
        self.epoch = torch.ones(1, **i32)
        self.done = torch.zeros(1, **i32)
        self.err = torch.zeros(5, **i32)
        self.argtab = torch.zeros(len(g.ops), self.maxa, dtype=torch.int64, device=dev)
        self.bases = {dt: torch.zeros(8, dtype=dt, device=dev) for dt in
                      (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64)}
        self._write_addresses()
        self.kernel = load_source(megakernel_source(variants, self.maxa), "megakernel").megakernel
        # num_warps: the tile functions' default (4), or more: with 8 warps and >= 128 registers per thread
        # only one worker fits per SM, so the hardware cannot put two workers on one SM and none on another.
        self.num_warps = num_warps or max(OP_KINDS[v.kind].num_warps for v in variants)
        self.prof_buf = self.prof if self.prof is not None else torch.zeros(1, 4, dtype=torch.int64, device=dev)
        self.profile = profile
        if use_cuda_graph is None:
            use_cuda_graph = os.environ.get("ONEKERNEL_NO_CUDA_GRAPH", "0") in ("", "0")
        self.use_cuda_graph = use_cuda_graph and cache.k.is_cuda and not interpret
        self._cuda_graph = None
        self.compiled = None
        if cache.k.is_cuda and not interpret:
            self._check_residency()

    # -- tables ----------------------------------------------------------------------------------------
    def _write_addresses(self) -> None:
        """Fill the pointer table (offsets from the per-dtype base pointer in 16-byte units; every address must be
        16-byte aligned), then the queue records (they hold the next-task prefetch spans) (host -> device)."""
        g = self.graph
        tab = torch.zeros(len(g.ops), self.maxa, dtype=torch.int64)
        for op in g.ops:
            for j, a in enumerate(OP_KINDS[op.kind].args):
                t = self.tensors[op.args[a]]
                base = self.bases[t.dtype]
                delta = t.data_ptr() - base.data_ptr()
                if t.data_ptr() % 16 or delta % 16:
                    raise ValueError(f"buffer {op.args[a]!r} of op {op.name!r} is not 16-byte aligned")
                tab[op.index, j] = delta // 16  # in 16-byte units (megakernel_src.BASE)
        self.argtab.copy_(tab)
        self.write_tables()

    def write_tables(self) -> None:
        """Fill the queue-position records and the wait list (``REC_FIELDS``) from the schedule, the events
        (``self.events.expected`` is read here: tests raise a count to provoke a timeout) and the bound
        tensors' addresses (the next-task L2 prefetch span)."""
        g, ev = self.graph, self.events
        pad = [0] * (REC - len(REC_FIELDS))
        rows, wl = [], []
        for q in self.schedule.queues:
            for k, t in enumerate(q):
                task = g.tasks[t]
                pf = _weight_span(g, g.tasks[q[k + 1]], self.tensors) if k + 1 < len(q) else (0, 0)
                waits = ev.waits[t]
                first = (waits[0], ev.expected[waits[0]]) if waits else (0, 0)
                rows.append([t, self.op_var[task.op], task.tile, task.op, ev.signal[t], *pf, len(wl),
                             len(wl) + len(waits), *first, *pad])
                wl += [(e, ev.expected[e]) for e in waits]
        rows.append([0] * REC)
        self.qrec.copy_(torch.tensor(rows, dtype=torch.int64))
        if wl:
            self.wl.copy_(torch.tensor(wl, dtype=torch.int32))

    def _args(self):
        return (self.qrec, self.qoff, self.wl, self.argtab, self.ev_cnt, self.epoch, self.done, self.err,
                self.prof_buf, *self.bases.values(), self.n_workers, self.spin_limit)

    def _kw(self):
        return dict(PROFILE=self.profile, PREFETCH=self.prefetch, ACQ_LOAD=not self.interpret,
                    num_warps=self.num_warps)

    def _check_residency(self) -> None:
        dev = self.cache.k.device
        self.compiled = self.kernel.warmup(*self._args(), grid=(self.n_workers,), **self._kw())
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
        self.kernel[(self.n_workers,)](*self._args(), **self._kw())

    def _run(self, moved: bool) -> None:
        if moved:
            self._write_addresses()  # the kernel reads addresses from argtab at run time: graphs stay valid
        if not self.use_cuda_graph:
            self.launch()
            return
        if self._cuda_graph is None:
            self.launch()
            torch.cuda.synchronize()
            self.check()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.launch()
            self._cuda_graph = g
        self._cuda_graph.replay()

    def step(self, tokens, check: bool = True):
        out = super().step(tokens)
        if check:
            self.check()
        return out

    def check(self) -> None:
        """Raise KernelTimeoutError if a bounded spin gave up (reads 5 ints from the device: a sync)."""
        err = self.err.tolist()
        if err[0]:
            t, e, seen, want = err[1:]
            task = self.graph.tasks[t]
            op = self.graph.ops[task.op]
            raise KernelTimeoutError(
                f"megakernel: task {t} ({op.name}, op kind {op.kind}, tile {task.tile}) waited on event {e} "
                f"(producers: {[self.graph.ops[self.graph.tasks[p].op].name for p in self.events.producers[e][:3]]}"
                f"...) and saw count {seen} < expected {want} after {self.spin_limit} spins; the schedule, the "
                f"events or a producer is wrong (or workers were not co-resident)")


def make_megakernel(model, cache, batch, **kw) -> MegakernelRunner:
    if not cache.k.is_cuda and not kw.get("interpret"):
        raise DeviceError("the megakernel needs a CUDA GPU; pass interpret=True (--interpret) to run it under "
                          "the Triton interpreter on the CPU")
    return MegakernelRunner(model, cache, batch, **kw)
