"""The separate-kernel modes (graph, pdl) on the streaming megakernel's Gluon bodies (``backend="gluon"``): the
streaming plan cut at op boundaries into one kernel per op, each a persistent grid of one CTA per SM whose
loader warp streams that op's weight chunks through the same shared-memory ring, and whose consumer warps run
the op's tasks with the megakernel's task bodies, records, dependency waits and signals (issue 11 item 4).

- graph: the kernels one after another in a CUDA graph (each starts when the previous one ended: its waits on
  the event counters are already met).
- pdl: the same launches with programmatic dependent launch. Every kernel lets the next one launch as soon as
  all its CTAs run, so on each SM the next op's CTA takes the place of the previous op's as it exits and its
  loader streams weights at once, before any activation it needs exists; its tasks wait on the event counters
  exactly as in the megakernel (stream_device.stream_megakernel, "Segments").

``segment="layer"`` (a study knob between the two ends) cuts at layer boundaries instead: one kernel for the
embedding and layer 0, one per later layer, the LM head and argmax in the last. The kernels are the same three
(first, middle, last); only the ranges they are given differ.

The bits are the megakernel's: the same tasks in the same order per worker with the same bodies and constants
(the shared memory budget and the ring can differ per kernel, which never changes a value).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from onekernel.errors import InputError
from onekernel.exec import stream_device as sd
from onekernel.exec.stream_base import K_GATEUP
from onekernel.exec.stream_plan import StreamPlan
from onekernel.exec.stream_runner import StreamMegakernelRunner


def task_chunks(plan: StreamPlan) -> dict[int, int]:
    """Weight chunks each GEMV task streams (stream_pack.pack_weights: units x chunk groups per unit x k-chunks)."""
    out = {}
    for oi in plan.group_rows:
        op = plan.graph.ops[oi]
        gpu = 2 if plan.kinds[oi] == K_GATEUP.value else 1
        for t in op.task_ids:
            out[t] = plan.units[t][1] * gpu * op.params["NKB"]
    return out


def check_segment(per) -> None:
    """Raises InputError unless ``per`` is "op" or "layer"."""
    if per not in ("op", "layer"):
        raise InputError(f"segment must be 'op' or 'layer' (where the separate-kernel modes on the Gluon bodies cut "
                         f"the step into kernels), got {per!r}")


def op_groups(plan: StreamPlan, per: str = "op") -> list[int]:
    """The kernel (segment) index of each op of the plan's graph, in op order: per="op" one kernel per op;
    per="layer" one per decoder layer (op names "<kind>.<layer>"), the embedding joining layer 0 and the LM head
    and argmax the last layer. Raises InputError for another ``per``."""
    check_segment(per)
    ops = plan.graph.ops
    if per == "op":
        return list(range(len(ops)))
    groups = []
    for op in ops:  # ops without a layer (embedding, LM head, argmax) join their neighbour's kernel
        tail = op.name.rsplit(".", 1)[-1]
        groups.append(int(tail) if "." in op.name and tail.isdigit() else groups[-1] if groups else None)
    first = next((g for g in groups if g is not None), 0)
    return [first if g is None else g for g in groups]


def segments(plan: StreamPlan, per: str = "op") -> list[tuple[int, list[int], list[int], list[int], list[int]]]:
    """The plan cut into kernels (op_groups: one per op, or per layer), in op order: (first op index, qbeg, qend,
    cbeg, cend), each a list over the workers: worker w runs the queue positions [qbeg[w], qend[w]) (indices into
    the flattened queues, as the megakernel's qoff) and streams the chunks [cbeg[w], cend[w]) of the packed stream
    (as chunk_off). A kernel with no task on a worker gives it an empty range. Raises ValueError when a worker's
    queue does not hold each op's tasks contiguously in op order (every plan make_plan builds does)."""
    g = plan.graph
    chunks = task_chunks(plan)
    n_ops = len(g.ops)
    qb = [[0] * len(plan.schedule.queues) for _ in range(n_ops)]
    qe, cb, ce = ([row[:] for row in qb] for _ in range(3))
    pos = chunk = 0
    for w, q in enumerate(plan.schedule.queues):
        ops = [g.tasks[t].op for t in q]
        if any(b < a for a, b in zip(ops, ops[1:])):
            raise ValueError(f"worker {w}'s queue is not in op order: the plan cannot be cut into one kernel per op")
        i = 0
        for o in range(n_ops):
            qb[o][w], cb[o][w] = pos + i, chunk
            while i < len(q) and ops[i] == o:
                chunk += chunks.get(q[i], 0)
                i += 1
            qe[o][w], ce[o][w] = pos + i, chunk
        pos += len(q)
    groups = op_groups(plan, per)
    out = []
    for o in range(n_ops):  # consecutive ops of one group: the first one's starts, the last one's ends
        if out and groups[o] == groups[o - 1]:
            out[-1] = (out[-1][0], out[-1][1], qe[o], out[-1][3], ce[o])
        else:
            out.append((o, qb[o], qe[o], cb[o], ce[o]))
    return out


class StreamSegmentRunner(StreamMegakernelRunner):
    """Mode "graph" or "pdl" (``pdl``) with ``backend="gluon"``: the streaming megakernel's plan, weight stream and
    bodies, launched as one kernel per op, or per layer (``segment="layer"``; module doc). Options as
    StreamMegakernelRunner's, but not tensor parallel (InputError). Three kernels are compiled: a step's first,
    middle and last (constexprs FIRST, LAST; PDL), each fitted to shared memory on its own."""

    def __init__(self, step, *, pdl: bool = False, segment: str = "op", **options):
        self.pdl = bool(pdl)
        self.segment = segment
        check_segment(segment)
        if options.get("counters") is not None or options.get("rank", 0):
            raise InputError("the separate-kernel modes on the Gluon bodies do not run tensor parallel; use the "
                             "default backend")
        super().__init__(step, **options)

    def _compile(self, props) -> None:
        segs = segments(self.plan, self.segment)
        dev = self.qoff.device
        self.segs = [tuple(torch.tensor(v, dtype=torch.int32, device=dev) for v in s[1:]) for s in segs]
        self.kernels, self.seg_consts = {}, {}

        def fit(role):  # launch_pdl: a compile option in Triton 3.6
            c = dict(self.consts, FIRST=role == "first", LAST=role == "last", PDL=self.pdl)
            with torch.cuda.device(dev):  # a new thread's current device is 0: Triton compiles and loads for it
                return role, self._fit(props, c, self._seg_args(0), launch_pdl=self.pdl)

        # the three compiles at once: most of a cold compile is ptxas, a process of its own (Llama-3.2-1B batch 16 on
        # a CPU core: 14 s against 27 s one after another)
        with ThreadPoolExecutor(3) as ex:
            for role, (k, c) in ex.map(fit, ("first", "mid", "last")):
                self.kernels[role], self.seg_consts[role] = k, c
        # a per-layer kernel's tasks wait on each other, so its CTAs must all be resident, as the megakernel's
        self._check_residency(self.kernels["mid"], props)

    def _seg_args(self, k: int):
        return self._args()[:-4] + self.segs[k]

    def launch(self) -> None:
        n = len(self.segs)
        for k in range(n):
            role = "first" if k == 0 else "last" if k == n - 1 else "mid"
            sd.stream_megakernel[(self.n_workers,)](*self._seg_args(k), num_warps=4, launch_pdl=self.pdl,
                                                    **self.seg_consts[role])
