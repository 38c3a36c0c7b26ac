"""Generate Triton kernels from op descriptions: one per-op kernel per op variant, and the megakernel.

``triton.jit`` reads a kernel's source from its file, so generated source is written to a cache folder
(``$ONEKERNEL_CACHE`` or ``~/.cache/onekernel/gen``) under a name derived from its hash, then imported.
The generated code only *calls* the tile functions that live in ``onekernel/ops``; it adds the launch
shape, the PDL calls, the profiling timestamps and (for the megakernel) the task loop and events.

A *variant* is an (op kind, constexpr params, pointer dtypes) triple: ops of one variant share one compiled
tile function, so the 30 QKV ops of a 30-layer model are one variant.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from onekernel.graph.ir import Graph, Op
from onekernel.ops.base import OpKind

_TL_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.int8: "tl.int8",
}


@dataclass(frozen=True)
class Variant:
    """Key of one compiled tile function: kind name, sorted constexpr params, pointer element dtypes
    (``kind``, the OpKind itself, rides along and is not part of the key)."""

    name: str
    params: tuple[tuple[str, object], ...]
    dtypes: tuple[str, ...]
    kind: OpKind = field(compare=False, repr=False)

    def const_values(self) -> list:
        p = dict(self.params)
        return [p[c] for c in self.kind.consts]


def variant_of(graph: Graph, op: Op) -> Variant:
    kind = op.kind
    missing = [c for c in kind.consts if c not in op.params]
    if missing:
        raise ValueError(f"op {op.name!r} lacks constexpr params {missing} of kind {kind.name!r}")
    params = tuple(sorted((c, op.params[c]) for c in kind.consts))
    dtypes = tuple(_TL_DTYPES[graph.buffers[op.args[a]].dtype] for a in kind.args)
    return Variant(kind.name, params, dtypes, kind)


def cache_dir() -> Path:
    d = Path(os.environ.get("ONEKERNEL_CACHE", Path.home() / ".cache" / "onekernel" / "gen"))
    d.mkdir(parents=True, exist_ok=True)
    return d


_LOAD_LOCK = threading.RLock()  # threads of one process (dist.threads' ranks) load the same module at once


def load_source(src: str, stem: str):
    """Write ``src`` to the cache folder (content-addressed) and import it as a module. Thread-safe: without the
    lock a second thread could take the module from sys.modules before it was executed (AttributeError), or
    write the same temporary file."""
    h = hashlib.sha1(src.encode()).hexdigest()[:16]
    name = f"onekernel_gen_{stem}_{h}"
    with _LOAD_LOCK:
        if name in sys.modules:
            return sys.modules[name]
        path = cache_dir() / f"{name}.py"
        if not path.exists() or path.read_text() != src:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(src)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod


def fn_import(fn, alias: str) -> str:
    """``from module import name as alias`` for a JITFunction defined at module level in onekernel.ops."""
    inner = getattr(fn, "fn", fn)
    return f"from {inner.__module__} import {inner.__name__} as {alias}"


HEADER = """import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait, gdc_launch_dependents, globaltimer, smid
"""


def eager_source(kind: OpKind) -> str:
    """Source of the per-op kernel of ``kind``: grid = (n_tiles,), one program per tile.

    PDL (constexpr): run the prologue, ``gdc_wait``, run the body; trigger the dependent launch
    (``gdc_launch_dependents``) where TRIGGER says.
    PROLOGUE_SPLIT (constexpr, only read when PDL): False moves ``gdc_wait`` before the prologue, so nothing of
    the kernel overlaps its predecessor but the launch itself (the "no prologue split" variant of the study).
    TRIGGER (constexpr, only read when PDL; ``TRIGGERS``): 0 "entry" (before the prologue), 1 "wait" (right
    after ``gdc_wait``), 2 "end" (after the body: the default). The earlier the trigger, the earlier the
    dependent grid's CTAs become resident and park in ``gdc_wait``, taking SM slots (registers, shared memory)
    that this grid's later CTAs still need; with "entry" every grid triggers its dependent as soon as its CTAs
    are resident, so the launches cascade down the chain. H200, Llama-3.2-1B (scripts/pdl_probe.py, run 8 call
    2, ba23584), ms per step entry / wait / end (graph): CUDA-core GEMVs batch 1 1.123 / 1.052 / 1.019 (1.027),
    batch 8 4.018 / 3.885 / 3.164 (3.150); tensor-core GEMVs batch 1 2.347 / 1.423 / 1.231 (1.240), batch 8
    2.126 / 1.613 / 1.365 (1.354). Again with one-wave tensor-core grids (run 29 call 300, bench rows pdl-triton
    and pdl-triton-wait, ms at batch 1 / 8 / 16): "wait" Llama-3.2-1B 1.283 / 1.412 / 1.589 against "end" 1.004 /
    1.168 / 1.327, Llama-3.1-8B 5.082 / 5.514 / 5.916 against 4.517 / 4.952 / 5.453. With "end" a tile still loads
    its first weight chunk before ``gdc_wait``, but only once the previous grid has finished its bodies.
    PROFILE (constexpr): write (start, deps satisfied, end, SM id) as int64 to ``prof + (prof_base + tile) * 4``.
    """
    args = ", ".join(kind.args)
    consts = "".join(f", {c}" for c in kind.consts)
    cdecl = "".join(f", {c}: tl.constexpr" for c in kind.consts)
    state = ", ".join(f"s{i}" for i in range(kind.n_state))
    lines = [
        HEADER,
        fn_import(kind.prologue, "PROLOGUE"),
        fn_import(kind.body, "BODY"),
        "",
        "",
        "@triton.jit",
        f"def kernel({args}, prof, prof_base{cdecl}, PDL: tl.constexpr, PROFILE: tl.constexpr,",
        "           PROLOGUE_SPLIT: tl.constexpr, TRIGGER: tl.constexpr):",
        "    tile = tl.program_id(0)",
        "    if PROFILE:",
        "        t0 = globaltimer()",
        "    if PDL:",
        "        if TRIGGER == 0:",
        "            gdc_launch_dependents()",
        "        if not PROLOGUE_SPLIT:",
        "            gdc_wait()",
        "            if TRIGGER == 1:",
        "                gdc_launch_dependents()",
        f"    {state} = PROLOGUE(tile, {args}{consts})",
        "    if PDL:",
        "        if PROLOGUE_SPLIT:",
        "            gdc_wait()",
        "            if TRIGGER == 1:",
        "                gdc_launch_dependents()",
        "    if PROFILE:",
        "        t1 = globaltimer()",
        f"    BODY(tile, {state}, {args}{consts})",
        "    if PDL:",
        "        if TRIGGER == 2:",
        "            gdc_launch_dependents()",
        "    if PROFILE:",
        "        t2 = globaltimer()",
        "        rec = prof + (prof_base + tile) * 4",
        "        tl.store(rec, t0)",
        "        tl.store(rec + 1, t1)",
        "        tl.store(rec + 2, t2)",
        "        tl.store(rec + 3, smid().to(tl.int64))",
        "",
    ]
    return "\n".join(lines)


TRIGGERS = ("entry", "wait", "end")  # PDL trigger positions, by the TRIGGER constexpr's value
_EAGER: dict[str, object] = {}


def eager_kernel(kind: OpKind):
    """The compiled-on-demand per-op kernel (a ``triton.JITFunction``) of op kind ``kind``."""
    if kind.name not in _EAGER:
        _EAGER[kind.name] = load_source(eager_source(kind), f"eager_{kind.name}").kernel
    return _EAGER[kind.name]


def launch_op(graph: Graph, op: Op, tensors: dict[str, torch.Tensor], *, pdl: bool = False,
              prof: torch.Tensor | None = None, prof_base: int = 0, prologue_split: bool = True,
              trigger: str = "end"):
    """Launch ``op`` as one kernel with one program per tile (eager/graph/pdl modes).

    tensors: buffer name -> tensor (a BoundStep's). prof: int64 [n_tasks, 4] or None.
    prologue_split (PDL only): False waits on the previous kernel before the prologue instead of after it.
    trigger (PDL only): where the dependent launch is triggered, one of ``TRIGGERS`` (``eager_source``).
    """
    kind = op.kind
    ptrs = [tensors[op.args[a]] for a in kind.args]
    consts = {c: op.params[c] for c in kind.consts}
    profile = prof is not None
    if prof is None:
        prof = ptrs[0]
    # prof_base is 0 unless profiling: Triton specialises an int argument on == 1 and on % 16 == 0, so passing
    # each op's first task id compiled a kind up to 3 times (SmolLM2-135M batch 1: 13 kernels for 8 kinds)
    eager_kernel(kind)[(op.n_tiles,)](
        *ptrs, prof, prof_base if profile else 0, **consts, PDL=pdl, PROFILE=profile, PROLOGUE_SPLIT=prologue_split,
        TRIGGER=TRIGGERS.index(trigger), num_warps=kind.num_warps, **({"launch_pdl": True} if pdl else {}))
