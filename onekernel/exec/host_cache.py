"""On-disk cache of the megakernels' host-side products (issue 12: a warm start in seconds).

Building a megakernel runner derives, from the step's graph, its dependencies, events, a static schedule (checked
by ``graph.schedule.validate``) and the queue records: for Llama-3.1-8B at batch 16 (66k tasks) about 15 CPU
seconds of Python, every start. These products are a pure function of the graph, the worker count, the runner's
options and onekernel's code, so they are kept, content-addressed, beside the generated kernel sources
(``exec.codegen.cache_dir()/host``: ``$ONEKERNEL_CACHE``) and a later process loads arrays instead.

* **Key**: sha256 of (onekernel's version and the bytes of every ``onekernel/**/*.py``: ``source_digest``; what
  is cached, e.g. "stream" or "triton"; the options that shape it, e.g. n_workers, policy; the graph's
  ``graph_digest``: its meta, buffers (name, shape, dtype, kind), ops (name, kind name, args, params, tasks) and
  every task's op, tile, bytes, flops and read / write regions). Any change to one of them is another key: a
  miss, never a stale hit.
* **Checked, never trusted**: a file is ``MAGIC + sha256(body) + body`` (body: an uncompressed ``np.savez``, no
  pickles). A truncated or corrupt file, or one that does not decode into what the caller expects, is logged as a
  warning, recomputed and rewritten; it never raises and never returns wrong products. Files are written to a
  temporary name, then renamed (two processes filling the same key store equal products).
* Only products that passed their checks (``validate``, ``check_cross_step``) are stored, so a hit skips them.
* ``ONEKERNEL_HOST_CACHE=0`` turns the cache off (everything is recomputed, nothing written).
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from onekernel.graph.ir import gc_paused

log = logging.getLogger("onekernel")
MAGIC = b"OKHOST01"
_DIGEST = 32


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 of onekernel's version and every source file of the package (path and bytes), once per process."""
    import onekernel

    root = Path(onekernel.__file__).resolve().parent
    h = hashlib.sha256(str(getattr(onekernel, "__version__", "")).encode())
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def graph_digest(graph) -> str:
    """sha256 of everything of ``graph`` the host-side products can depend on (module doc): meta, buffers, ops
    and every task's regions, as one flat int64 array (~0.15 s for 70k tasks on a slow core)."""
    h = hashlib.sha256()
    h.update(repr(sorted((str(k), repr(v)) for k, v in graph.meta.items())).encode())
    h.update(repr([(b.name, b.shape, str(b.dtype), b.kind) for b in graph.buffers.values()]).encode())
    h.update(repr([(op.name, op.kind.name, sorted(op.args.items()), sorted((k, repr(v)) for k, v in op.params.items()),
                    op.n_tiles, op.task_ids, op.index) for op in graph.ops]).encode())
    names = {n: i for i, n in enumerate(graph.buffers)}
    flat: list[int] = []
    ext = flat.extend
    for t in graph.tasks:
        ext((-1, t.id, t.op, t.tile, t.bytes, t.flops, len(t.reads), len(t.writes)))
        for r in (*t.reads, *t.writes):
            ext((names.get(r.buffer, -2), len(r.box)))
            for b in r.box:
                ext(b)
    h.update(np.asarray(flat, dtype=np.int64).tobytes())
    return h.hexdigest()


def enabled() -> bool:
    return os.environ.get("ONEKERNEL_HOST_CACHE", "1") != "0"


