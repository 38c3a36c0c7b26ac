"""The streaming megakernel runner: the Gluon kernel of ``exec.stream_device`` over the plan of
``exec.stream_plan`` (byte-balanced GEMV tasks, a per-worker weight stream walked by a loader warp's bulk copies).

``make_runner("megakernel", step, backend=...)`` picks it: ``backend="auto"`` (the default) takes it on a
Hopper GPU for a bf16/fp16 Llama-family step, with CUDA-core or tensor-core GEMV bodies as the step's ``gemv``
says (``stream_support.unsupported`` says why not otherwise, and the
Triton megakernel runs instead), ``"gluon"`` insists (InputError with the reason), ``"triton"`` never.
The weights are re-packed once, at construction, into one stream (a second copy of every GEMV weight).
"""
from __future__ import annotations

import logging
import re
import weakref
from dataclasses import dataclass

import torch

from onekernel.errors import InputError
from onekernel.exec import stream_device as sd
from onekernel.exec.stream_base import ERR_TASKS, ERRORS
from onekernel.exec.persistent import PersistentRunner, peer_counters, push_counters
from onekernel.exec.stream_pack import arg_table, pack_weights, scratch_tensors
from onekernel.exec.stream_plan import CHUNK_ELEMS, bars_guess, make_plan
from onekernel.exec.stream_records import fingerprint
from onekernel.exec.stream_support import unsupported
from onekernel.graph.schedule import residency_check

log = logging.getLogger("onekernel")
# Weight streams shared by the runners of one model (the server's batch buckets): the stream depends on the
# weights, the worker count and the chunk shape, never on the batch (tests/test_stream_pack.py checks it).
# An entry lives as long as a runner holds its stream.
_STREAMS: "weakref.WeakValueDictionary[tuple, WeightStream]" = weakref.WeakValueDictionary()


@dataclass
class WeightStream:
    """A packed weight stream bf16/fp16 [chunks, RG, CK] and chunk_off int32 [W + 1] (stream_pack.pack_weights)."""
    packed: torch.Tensor
    chunk_off: torch.Tensor


def bar_offset(llir: str) -> int | None:
    """Byte offset of the first mbarrier the kernel initialises (Triton allocates them after the buffers)."""
    offs = [int(o or 0) for o in re.findall(r"mbarrier\.init[^\n]*@global_smem(?:, i32 (\d+))?\)", llir)]
    return min(offs) if offs else None


def after_ring_offset(llir: str) -> int | None:
    """Byte offset of the first shared buffer after byte 0: SLOTS x 16 KB when the ring is at 0, where the loader's
    bulk copies and the tensor-core attention (stream_attn_tc: the ring's bytes) address it."""
    offs = sorted({int(o) for o in re.findall(r"@global_smem, i32 (\d+)", llir)} - {0})
    return offs[0] if offs else None


def shared_stream(plan, tensors: dict) -> WeightStream:
    """``stream_pack.pack_weights`` once per (weights, workers, chunk shape, GEMV path): runners of other batch sizes over
    the same weights reuse the packed stream (a copy of every GEMV weight: 15 GB for Llama-3.1-8B) instead of
    packing their own. Weights are never written after loading, so a stream is never stale."""
    c = plan.consts
    key = (len(plan.schedule.queues), c["RG"], c["CK"], bool(c.get("MMA")),  # the MMA path packs another order
           tuple(tensors[w].data_ptr() for w in plan.weight_of.values()))
    stream = _STREAMS.get(key)
    if stream is None:
        stream = WeightStream(*pack_weights(plan, tensors))
        _STREAMS[key] = stream
    return stream


