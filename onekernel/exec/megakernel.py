"""The megakernel executor: one persistent Triton kernel runs the whole decode step.

Built from the same graph and tile functions as the separate-kernel modes:

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
from onekernel.exec.megakernel_src import megakernel_source
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
                 schedule=None, fuse_merge: bool | None = None):
        super().__init__(model, cache, batch, profile=profile, n_sm=n_sm, fuse_merge=fuse_merge)
        dev = cache.k.device
        self.interpret = interpret
        if interpret:
            n_workers, prefetch, profile = 1, False, False
        elif n_workers is None:
            n_workers = torch.cuda.get_device_properties(dev).multi_processor_count
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
        ev = self.events.arrays(dev)
        sc = self.schedule.arrays(dev)
        ttab = [[op_var[t.op], t.tile, t.op, self.events.signal[t.id]] for t in g.tasks]
        self.ttab = torch.tensor(ttab, **i32)
        self.queue, self.qoff = sc["queue_ids"], sc["queue_ptr"]
        self.wptr, self.wids, self.ev_exp = ev["wait_ptr"], ev["wait_ids"], ev["expected"]
        if self.wids.numel() == 0:
            self.wids = torch.zeros(1, **i32)
        self.ev_cnt = torch.zeros(max(self.events.n_events, 1), **i32)
        self.epoch = torch.ones(1, **i32)
        self.done = torch.zeros(1, **i32)
        self.err = torch.zeros(5, **i32)
        self.argtab = torch.zeros(len(g.ops), self.maxa, dtype=torch.int64, device=dev)
        self.bases = {dt: torch.zeros(8, dtype=dt, device=dev) for dt in
                      (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64)}
        self.pf_tab = torch.zeros(len(g.tasks), 2, dtype=torch.int64, device=dev)
        self._write_addresses()
        self.kernel = load_source(megakernel_source(variants, self.maxa), "megakernel").megakernel
        self.num_warps = max(OP_KINDS[v.kind].num_warps for v in variants)
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
        """Fill the pointer table (element offsets from the per-dtype base pointer; every address must be
        16-byte aligned) and the next-task prefetch table from the bound tensors (host -> device)."""
        g = self.graph
        tab = torch.zeros(len(g.ops), self.maxa, dtype=torch.int64)
        for op in g.ops:
            for j, a in enumerate(OP_KINDS[op.kind].args):
                t = self.tensors[op.args[a]]
                base = self.bases[t.dtype]
                delta = t.data_ptr() - base.data_ptr()
                if t.data_ptr() % 16 or delta % 16:
                    raise ValueError(f"buffer {op.args[a]!r} of op {op.name!r} is not 16-byte aligned")
                tab[op.index, j] = delta // t.element_size()
        self.argtab.copy_(tab)
        pf = torch.zeros(len(g.tasks), 2, dtype=torch.int64)
        pos = 0
        for q in self.schedule.queues:
            for k, t in enumerate(q):
                if k + 1 < len(q):
                    pf[pos] = torch.tensor(_weight_span(g, g.tasks[q[k + 1]], self.tensors))
                pos += 1
        self.pf_tab.copy_(pf)

    def _args(self):
        return (self.queue, self.qoff, self.ttab, self.argtab, self.wptr, self.wids, self.ev_cnt, self.ev_exp,
                self.epoch, self.done, self.err, self.prof_buf, self.pf_tab, *self.bases.values(), self.n_workers,
                self.spin_limit)

    def _kw(self):
        return dict(PROFILE=self.profile, PREFETCH=self.prefetch, num_warps=self.num_warps)

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
