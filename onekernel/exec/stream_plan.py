"""Host side of the streaming megakernel (``exec.stream_device``): re-tiling, dependencies, schedule, kernel
constants. Which steps it runs and the chunk shape are ``exec.stream_support``; the queue tables
``exec.stream_records``; the weight stream and argument table ``exec.stream_pack``.

From a bound decode step:
1. **Byte-balanced GEMV tasks.** Every GEMV op (qkv_rope, gemv_residual, gate_up, lm_head) is cut into
   ``units`` of equal bytes, split evenly over the workers (one task per worker per op; the unit counts
   differ by at most one): RESID/LMHEAD unit = RG output rows, GATEUP = RG gate rows + the same RG up rows,
   QKV = RG/2 rotation pairs of one head (rows c*P..c*P+P and hd/2+c*P.. of head h, P = RG/2). Chunk = RG
   rows x CK columns = 16 KB (CK: the largest power of two <= 1024 dividing every K; 256 with zero padding
   when that is smaller). Attention partials and merges: the graph's tiles in runs of consecutive tiles, at most
   one run per worker (record: F_U0 first tile, F_NU tiles); embed and argmax keep the graph's tiles. With FOLD
   (the default; ``STREAM_FOLD_MERGE=0`` turns it off for a measurement) there are no merge tasks: the last
   attention run to finish a (sequence, KV head) group merges its rows (stream_attn._arrive_and_merge), and
   the dependencies are those of the plan with merge tasks, each merge replaced by its own (``stream_fold``).
2. **Dependencies and events** from the tasks' regions (``graph.deps``), exactly as the Triton megakernel.
3. **Schedule**: task j of a GEMV op on worker j; every other task on a worker with the fewest tasks of
   its op so far (the tiles of one op run in parallel; measured: putting ten attention tiles on the four
   least-loaded workers cost 72 us per layer), ties to the fewest bytes; each queue in program order, so no
   wait can deadlock (``graph.schedule.validate`` checks it).
4. **The weight stream**: per worker, the 16 KB chunks of its GEMV tasks in queue order, back to back
   (``packed`` [chunks, RG, CK]); the loader walks it with one bulk copy per chunk.

A ``gemv="mma"`` step (tensor cores, ``consts["MMA"]``) streams the same chunks in another order and layout:
per task, blocks of GB = 64 // RG chunk groups (gate_up: GB / 2 units), each block k-major (for kb: for each
group of the block: chunk (group, kb)), so the consumer stages one [16, CK] activation tile per (block, kb) and
multiplies it with the block's GB weight chunks; and each chunk's elements are permuted on the host into the
shared-memory layout the MMA's operand loads read without bank conflicts (``mma_weight_bases``: the chunk as
[4 warps, CK/4, RG], the rows XOR-swizzled into 16-byte units). docs/DESIGN.md, "Tensor cores in the streaming
megakernel".

Tensor parallel (a graph from ``decode_graph(tp=(rank, n))``, reading peer buffers; dist/tp_megakernel.py): the
all-reduce ops keep the graph's tiles (K_ALLREDUCE; they stream no weights); remote dependencies, events with
``sys_signal`` and the schedule are built as ``exec.megakernel`` builds them for the Triton kernel (on the local
and remote dependencies merged, ``check_cross_step`` on the re-tiled graph), so the plan is a function of the
graph's shapes and the worker count: the same on every rank (``fingerprint`` lets the ranks compare). The
records carry F_SYS and the remote wait range (stream_base); ``remote_wait_list`` gives the (event, expected,
peer) table.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import hashlib
import os

import numpy as np
import torch

from onekernel.errors import InputError, ScheduleError
from onekernel.exec import host_cache
from onekernel.exec import stream_base as sd
from onekernel.exec.stream_fold import FOLD, fold_fits, fold_merge_deps
from onekernel.exec.stream_records import decode_products, encode_products, records, remote_wait_list
from onekernel.exec.stream_support import GEMV_KINDS, OTHER_KINDS, chunk_shape, gemv_k
from onekernel.graph.deps import (derive_dependencies, derive_remote_dependencies, events_and_order,
                                  transitive_reduction)
from onekernel.graph.ir import Graph, Op, Region, Task, gc_paused
from onekernel.graph.schedule import Schedule, validate
from onekernel.exec.stream_smem import (CHUNK_ELEMS, MMA_BLOCK_ROWS, SMEM_LIMIT, XBUF_SLOTS, _slots,  # noqa: F401
                                        acc_groups, attn_bn, attn_tc_bufs, bars_guess, fma_xbuf_bytes, mma_groups,
                                        mma_smem, pow2_ceil, xbuf_rows)

# One event per producer op (graph.deps.derive_op_events) on a single GPU: an attention task spins on one counter, not
# 1-5 tile events (1-1.5% faster on the Llama models, run 21: docs/DESIGN.md). STREAM_OP_EVENTS=0 keeps tile events
# (tensor parallel always does: graph.deps.events_and_order).
OP_EVENTS = os.environ.get("STREAM_OP_EVENTS", "1") == "1"
# ops whose graph tiles are grouped into runs of consecutive tiles, one task per worker (a batch of 8 has 576
# attention tiles for Llama-3.2-1B: one task each cost ~5 us of record loads, waits and signals per tile)
GROUPED_KINDS = ("attn_partial", "attn_merge")
ROLES = {sd.K_EMBED.value: ("tokens", "table", "out"), sd.K_RESID.value: ("x", "res", "out", "ss"),
         sd.K_GATEUP.value: ("x", "nw", "out", "ss"),
         sd.K_QKV.value: ("x", "nw", "q", "k_cache", "v_cache", "seq_lens", "inv_freq", "qn", "kn", "ss"),
         sd.K_LMHEAD.value: ("x", "nw", "logits", "pmax", "pidx", "ss"),
         sd.K_ATTN.value: ("q", "k_cache", "v_cache", "seq_lens", "o_part", "lse_part", "out", "arrive"),
         sd.K_MERGE.value: ("o_part", "lse_part", "out"), sd.K_ARGMAX.value: ("pmax", "pidx", "out"),
         sd.K_ALLREDUCE.value: tuple(f"in{j}" for j in range(8)) + ("res", "out")}
MAXA = max(len(r) for r in ROLES.values())
# the kernel finds a GEMV op's RMSNorm partials at these argument slots (stream_epilogue.ss_buffer)
assert [ROLES[k.value].index("ss") for k in (sd.K_RESID, sd.K_GATEUP, sd.K_QKV, sd.K_LMHEAD)] == \
    [sd.SS_ARG.value, sd.SS_ARG.value, sd.SS_ARG_QKV.value, sd.SS_ARG_LM.value]
# RMSNorm partials (gemv="mma"): a residual GEMV whose output an RMSNorm'd GEMV reads stores each task's per-row sums of
# squares of its rounded outputs (stream.ss.<op> fp32 [B, tasks]); the reader sums them in one fixed order for its rstd
# instead of re-reading the [B, D] rows (docs/DESIGN.md, "RMSNorm partials"). Measured (run 36, calls 348-352, the
# megakernel, each variant its own process): Llama-3.1-8B (D 4096) batch 1 / 4 / 8 / 16 3.825 / 4.016 / 4.200 / 4.624 ms
# against 3.827 / 4.039 / 4.256 / 4.649 without; Llama-3.2-1B (D 2048) 0.819 / 0.977 / 1.099 against 0.812 / 0.966 /
# 1.104 at batch 1 / 8 / 16 and SmolLM2-135M (D 576) 3-6% slower. So by default ("auto") only where D >= SS_MIN_D;
# STREAM_SS_PARTIALS=1: every tensor-core step, 0: none (the rstd pass over the rows in every reader task).
SS_PARTIALS = os.environ.get("STREAM_SS_PARTIALS", "auto")
if SS_PARTIALS not in ("auto", "1", "0"):  # at import: inside a runner's build, backend="auto" would fall back on it
    raise InputError(f"STREAM_SS_PARTIALS must be auto, 1 or 0, got {SS_PARTIALS!r}; unset it for the default (auto)")
SS_MIN_D = 4096
NORMED = ("qkv_rope", "gate_up", "lm_head")
# gemv="mma": the consumer's 4 warps each take a CK/4 slice of a chunk; the batch is padded to 16 rows
MMA_WARPS, MMA_ROWS = sd.MMA_WARPS, sd.MMA_ROWS
mma_weight_bases, mma_act_bases = sd.mma_weight_bases, sd.mma_act_bases


def task_bound(graph, n_workers: int) -> int:
    """An upper bound on the tasks (so on the events) of ``make_plan(step, n_workers)`` for a step of ``graph``:
    n_workers per GEMV op, the graph's own tiles for the others (dist/tp_megakernel.py sizes its counters by it
    before any plan is built)."""
    return sum(n_workers if op.kind.name in GEMV_KINDS else len(op.task_ids) for op in graph.ops)


@dataclass
class StreamPlan:
    graph: Graph                          # the re-tiled graph (same buffers, plus stream.pmax / stream.pidx)
    kinds: list[int]                      # per op of ``graph``: the stream_base task kind
    schedule: Schedule
    events: object                        # graph.deps.EventTable
    units: list[tuple[int, int]]          # per task: (first unit, units) of GEMV tasks, (first tile, tiles) of
                                          # attention / merge runs, (0, 0) otherwise
    consts: dict = field(default_factory=dict)
    group_rows: dict = field(default_factory=dict)   # op index -> int64 [groups, RG] weight rows (N: zero row)
    weight_of: dict = field(default_factory=dict)    # op index -> weight buffer name
    tables: dict = field(default_factory=dict)       # "qrec", "wl", "rwl": records(plan), remote_wait_list(plan)
    cache_hit: bool = False                          # events, schedule and tables came from exec.host_cache


def _units(kind: int, op: Op, rg: int) -> tuple[int, torch.Tensor, str]:
    """(units, weight rows of each chunk group [groups, RG] in stream order, weight buffer) of a GEMV op."""
    p = op.params
    r = torch.arange(rg)
    if kind == sd.K_QKV.value:
        hd, nh = p["HD"], p["HQ"] + 2 * p["HKV"]
        P, ch = rg // 2, p["HD"] // rg
        u = torch.arange(nh * ch)
        h, c = u // ch, u % ch
        rows = h[:, None] * hd + (r[None, :] // P) * (hd // 2) + c[:, None] * P + (r[None, :] % P)
        return nh * ch, rows, op.args["w"]
    n = p["N"]
    nu = -(-n // rg)
    rows = torch.arange(nu)[:, None] * rg + r[None, :]
    rows = torch.where(rows < n, rows, -1)
    if kind == sd.K_GATEUP.value:
        up = torch.where(rows >= 0, rows + n, -1)
        rows = torch.stack([rows, up], 1).reshape(-1, rg)
    return nu, rows, op.args["w"]


def _gemv_regions(kind: int, op: Op, g: Graph, rows: list, u0: int, u1: int, rg: int, idx: int):
    """(reads, writes) of the GEMV task covering units [u0, u1) (weights left out: read-only); ``rows``: the
    unit rows of ``_units`` as a list of lists (``tolist()``: Python ints, no tensor indexing per unit)."""
    a, p = op.args, op.params
    B = g.buffers[a["x"]].shape[0]
    reads = [Region(a["x"], ((0, B), (0, g.buffers[a["x"]].shape[1])))]
    if "ss" in a and kind != sd.K_RESID.value:  # the producer's RMSNorm partials (every task's)
        reads.append(g.buffers[a["ss"]].full())
    if kind == sd.K_QKV.value:
        hd, hq, hkv = p["HD"], p["HQ"], p["HKV"]
        S = p["S"]
        reads += [g.buffers[a["seq_lens"]].full(), g.buffers[a["inv_freq"]].full()]
        writes = []
        for u in range(u0, u1):
            h = int(rows[u][0]) // hd
            for half in (rows[u][: rg // 2], rows[u][rg // 2:]):
                lo, hi = int(half[0]) - h * hd, int(half[-1]) - h * hd + 1
                if h < hq:
                    writes.append(Region(a["q"], ((0, B), (h, h + 1), (lo, hi))))
                else:
                    cache, hh = (a["k_cache"], h - hq) if h < hq + hkv else (a["v_cache"], h - hq - hkv)
                    writes.append(Region(cache, ((0, B), (hh, hh + 1), (0, S), (lo, hi))))
        return reads, writes
    n = p["N"]
    lo, hi = u0 * rg, min(u1 * rg, n)
    if kind == sd.K_RESID.value:
        reads.append(Region(a["res"], ((0, B), (lo, hi))))
        ss = [Region(a["ss"], ((0, B), (idx, idx + 1)))] if "ss" in a else []
        return reads, [Region(a["out"], ((0, B), (lo, hi)))] + ss
    reads.append(g.buffers[a["nw"]].full())
    if kind == sd.K_GATEUP.value:
        return reads, [Region(a["out"], ((0, B), (lo, hi)))]
    return reads, [Region(a["logits"], ((0, B), (lo, hi))), Region("stream.pmax", ((0, B), (idx, idx + 1))),
                   Region("stream.pidx", ((0, B), (idx, idx + 1)))]


@gc_paused()
def make_plan(step, n_workers: int, fold: bool | None = None) -> StreamPlan:
    """The re-tiled graph, events, schedule and constants of the streaming megakernel for ``step`` (module
    doc). Call ``stream_support.unsupported(step)`` first. ``fold`` (default FOLD): the attention tasks merge the
    split-KV partials themselves (the last of a (sequence, KV head)'s splits to finish, by an arrival counter), so
    the plan has no attn_merge tasks: 5 dependent stages per layer, not 6 (unless a run of attention tiles spans
    more than 31 groups: a handful of workers)."""
    src = step.graph
    fold = (FOLD if fold is None else bool(fold)) and fold_fits(src, n_workers)
    B = step.batch
    _, ck, rg, kxb = chunk_shape(src)
    lm = next(op for op in src.ops if op.kind.name == "lm_head")
    nt = min(n_workers, _units(sd.K_LMHEAD.value, lm, rg)[0])
    g = Graph(buffers=dict(src.buffers), meta=dict(src.meta))
    g.add_buffer("stream.pmax", (B, nt), torch.float32, "scratch")
    g.add_buffer("stream.pidx", (B, nt), torch.int32, "scratch")
    kinds, units, group_rows, weight_of, entries = [], [], {}, {}, []
    merges = {op.args["o_part"]: op for op in src.ops if op.kind.name == "attn_merge"}
    ss_of, nss = _ss_partials(src, n_workers, rg)
    for op in src.ops:
        name = op.kind.name
        args = dict(op.args)
        if name in ("lm_head", "argmax"):
            args.update(pmax="stream.pmax", pidx="stream.pidx")
        new = Op(op.name, op.kind, args, dict(op.params))
        if fold and name == "attn_merge":  # its tasks exist only in the graph the dependencies come from
            entries.append((new, [Task(-1, t.tile, t.reads, t.writes, t.bytes, t.flops)
                                  for t in (src.tasks[i] for i in op.task_ids)]))
            continue
        if fold and name == "attn_partial":  # the last split of a (b, KV head) writes the merged rows out[b, its
            # heads]; no region lists them (whichever split is last writes them: as regions of every split they would
            # chain the splits by WAW); the dependencies come from the plan with the merge tasks (stream_fold)
            arrive = g.add_buffer(f"stream.arrive.{op.name}", (op.params["HKV"] * B,), torch.int32, "scratch")
            args.update(out=merges[op.args["o_part"]].args["out"], arrive=arrive.name)
        if name == "gemv_residual" and op.args["out"] in ss_of:
            args["ss"] = g.add_buffer(ss_of[op.args["out"]], (B, nss), torch.float32, "scratch").name
        elif name in NORMED and op.args["x"] in ss_of:
            args["ss"] = ss_of[op.args["x"]]
            if args["ss"] not in g.buffers:
                raise ScheduleError(f"streaming megakernel: {op.name} reads {op.args['x']} before its producer")
        if name in GEMV_KINDS:
            kind = GEMV_KINDS[name]
            nu, rows, wname = _units(kind, op, rg)
            k = gemv_k(op)
            gpu = 2 if kind == sd.K_GATEUP.value else 1   # chunk groups per unit
            nkb = -(-k // ck)
            tasks, bounds = [], [(w * nu) // n_workers for w in range(n_workers + 1)]
            if kind == sd.K_QKV.value and op.params.get("QK_NORM"):  # whole heads per task: the q/k RMSNorm pass
                ch = op.params["HD"] // rg                          # (stream_epilogue.qk_norm_head) sums a head
                bounds = [((w * (nu // ch)) // n_workers) * ch for w in range(n_workers + 1)]
            rows_l = rows.tolist() if kind == sd.K_QKV.value else None  # only qkv reads rows per unit
            for j in range(n_workers):
                u0, u1 = bounds[j], bounds[j + 1]
                if u1 == u0:
                    continue
                reads, writes = _gemv_regions(kind, new, g, rows_l, u0, u1, rg, len(tasks))
                nb = (u1 - u0) * gpu * nkb * CHUNK_ELEMS * 2
                tasks.append(Task(-1, len(tasks), tuple(reads), tuple(writes), nb, B * nb))  # 2 flops per element
                units.append((u0, u1 - u0))
            new.params.update(NKB=nkb, KG=k)
            group_rows[len(g.ops)] = rows
            weight_of[len(g.ops)] = wname
        elif name in GROUPED_KINDS:  # attention partials and merges: runs of tiles, at most one task per worker
            kind = OTHER_KINDS[name]
            tasks = []
            tiles = [src.tasks[i] for i in op.task_ids]
            bounds = [(w * len(tiles)) // n_workers for w in range(n_workers + 1)]
            for j in range(n_workers):
                run = tiles[bounds[j]:bounds[j + 1]]
                if not run:
                    continue
                reads = tuple(dict.fromkeys(r for t in run for r in t.reads))
                writes = tuple(dict.fromkeys(w for t in run for w in t.writes))
                tasks.append(Task(-1, len(tasks), reads, writes, sum(t.bytes for t in run),
                                  sum(t.flops for t in run)))
                units.append((run[0].tile, len(run)))
        else:
            kind = OTHER_KINDS[name]
            tasks = []
            for t in (src.tasks[i] for i in op.task_ids):
                reads, writes = t.reads, t.writes
                if name == "argmax":
                    reads = (g.buffers["stream.pmax"].full(), g.buffers["stream.pidx"].full())
                tasks.append(Task(-1, t.tile, tuple(reads), tuple(writes), t.bytes, t.flops))
                units.append((0, 0))
        if fold:
            entries.append((Op(new.name, new.kind, dict(new.args), dict(new.params)),
                            [Task(-1, t.tile, t.reads, t.writes, t.bytes, t.flops) for t in tasks]))
        g.add_op(new, tasks)
        kinds.append(kind)
    attn = next(op for op in src.ops if op.kind.name == "attn_partial").params
    merge = next(op for op in src.ops if op.kind.name == "attn_merge").params
    ngp = pow2_ceil(-(-max(n for (_, n), t in zip(units, g.tasks) if kinds[t.op] == sd.K_ATTN.value)
                      // attn["NSPLIT"]) + 1)
    emb = next(op for op in src.ops if op.kind.name == "embed").params
    hd, r = attn["HD"], attn["HQ"] // attn["HKV"]
    rp = pow2_ceil(r)
    bn = attn_bn(attn["SPLIT"], rp, hd)
    mma = g.meta.get("gemv") == "mma"
    xb = 0 if mma else xbuf_rows(B, kxb, ck)
    consts = dict(B=B, BP=pow2_ceil(B), XB=xb, KXB=kxb, RG=rg, CK=ck, SLOTS=_slots(xb, kxb, ck, rg, mma, B, rp, hd), MAXA=MAXA,
                  V=emb["V"], D=emb["D"], HQ=attn["HQ"], HKV=attn["HKV"], HD=hd, S=attn["S"], SPLIT=attn["SPLIT"],
                  NSPLIT=attn["NSPLIT"], RP=rp, BN=bn, NSP2=merge["NSP2"],
                  CHM=merge["CH"], BD=emb["BLOCK_D"], NT=nt, EPS=float(lm.params["EPS"]),
                  SM_SCALE=float(attn["SM_SCALE"]), MMA=mma, GB=mma_groups(rg), ACCG=acc_groups(rg, rp, hd), **_tp_consts(g, kinds, emb["D"]),
                  FOLD=fold, NGP=ngp, NSS=nss, QKN=any(bool(op.params.get("QK_NORM")) for op in src.ops),
                  ATTN_TC=attn_tc_bufs(ck, hd, attn["SPLIT"], attn["HQ"], attn["HKV"], rg, mma),
                  NTA=pow2_ceil(max(n for (_, n), t in zip(units, g.tasks)
                                    if kinds[t.op] == sd.K_ATTN.value)))

    def compute():  # dependencies, events, schedule (validated) and records: what exec.host_cache keeps
        if fold:  # from the plan with its merge tasks (module doc), their dependencies moved to their consumers
            full = Graph(buffers=dict(g.buffers), meta=dict(g.meta))
            for op, tasks in entries:
                full.add_op(op, tasks)
            deps = fold_merge_deps(full, g, transitive_reduction(derive_dependencies(full)))
        else:
            deps = transitive_reduction(derive_dependencies(g))
        remote = derive_remote_dependencies(g)
        if any(remote):  # tensor parallel: as exec.megakernel.MegakernelRunner
            bad = [t for t, rs in enumerate(remote) if rs and kinds[g.tasks[t].op] != sd.K_ALLREDUCE.value]
            if bad:
                raise ScheduleError(f"streaming megakernel: only all-reduce tasks may read other ranks' buffers; task "
                                    f"{bad[0]} ({g.ops[g.tasks[bad[0]].op].name}) does")
        events, sched_deps = events_and_order(g, deps, remote, ev_mode)
        queues, load = [[] for _ in range(n_workers)], [0] * n_workers
        gemv = set(GEMV_KINDS.values())
        for op, kind in zip(g.ops, kinds):
            order = []  # other ops: round r gives every worker its r-th task of the op, fewest bytes first
            for j, t in enumerate(op.task_ids):
                if kind in gemv:
                    w = j
                else:
                    if j % n_workers == 0:
                        order = sorted(range(n_workers), key=lambda i: (load[i], i))
                    w = order[j % n_workers]
                queues[w].append(t)
                load[w] += max(g.tasks[t].bytes, 1)
        schedule = Schedule(queues, n_workers, "stream")
        validate(schedule, g, sched_deps)
        plan = StreamPlan(g, kinds, schedule, events, units, consts, group_rows, weight_of)
        return (events, schedule, *records(plan), remote_wait_list(plan))

    n = len(g.tasks)
    ev_mode = "op" if OP_EVENTS else "tile"  # tensor parallel keeps tile events (graph.deps.events_and_order)
    units_arr = np.asarray(units, dtype=np.int64).reshape(-1, 2)
    (events, schedule, qrec, wl, rwl), hit = host_cache.cached(
        "stream", g, compute, encode_products, lambda a: decode_products(a, n), n_workers=n_workers,
        kinds=tuple(kinds), units=hashlib.sha256(units_arr.tobytes()).hexdigest(), events=ev_mode)
    plan = StreamPlan(g, kinds, schedule, events, units, consts, group_rows, weight_of)
    plan.tables = {"qrec": qrec, "wl": wl, "rwl": rwl}
    plan.cache_hit = hit
    return plan


def _ss_partials(src: Graph, n_workers: int, rg: int) -> tuple[dict, int]:
    """({residual GEMV output buffer: its RMSNorm partials buffer name}, NSS: the tasks of each such op) of a
    gemv="mma" step (module constants SS_PARTIALS, SS_MIN_D: by default hidden sizes >= 4096): the residual GEMVs with
    N = D (every one has the same min(units, workers) tasks, make_plan's split) whose output buffer has no other writer
    and is read with K = D by an RMSNorm'd GEMV (qkv_rope, gate_up, lm_head). ({}, 0) for the CUDA-core path, with the
    partials off or below SS_MIN_D, or when no residual GEMV qualifies (the first layer's qkv reads the embedding and
    tensor parallel's readers the all-reduce: their rstd pass stays). A bad STREAM_SS_PARTIALS raises InputError when
    this module is imported."""
    d = next(op for op in src.ops if op.kind.name == "embed").params["D"]
    if SS_PARTIALS == "0" or (SS_PARTIALS == "auto" and d < SS_MIN_D) or src.meta.get("gemv") != "mma":
        return {}, 0
    normed_x = {op.args["x"] for op in src.ops if op.kind.name in NORMED and gemv_k(op) == d}
    writers = {}
    for op in src.ops:
        writers[op.args.get("out")] = writers.get(op.args.get("out"), 0) + 1
    ss_of = {op.args["out"]: f"stream.ss.{op.name}" for op in src.ops  # (one writer: the reader's producer)
             if op.kind.name == "gemv_residual" and op.params["N"] == d and op.args["out"] in normed_x
             and writers[op.args["out"]] == 1}
    return ss_of, (min(-(-d // rg), n_workers) if ss_of else 0)


def _tp_consts(g: Graph, kinds: list[int], D: int) -> dict:
    """TP (all-reduce tasks, remote waits and system-scope signals compiled in), NR (ranks summed by an all-reduce), ARD (its columns per tile): one value
    for every all-reduce op of the graph (ValueError otherwise)."""
    ar = [op for op, k in zip(g.ops, kinds) if k == sd.K_ALLREDUCE.value]
    if not ar:
        return dict(TP=False, NR=1, ARD=1)
    shapes = {(op.params["N"], op.params["BLOCK_D"], op.params["D"]) for op in ar}
    if len(shapes) != 1 or next(iter(shapes))[2] != D:
        raise ValueError(f"streaming megakernel: the all-reduce ops must share (ranks, BLOCK_D, D = {D}); got {shapes}")
    nr, ard, _ = shapes.pop()
    return dict(TP=True, NR=nr, ARD=ard)