def fit_kernel(compile_fn, consts: dict, smem_limit: int):
    """(compiled kernel, constants) from ``compile_fn(consts)``: recompiled with the mbarriers' real byte offset
    when the guess in consts["BARS"] was wrong (the bounded waits address them by offset), and with one ring
    slot fewer while the kernel's shared memory (ring + activations + the compiler's scratch) exceeds
    ``smem_limit`` bytes. Each compile of a cold cache costs seconds to a minute, so the first guess
    (``stream_plan.bars_guess``) is where the allocator put the barriers in the cases measured; an excess of shared
    memory drops as many slots as it takes at once. Raises RuntimeError if no offset is found or fewer than 2 slots would fit."""
    consts = dict(consts)
    while True:
        k = compile_fn(consts)
        off = bar_offset(k.asm["llir"])
        if off is None:
            raise RuntimeError("streaming megakernel: no mbarrier.init found in the compiled kernel")
        if off != consts["BARS"]:
            consts["BARS"] = off
            continue
        after = after_ring_offset(k.asm["llir"])
        if after != consts["SLOTS"] * CHUNK_ELEMS * 2:  # the ring is not at shared byte 0 (stream_device._loader)
            raise RuntimeError(f"streaming megakernel: the first buffer after the ring is at shared byte {after}, not "
                               f"after the {consts['SLOTS']}-slot ring at 0 (another buffer is larger than the ring)")
        if k.metadata.shared <= smem_limit:
            return k, consts
        if consts["SLOTS"] <= 2:
            raise RuntimeError(f"streaming megakernel: {k.metadata.shared} bytes of shared memory with 2 ring slots "
                               f"exceed the GPU's {smem_limit}")
        drop = min(consts["SLOTS"] - 2, -(-(k.metadata.shared - smem_limit) // (CHUNK_ELEMS * 2)))
        consts["SLOTS"] -= drop  # the slots the excess takes, at once (each recompile costs seconds to a minute)
        consts["BARS"] -= drop * CHUNK_ELEMS * 2  # the ring comes first: the barriers move down with it


class StreamMegakernelRunner(PersistentRunner):
    """Options: ``n_workers`` (default: one per SM; all must be co-resident), ``use_cuda_graph``,
    ``check_every`` (steps between error-word reads; 0: only ``check()`` / ``poll()``), ``wait_ms`` (a
    dependency or ring wait gives up after this long, and records where it stopped), ``profile`` (stamp
    every task of ``task_graph`` into ``prof`` int64 [tasks, 4]: start, dependencies satisfied, end (ns),
    worker + (ns of the task's last CTA barrier) << 16 + (ns of its publish: that barrier and the release add)
    << 40; and each tensor-core GEMV task's time inside into ``prof_sub`` int64 [tasks, 4]: ns staging
    activation tiles, ns waiting on ring slots, ns in epilogues + ns before the first block << 32, tiles staged:
    ``exec.stream_mma.gemv_mma``; each
    attention task's: ns to its block loop, ns in the blocks, ns in the warp merges, ns arriving and merging +
    blocks << 32: ``exec.stream_attn.attn_task``; at TP each all-reduce task's local waits done (ns, before its
    remote waits; its prof row's column 1 is all waits done) in column 0: ``profile.tp_trace.stream_rows``).

    Tensor parallel (a graph with all-reduce ops reading peer buffers; dist/tp_megakernel.py): ``rank`` and
    ``counters`` (every rank's event-counter array as mapped in this process, int32, zeroed, rank order, at least
    ``plan.events.n_events`` entries; symmetric memory on GPUs), as ``exec.megakernel.MegakernelRunner``;
    ``after`` (a callable run after every launch, captured with it). A remote wait that gives up is reported
    before any local one (its own error slot: stream_base). ``push``: the push all-reduce (constexpr PUSH;
    ``counters`` then hold n + 1 sets each: ``exec.persistent.push_counters``; part of ``fingerprint``)."""

    wait_errors = {k: v for k, v in ERRORS.items() if k != 1}

    def __init__(self, step, *, n_workers: int | None = None, use_cuda_graph: bool | None = None,
                 check_every: int = 0, wait_ms: int = 2000, profile: bool = False, rank: int = 0, counters=None,
                 after=None, push: bool = False):
        reason = unsupported(step)
        if reason:
            raise InputError(f"the streaming (Gluon) megakernel cannot run this step: {reason}; use "
                             f"backend='triton'")
        if not isinstance(check_every, int) or isinstance(check_every, bool) or check_every < 0:
            raise InputError(f"check_every must be an int >= 0 (steps between error-word reads), got {check_every!r}")
        if not isinstance(wait_ms, int) or isinstance(wait_ms, bool) or wait_ms < 1:
            raise InputError(f"wait_ms must be an int >= 1 (milliseconds before a wait gives up), got {wait_ms!r}")
        super().__init__(step)
        dev = step.device
        self.profile = profile
        props = torch.cuda.get_device_properties(dev)
        self.n_workers = n_workers or props.multi_processor_count
        self.plan = make_plan(step, self.n_workers)
        self.events = self.plan.events
        g = self.plan.graph
        self.scratch = scratch_tensors(self.plan, dev)
        tab = self.plan.tables  # records(plan), remote_wait_list(plan): computed or from exec.host_cache
        self.qrec, self.wl = tab["qrec"].to(dev), tab["wl"].to(dev)
        self.qoff = self.plan.schedule.arrays(dev)["queue_ptr"]
        self.stream = shared_stream(self.plan, self.tensors)  # held: it lives as long as a runner uses it
        self.packed, self.chunk_off = self.stream.packed, self.stream.chunk_off
        if self.packed.data_ptr() % 16:  # the loader's cp.async.bulk copies need 16-byte aligned sources
            raise RuntimeError("streaming megakernel: the packed weight stream is not 16-byte aligned")
        self.bases = {dt: torch.zeros(8, dtype=dt, device=dev) for dt in
                      (step.graph.meta["dtype"], torch.float32, torch.int32)}
        self.argtab = torch.zeros(len(g.ops), self.plan.consts["MAXA"], dtype=torch.int64, device=dev)
        self._write_addresses()
        i32 = dict(dtype=torch.int32, device=dev)
        self.tp = bool(self.plan.consts["TP"])
        self.rank, self._after = rank, after
        self.rwl = tab["rwl"].to(dev)
        if self.tp:
            if counters is None:
                raise InputError("this step has all-reduce tasks reading other ranks' buffers (a tensor-parallel graph): "
                                 "the streaming megakernel needs every rank's event counters (counters=, rank=; "
                                 "onekernel.dist.tp_megakernel)")
            if push and self.plan.consts.get("NSS"):  # the RMSNorm-partials epilogue does not push (stream_mma)
                raise InputError("push=True with RMSNorm partials (stream_plan.SS_PARTIALS) is not supported: a "
                                 "tensor-parallel step's residual GEMVs have none; set STREAM_SS_PARTIALS=0")
            if push:
                self.ev_cnt, self.peer_off = push_counters(counters, rank, self.events.n_events,
                                                           step.graph.meta["dtype"].itemsize, dev)
            else:
                self.ev_cnt, self.peer_off = peer_counters(counters, rank, self.events.n_events, dev)
            self._counters = list(counters)  # the kernel addresses the peers' counters by offset: keep them alive
        elif push:
            raise InputError("push=True applies to a tensor-parallel step (all-reduce tasks), not this one")
        else:
            self.ev_cnt = torch.zeros(max(self.events.n_events, 1), **i32)
            self.peer_off = torch.zeros(1, dtype=torch.int64, device=dev)
        self.epoch, self.done = torch.ones(1, **i32), torch.zeros(1, **i32)
        # err[0:5] the first failure; TP: err[ERR_RSLOT:ERR_RSLOT + 6] the remote one (PersistentRunner reports it
        # first); err[ERR_TASKS:] a slot per task of the re-tiled graph (stream_base.record_task)
        self.err_head = int(ERR_TASKS)
        self.err = torch.zeros(int(ERR_TASKS) + 3 * max(len(g.tasks), 1), **i32)
        # prof: per task of the re-tiled graph (self.task_graph), not of the step's graph; the kernel writes its rows,
        # then (tensor-core GEMV tasks) as many sub-timing rows: prof_sub (stream_mma.gemv_mma)
        n = max(len(g.tasks), 1) if profile else 1
        self._prof_all = torch.zeros(2 * n, 4, dtype=torch.int64, device=dev)
        self.prof, self.prof_sub = self._prof_all[:n], self._prof_all[n:]
        self.wait_limit = f"{wait_ms} ms"
        self.push = push
        self.consts = dict(self.plan.consts, WAIT_NS=wait_ms * 1_000_000, BARS=0, PROFILE=profile)
        if push:  # the kernel's constexpr (absent otherwise: the pull and TP=1 kernels keep their cache keys)
            self.consts["PUSH"] = True
        self.consts["BARS"] = bars_guess(self.consts)
        self._init_run_state(True, use_cuda_graph, check_every)
        self._compile(props)

    @property
    def task_graph(self):
        return self.plan.graph

    def _write_addresses(self) -> None:
        tensors = dict(self.tensors, **self.scratch)
        self.argtab.copy_(arg_table(self.plan, tensors, self.bases))

    def _args(self):
        b = list(self.bases.values())
        return (self.packed, self.qrec, self.qoff, self.wl, self.argtab, self.chunk_off, self.ev_cnt, self.epoch,
                self.done, self.err, self._prof_all, b[0], b[1], b[2], self.rwl, self.peer_off, self.qoff, self.qoff[1:],
                self.chunk_off, self.chunk_off[1:])

    def fingerprint(self) -> int:
        """``stream_records.fingerprint`` of this runner's plan (the tensor-parallel runner compares it across ranks)."""
        return fingerprint(self.plan, (("PUSH", self.push),))



    def _compile(self, props) -> None:
        """Compile (``fit_kernel``), then refuse more workers than fit on the GPU at once."""
        k, self.consts = self._fit(props, self.consts, self._args())
        self._check_residency(k, props)

    def queues(self) -> list[list[int]]:
        """Each worker's queue of the plan's tasks (the record order the kernel walks)."""
        return self.plan.schedule.queues

    def _fit(self, props, consts: dict, args, **launch):
        """(the kernel compiled for ``args`` and ``consts`` fitted to shared memory (``fit_kernel``), its consts);
        launch: the launch's compile options (``launch_pdl``)."""
        k, c = fit_kernel(lambda cc: sd.stream_megakernel.warmup(*args, grid=(self.n_workers,), num_warps=4, **launch,
                                                                 **cc), consts, props.shared_memory_per_block_optin)
        k._init_handles()
        return k, c

    def _check_residency(self, k, props) -> None:
        """Keep ``k`` as the compiled kernel; ResidencyError when n_workers CTAs of it cannot be resident at once."""
        self.compiled = k
        meta = {"n_regs": k.n_regs, "num_warps": 5, "shared": k.metadata.shared}
        self.max_workers = residency_check(self.n_workers, meta, {
            "sm_count": props.multi_processor_count, "smem_per_sm": props.shared_memory_per_multiprocessor,
            "regs_per_sm": props.regs_per_multiprocessor, "max_threads_per_sm": props.max_threads_per_multi_processor})
        if k.n_spills:
            log.info("streaming megakernel register spills: n_spills=%d at %d registers", k.n_spills, k.n_regs)

    def launch(self) -> None:
        sd.stream_megakernel[(self.n_workers,)](*self._args(), num_warps=4, **self.consts)