def key(what: str, graph, **options) -> str:
    """The cache key of product ``what`` of ``graph`` under ``options`` (module doc)."""
    h = hashlib.sha256()
    for part in (source_digest(), what, repr(sorted(options.items())), graph_digest(graph)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def path_of(what: str, k: str) -> Path:
    from onekernel.exec.codegen import cache_dir

    return cache_dir() / "host" / f"{what}-{k[:40]}.okh"


def load(what: str, k: str) -> dict | None:
    """The arrays stored under key ``k``, or None (no file; a bad file: a warning, and the caller recomputes)."""
    p = path_of(what, k)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("host cache: cannot read %s (%s); recomputing", p, e)
        return None
    body = data[len(MAGIC) + _DIGEST:]
    if data[:len(MAGIC)] != MAGIC or hashlib.sha256(body).digest() != data[len(MAGIC):len(MAGIC) + _DIGEST]:
        log.warning("host cache: %s is truncated or corrupt; recomputing", p)
        return None
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as z:
            return {n: z[n] for n in z.files}
    except Exception as e:  # noqa: BLE001 - any decode failure is a miss
        log.warning("host cache: %s does not decode (%s: %.100s); recomputing", p, type(e).__name__, e)
        return None


def store(what: str, k: str, arrays: dict) -> None:
    """Write ``arrays`` (name -> numpy array) under key ``k``; a failure to write is logged, never raised."""
    p = path_of(what, k)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    body = buf.getvalue()
    tmp = p.with_suffix(f".tmp{os.getpid()}_{threading.get_ident()}")  # threads of one process: their own file
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(MAGIC + hashlib.sha256(body).digest() + body)
        os.replace(tmp, p)
    except OSError as e:
        log.warning("host cache: cannot write %s (%s); the next start recomputes", p, e)
        try:
            tmp.unlink()
        except OSError:
            pass


def cached(what: str, graph, compute, encode, decode, **options):
    """``decode(arrays)`` of the stored products of ``what`` for ``graph`` and ``options`` when the cache holds
    them, else ``compute()`` (stored as ``encode(products)``). ``decode`` may raise on arrays that do not fit (a
    warning, then recomputed). Returns (products, hit)."""
    if not enabled():
        return compute(), False
    k = key(what, graph, **options)
    arrays = load(what, k)
    if arrays is not None:
        try:
            with gc_paused():  # ~10^5 new lists: the cyclic GC would rescan the graph's objects again and again
                return decode(arrays), True
        except Exception as e:  # noqa: BLE001 - a file that does not fit is a miss
            log.warning("host cache: %s does not fit this graph (%s: %.100s); recomputing", path_of(what, k),
                        type(e).__name__, e)
    out = compute()
    store(what, k, encode(out))
    return out, False


# -- list-of-lists <-> arrays ------------------------------------------------------------------------------
def pack_lists(lists, width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ptr int64 [n + 1], values int64 [m] or [m, width]) of a list of lists of ints (or of width-tuples)."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    flat = [v for x in lists for v in x]
    vals = np.asarray(flat, dtype=np.int64).reshape(-1, width) if width else np.asarray(flat, dtype=np.int64)
    return ptr, vals


def unpack_lists(ptr: np.ndarray, vals: np.ndarray, n: int | None = None, tuples: bool = False) -> list:
    """The inverse of ``pack_lists`` (lists of ints, or of tuples when ``tuples``); ValueError on a bad ptr."""
    ptr = np.asarray(ptr)
    if ptr.ndim != 1 or len(ptr) < 1 or ptr[0] != 0 or ptr[-1] != len(vals) or (np.diff(ptr) < 0).any():
        raise ValueError("bad CSR pointer array")
    if n is not None and len(ptr) != n + 1:
        raise ValueError(f"{len(ptr) - 1} lists, expected {n}")
    v = vals.tolist()
    if tuples:
        v = [tuple(x) for x in v]
    p = ptr.tolist()
    return [v[a:b] for a, b in zip(p[:-1], p[1:])]


# -- events and schedules ----------------------------------------------------------------------------------
def encode_events(ev, prefix: str = "ev.") -> dict:
    """A ``graph.deps.EventTable`` as arrays (``decode_events`` gives an equal table back)."""
    out = {"signal": np.asarray(ev.signal, dtype=np.int64), "expected": np.asarray(ev.expected, dtype=np.int64),
           "sys_signal": np.asarray(ev.sys_signal, dtype=np.int8)}
    out["waits.ptr"], out["waits.v"] = pack_lists(ev.waits)
    out["producers.ptr"], out["producers.v"] = pack_lists(ev.producers)
    out["remote.ptr"], out["remote.v"] = pack_lists(ev.remote_waits, 2)
    return {prefix + k: v for k, v in out.items()}


def decode_events(a: dict, n_tasks: int, prefix: str = "ev."):
    from onekernel.graph.deps import EventTable

    g = lambda k: a[prefix + k]  # noqa: E731
    signal, expected = g("signal").tolist(), g("expected").tolist()
    if len(signal) != n_tasks:
        raise ValueError(f"events of {len(signal)} tasks, the graph has {n_tasks}")
    rw = g("remote.ptr")
    return EventTable(signal, unpack_lists(g("waits.ptr"), g("waits.v"), n_tasks), expected,
                      unpack_lists(g("producers.ptr"), g("producers.v"), len(expected)),
                      unpack_lists(rw, g("remote.v").reshape(-1, 2), None if len(rw) == 1 else n_tasks, tuples=True),
                      [bool(x) for x in g("sys_signal").tolist()])


def encode_schedule(s, prefix: str = "sched.") -> dict:
    ptr, v = pack_lists(s.queues)
    return {prefix + "ptr": ptr, prefix + "v": v, prefix + "n_workers": np.asarray(s.n_workers, dtype=np.int64),
            prefix + "policy": np.asarray(s.policy)}


def decode_schedule(a: dict, n_tasks: int, prefix: str = "sched."):
    from onekernel.graph.schedule import Schedule

    queues = unpack_lists(a[prefix + "ptr"], a[prefix + "v"])
    n = int(a[prefix + "n_workers"])
    if len(queues) != n or sum(map(len, queues)) != n_tasks:
        raise ValueError(f"a schedule of {sum(map(len, queues))} tasks on {len(queues)} queues, expected {n_tasks} "
                         f"on {n}")
    return Schedule(queues, n, str(a[prefix + "policy"]))
