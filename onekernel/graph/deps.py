"""Dependencies and events of a decode-step task graph (its costs, topological order and critical path:
``graph.paths``).

``deps[c]`` lists earlier tasks (program order = task id order) task ``c`` must wait for: RAW (c reads a region
overlapping one an earlier task writes), WAR (c writes over an earlier read), WAW (c writes over an earlier write).
Overlap is :meth:`onekernel.graph.ir.Region.overlaps` (boxes intersect along every dimension), found per buffer
(read-only buffers such as weights cost nothing). A decode-like graph of 19k tasks takes ~0.2 s (default) or
~1.5 s (``full=True``, 3.2M edges) on one CPU core.

Events are monotonic counters (DESIGN.md): producers add 1 after their stores; a consumer waits for
``count >= expected * step``. :func:`derive_events` gives producers with the same consumer set one shared event;
:func:`derive_op_events` is the coarse one-event-per-op variant, to measure what fine dependencies buy.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate, product

import numpy as np
import torch

from .ir import Graph

_BLOCK_ELEMS = 1 << 22  # query x key pairs per vectorised overlap block (~4M bools of temporary memory)


def _check_deps(n: int, deps: list[list[int]]) -> None:
    if len(deps) != n:
        raise ValueError(f"deps has {len(deps)} entries but the graph has {n} tasks")
    bad = next(((c, p) for c, ds in enumerate(deps) for p in ds if not 0 <= p < n or p == c), None)
    if bad:
        raise ValueError(f"task {bad[0]} depends on invalid task {bad[1]} (must be another id in [0, {n}))")


def _accesses(graph: Graph) -> dict[str, list[tuple[int, bool, tuple]]]:
    """Buffer name -> (task id, is_write, box) in program order; buffers nobody writes are left out."""
    acc: dict[str, list[tuple[int, bool, tuple]]] = {}
    for t in graph.tasks:
        for r in t.reads:
            acc.setdefault(r.buffer, []).append((t.id, False, r.box))
        for r in t.writes:
            acc.setdefault(r.buffer, []).append((t.id, True, r.box))
    for name, items in list(acc.items()):
        if not any(it[1] for it in items):
            del acc[name]  # read only (weights, inputs): no dependencies
        elif len({len(it[2]) for it in items}) != 1:
            raise ValueError(f"buffer {name!r}: regions with different numbers of dimensions")
    return acc


def _full_dependencies(graph: Graph) -> list[list[int]]:
    """Every overlapping conflict, as codes ``c * n + p`` (p < c) from blocked numpy box comparisons."""
    n, codes = len(graph.tasks), []
    for items in _accesses(graph).values():
        w = np.array([it[1] for it in items], dtype=bool)
        tid = np.array([it[0] for it in items], dtype=np.int64)
        box = np.array([it[2] for it in items], dtype=np.int64).reshape(len(items), len(items[0][2]), 2)
        lo, hi = box[..., 0], box[..., 1]
        # RAW + WAW: every access (q) against earlier writes (k). WAR: every write against earlier reads.
        for q, k in ((slice(None), w), (w, ~w)):
            qt, ql, qh, kt, kl, kh = tid[q], lo[q], hi[q], tid[k], lo[k], hi[k]
            step = max(1, _BLOCK_ELEMS // max(len(kt), 1))
            for b in (slice(s, s + step) for s in range(0, len(qt), step)):
                m = kt[None] < qt[b, None]
                for d in range(lo.shape[1]):
                    m &= (kl[None, :, d] < qh[b, None, d]) & (ql[b, None, d] < kh[None, :, d])
                qi, ki = np.nonzero(m)
                codes.append(qt[b][qi] * n + kt[ki])
    deps: list[list[int]] = [[] for _ in range(n)]
    if codes and sum(map(len, codes)):
        u = np.sort(np.concatenate(codes))
        u = u[np.concatenate(([True], u[1:] != u[:-1]))]
        for c, p in zip((u // n).tolist(), (u % n).tolist()):
            deps[c].append(p)
    return deps


def derive_dependencies(graph: Graph, full: bool = False) -> list[list[int]]:
    """For each task id, the sorted ids of earlier tasks it depends on (RAW, WAR and WAW; see module doc).

    ``full=True``: every conflicting earlier task (all overlapping pairs, O(accesses x writes) box comparisons per
    buffer; millions of edges when a buffer is reused by every layer). ``full=False`` (default): a subset with the
    same transitive closure, by last-writer / readers-since-last-write tracking (as task runtimes such as StarPU
    do) on *cells*, the grid of elementary intervals between all region bounds of a buffer: per cell a read
    depends on the last writer, a write on the readers since it (if none, on the last writer). Cost ~ cells
    touched. Empty boxes touch nothing. ValueError if one buffer's regions differ in number of dimensions.
    """
    if full:
        return _full_dependencies(graph)
    deps: list[set[int]] = [set() for _ in graph.tasks]
    for items in _accesses(graph).values():
        ndim = len(items[0][2])
        cuts = [sorted({b[d][k] for _, _, b in items for k in (0, 1)}) for d in range(ndim)]
        writer: dict[tuple, int] = {}
        readers: dict[tuple, list[int]] = {}
        for t, is_w, box in items:  # per task, reads come before writes
            ranges = [range(bisect_left(cuts[d], lo), bisect_left(cuts[d], hi)) for d, (lo, hi) in enumerate(box)]
            for cell in product(*ranges):
                last, rs = writer.get(cell, -1), readers.setdefault(cell, [])
                if not is_w:
                    if last >= 0 and last != t:
                        deps[t].add(last)
                    if not rs or rs[-1] != t:
                        rs.append(t)
                    continue
                others = [r for r in rs if r != t]
                deps[t].update(others)
                if not others and last >= 0 and last != t:
                    deps[t].add(last)
                writer[cell], readers[cell] = t, []
    return [sorted(d) for d in deps]


def transitive_reduction(deps: list[list[int]]) -> list[list[int]]:
    """Drop every edge ``p -> c`` implied by a longer path (exact, reachability as Python-int bitsets; same closure,
    fewer waits). Needs deps pointing to earlier ids. Memory ~ n^2/16 bytes (25 MB for 20k tasks), ~0.2 s."""
    reach: list[int] = []  # reach[t]: bitset of all tasks t transitively depends on
    out: list[list[int]] = []
    for c, ds in enumerate(deps):
        covered, keep = 0, []
        for p in sorted(set(ds), reverse=True):
            if p >= c:
                raise ValueError(f"task {c} depends on later task {p}; transitive_reduction needs program order")
            if not (covered >> p) & 1:
                keep.append(p)
                covered |= reach[p] | (1 << p)
        reach.append(covered)
        out.append(sorted(keep))
    return out


@dataclass
class EventTable:
    """Monotonic-counter events of one step.

    signal[t]: event task t increments after its stores (-1: nobody waits on t); waits[t]: sorted event ids t
    spins on before its body; expected[e]: arrivals per step (= len(producers[e])); producers[e]: task ids.
    Tensor parallel (``derive_events(..., remote=...)``): remote_waits[t]: sorted (peer rank, event id) pairs t
    spins on in *that rank's* counters (the ranks' graphs are identical, so are their event ids); sys_signal[e]:
    whether event e is read by another rank (its producers then signal with a system-scope release). Both empty
    when the graph reads no peer buffer.
    """

    signal: list[int]
    waits: list[list[int]]
    expected: list[int]
    producers: list[list[int]]
    remote_waits: list[list[tuple[int, int]]] = field(default_factory=list)
    sys_signal: list[bool] = field(default_factory=list)

    n_events = property(lambda self: len(self.expected))
    n_waits = property(lambda self: sum(len(w) for w in self.waits))

    def arrays(self, device="cpu") -> dict[str, torch.Tensor]:
        """Flat int32 tensors for a kernel: ``signal [T]``, ``wait_ptr [T+1]`` and ``wait_ids [n_waits]`` (CSR:
        task t waits on ``wait_ids[wait_ptr[t]:wait_ptr[t+1]]``), ``expected [E]``."""
        ptr = [0] + list(accumulate(len(w) for w in self.waits))
        ids = [e for w in self.waits for e in w]
        return {k: torch.tensor(v, dtype=torch.int32, device=device) for k, v in
                (("signal", self.signal), ("wait_ptr", ptr), ("wait_ids", ids), ("expected", self.expected))}


def _consumers(n: int, deps: list[list[int]]) -> list[list[int]]:
    cons: list[list[int]] = [[] for _ in range(n)]
    for c, ds in enumerate(deps):
        for p in set(ds):
            cons[p].append(c)
    return cons


def derive_events(graph: Graph, deps: list[list[int]],
                  remote: list[list[tuple[int, int]]] | None = None) -> EventTable:
    """Exact events: producers with an identical consumer set share one event (``expected`` = their number), so
    for every consumer c the producers of ``waits[c]`` are exactly ``set(deps[c])``. Works for any DAG.

    ``remote`` (``derive_remote_dependencies``): c's dependencies on tasks of other ranks, (peer, task id). A
    remote consumer counts as a consumer when producers are grouped, so the producers of c's remote wait on
    (peer, e) are tasks c depends on (locally or remotely), all earlier than c in program order; e is then a
    ``sys_signal`` event."""
    n = len(graph.tasks)
    _check_deps(n, deps)
    cons = _consumers(n, deps)
    for c, rs in enumerate(remote or []):
        for _, d in rs:
            if not 0 <= d < c:
                raise ValueError(f"task {c} has a remote dependency on task {d}: it must be an earlier task id")
            cons[d].append(c)
    by_sig: dict[tuple[int, ...], int] = {}
    signal, producers = [-1] * n, []
    for p in (p for p in range(n) if cons[p]):
        signal[p] = e = by_sig.setdefault(tuple(sorted(set(cons[p]))), len(producers))
        if e == len(producers):
            producers.append([])
        producers[e].append(p)
    waits = [sorted({signal[p] for p in ds}) for ds in deps]
    if not remote or not any(remote):
        return EventTable(signal, waits, [len(ps) for ps in producers], producers)
    rwaits = [sorted({(peer, signal[d]) for peer, d in rs}) for rs in remote]
    sys_signal = [False] * len(producers)
    for rs in rwaits:
        for _, e in rs:
            sys_signal[e] = True
    return EventTable(signal, waits, [len(ps) for ps in producers], producers, rwaits, sys_signal)


def derive_remote_dependencies(graph: Graph) -> list[list[tuple[int, int]]]:
    """For each task id, the sorted (peer rank, task id) pairs it depends on in *another rank's* graph: a task
    reading a region of a peer buffer (``graph.meta["peers"][name] = (peer, source buffer)``) depends on the
    earlier tasks that write an overlapping region of ``source`` (on that rank: every rank's graph is the same,
    so the ids are the same). Empty lists when the graph reads no peer buffer. Raises ValueError for a peer
    buffer whose source is not a buffer of the graph, or whose shape differs from it, and for a peer read or a
    write of a source whose box has not one (lo, hi) pair per dimension of the buffer."""
    peers = graph.meta.get("peers") or {}
    out: list[list[tuple[int, int]]] = [[] for _ in graph.tasks]
    if not peers:
        return out
    for name, (_, src) in peers.items():
        if src not in graph.buffers or graph.buffers[src].shape != graph.buffers[name].shape:
            raise ValueError(f"peer buffer {name!r} mirrors {src!r}, which is not a buffer of its shape in the graph")
    sources = {src for _, src in peers.values()}
    writers: dict[str, tuple[list, list]] = {s: ([], []) for s in sources}  # source -> (task ids, boxes) so far
    arrays: dict[str, tuple] = {}  # source -> (writers counted, ids [n], lo [n, d], hi [n, d]) for the overlap test
    found: dict[tuple, tuple[int, list[int]]] = {}  # (source, box) -> (writers counted, the overlapping writers)

    def overlapping(src: str, box: tuple) -> list[int]:
        """The writers so far of ``src`` whose box intersects ``box`` along every dimension (Region.overlaps). The
        peers of one source read the same box (an all-reduce tile reads its rows on every peer): one test each."""
        ids, boxes = writers[src]
        hit = found.get((src, box))
        if hit is not None and hit[0] == len(ids):
            return hit[1]
        arr = arrays.get(src)
        if arr is None or arr[0] != len(ids):
            b = np.asarray(boxes, dtype=np.int64).reshape(len(ids), len(box), 2)
            arr = arrays[src] = (len(ids), np.asarray(ids, dtype=np.int64), b[:, :, 0], b[:, :, 1])
        q = np.asarray(box, dtype=np.int64).reshape(len(box), 2)
        hits = arr[1][((arr[2] < q[:, 1]) & (q[:, 0] < arr[3])).all(axis=1)].tolist()
        found[(src, box)] = (len(ids), hits)
        return hits

    def checked(r) -> tuple:  # the box as a hashable tuple of (lo, hi), one pair per dimension of the buffer
        box = tuple((int(lo), int(hi)) for lo, hi in r.box)
        if len(box) != len(graph.buffers[r.buffer].shape):
            raise ValueError(f"region {r.buffer}{list(r.box)} has {len(box)} (lo, hi) pairs for a buffer of "
                             f"{len(graph.buffers[r.buffer].shape)} dimensions")
        return box

    for t in graph.tasks:
        deps = set()
        for r in t.reads:
            if r.buffer in peers:
                peer, src = peers[r.buffer]
                deps.update((peer, w) for w in overlapping(src, checked(r)))
        out[t.id] = sorted(deps)
        for r in t.writes:
            if r.buffer in writers:
                writers[r.buffer][0].append(t.id)
                writers[r.buffer][1].append(checked(r))
    return out


def merged_dependencies(deps: list[list[int]], remote: list[list[tuple[int, int]]]) -> list[list[int]]:
    """Local and remote dependencies as one list of task ids per task: the order a schedule must respect when
    every rank runs the same schedule (a remote edge (peer, d) -> c projects onto d -> c; see
    ``exec.megakernel``: with identical graphs and schedules a cross-rank wait cycle would project onto a cycle
    of this graph's wait-for graph, which ``schedule.validate`` rules out)."""
    if not remote:
        return deps
    return [sorted(set(ds) | {d for _, d in rs}) for ds, rs in zip(deps, remote)]


def check_cross_step(graph: Graph, deps: list[list[int]], remote: list[list[tuple[int, int]]]) -> None:
    """Raise ValueError unless no rank can overwrite, in step t+1, a buffer that a peer still reads in step t.

    A rank's buffer S is read by its peers' tasks R (the tasks reading their peer copy of S: by symmetry the same
    ids as this graph's readers of ``peer{p}.S``). This rank's writers W of S run in step t+1 only after its
    step t ended (one kernel after the other on its stream). For each peer p one of these must hold:
    (a) every w in W depends (locally, transitively, or is itself) on a task with a remote wait on p: that wait
        is on p's step t+1, which starts after p's whole step t; or
    (b) some task of the graph has a remote dependency (p, d) with every task of R among d's ancestors: this
        rank's step t then cannot end before p's readers of S in step t are done.
    Assumes the ranks that read this rank's buffers are the ranks it reads from (an all-reduce). ``deps``: local
    dependencies (any transitive reduction); ``remote``: ``derive_remote_dependencies``."""
    peers = graph.meta.get("peers") or {}
    if not peers:
        return
    n = len(graph.tasks)
    reach: list[int] = []  # ancestors (bitset) of each task, the task itself included
    for c in range(n):
        r = 1 << c
        for p in deps[c]:
            r |= reach[p]
        reach.append(r)
    waits_on: dict[int, int] = {}  # peer -> bitset of the tasks with a remote wait on it
    remote_deps: dict[int, set[int]] = {}  # peer -> the task ids some task depends on remotely on that peer
    for c, rs in enumerate(remote):
        for p, d in rs:
            waits_on[p] = waits_on.get(p, 0) | (1 << c)
            remote_deps.setdefault(p, set()).add(d)
    # one pass over the tasks (not one per buffer and peer: Llama-3.1-70B at TP=8 has 58,012 tasks x 161 x 7)
    sources = {s for _, s in peers.values()}
    writers_of: dict[str, list[int]] = {s: [] for s in sources}
    readers_of: dict[str, int] = {nm: 0 for nm in peers}  # peer buffer -> bitset of the tasks reading it
    for t in graph.tasks:
        for b in {r.buffer for r in t.writes} & sources:
            writers_of[b].append(t.id)
        for b in {r.buffer for r in t.reads if r.buffer in readers_of}:
            readers_of[b] |= 1 << t.id
    for src in sorted(sources):
        writers = writers_of[src]
        for peer in sorted({p for p, s in peers.values() if s == src}):
            name = next(nm for nm, (p, s) in peers.items() if (p, s) == (peer, src))
            readers = readers_of[name]
            if all(reach[w] & waits_on.get(peer, 0) for w in writers):
                continue  # (a)
            if any(readers & ~reach[d] == 0 for d in sorted(remote_deps.get(peer, ()))):
                continue  # (b)
            raise ValueError(f"buffer {src!r}: rank {peer} may still read it in step t when this rank overwrites it "
                             f"in step t+1 (no remote wait orders its writers after rank {peer}'s readers); add a "
                             f"dependency of its writers on a task that waits on rank {peer}")


def events_and_order(graph: Graph, deps: list[list[int]], remote: list[list[tuple[int, int]]],
                     events: str = "tile") -> tuple[EventTable, list[list[int]]]:
    """(events, the dependencies a schedule must respect) of a graph whose reduced dependencies are ``deps`` and
    remote ones ``remote`` (``derive_remote_dependencies``): what both megakernels build their queues from.
    Tensor parallel (any remote dependency): tile events with the remote waits, the order ``merged_dependencies``,
    and ``check_cross_step`` (ScheduleError when a buffer a peer reads could be overwritten first); else tile
    events (``events="tile"``) or one per op (``"op"``) over ``deps``."""
    from onekernel.errors import ScheduleError

    if any(remote):
        try:
            check_cross_step(graph, deps, remote)
        except ValueError as e:
            raise ScheduleError(str(e)) from None
        return derive_events(graph, deps, remote), merged_dependencies(deps, remote)
    return (derive_events if events == "tile" else derive_op_events)(graph, deps), deps


def derive_op_events(graph: Graph, deps: list[list[int]]) -> EventTable:
    """Coarse events: all tiles of a producer op signal one event; a consumer waits on every op it depends on.

    When tiles of one op depend on earlier tiles of the same op, the op is cut into consecutive segments with
    no dependency inside a segment, each its own event (otherwise a tile would wait on itself). Requires deps
    pointing to earlier ids; every waited producer then precedes its consumer, so no wait can deadlock.
    """
    n = len(graph.tasks)
    _check_deps(n, deps)
    seg_of, segs, op_segs = [-1] * n, [], []
    for op in graph.ops:
        first, cur = len(segs), []
        for t in op.task_ids:
            if any(d > t for d in deps[t]):
                raise ValueError(f"task {t} depends on a later task; op events need program-order deps")
            if cur and any(seg_of[d] == len(segs) for d in deps[t]):
                segs.append(cur)
                cur = []
            seg_of[t] = len(segs)
            cur.append(t)
        if cur:
            segs.append(cur)
        op_segs.append(range(first, len(segs)))
    op_of = [t.op for t in graph.tasks]
    seg_waits = [{s for op in {op_of[d] for d in ds if op_of[d] != op_of[c]} for s in op_segs[op]}
                 | {seg_of[d] for d in ds if op_of[d] == op_of[c]} for c, ds in enumerate(deps)]
    used = sorted(set().union(*seg_waits))
    ev = {s: e for e, s in enumerate(used)}
    signal = [-1] * n
    for s, e in ev.items():
        for t in segs[s]:
            signal[t] = e
    producers = [segs[s] for s in used]
    return EventTable(signal, [sorted(ev[s] for s in w) for w in seg_waits], [len(p) for p in producers], producers)
