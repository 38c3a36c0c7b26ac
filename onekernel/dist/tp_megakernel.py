"""The megakernel at tensor-parallel size > 1: one persistent kernel per rank, the all-reduces as its tile tasks.

The rank's graph is ``models.decode_graph``'s for its local config with ``tp=(rank, n)``, on the unsharded model's
GEMV path (``dist.tp_kernels.rank_gemv``): all-reduce ops (``ops/allreduce.py``) after ``embed``, ``o_proj.{i}``
and ``down.{i}`` (Megatron-LM, Shoeybi et al. 2019, sections 3 and 3.1: the points where ``dist.tp_kernels`` calls
a host all-reduce). The GEMVs add ``residual.zero`` (both GEMV bodies of both backends: the same epilogue) and the
all-reduce adds the residual stream once. An all-reduce tile reads its columns of every rank's partial (its own,
and the peers' through *peer* buffers), adds the residual stream and the partials in rank order in fp32 and rounds
once, so every rank's reduced rows are the same bits. It waits on its local producers as any task, and on the same
producers *on every peer* (remote waits: identical graphs on every rank give identical task and event ids;
``exec.megakernel``), spinning with ``ld.acquire.sys`` on the peer's event counters; the producers of those events
signal with a system-scope release. A remote wait that gives up names the task, its op, the event and the peer rank
(``KernelTimeoutError`` from ``check()``).

Identical graphs: every rank builds the same shapes. Where the vocabulary does not split evenly (V % n != 0),
the shorter ranks' embedding and LM-head shards get zero rows up to the longest range (rank 0's): a zero
embedding row is what a token outside the rank's range embeds anyway, and the padded logits are dropped before
the gather; the greedy argmax is then computed from the real logits (PyTorch, in the CUDA graph) instead of the
kernel's. The runner also compares a fingerprint of every rank's schedule and events before the first launch.

Memory (``SymmetricPools``): each rank owns one pool: its event counters (one int32 per task: at least one per
event) and every partial buffer a peer reads (``embed.out``, ``o_proj.{i}.out``, ``down.{i}.out``: [B, D],
16-byte aligned). On GPUs the pools are PyTorch symmetric memory (``symm_mem.empty`` + ``rendezvous``; each
peer's pool mapped here by ``get_buffer``): the megakernel addresses a peer's rows as this process's per-dtype
base pointer plus an int64 offset in 16-byte units, which may be negative (one virtual address space: CUDA's
unified addressing), and a peer's counters as ``ev_cnt + peer_off[peer]``. On the CPU (the interpreter test) the
pools are shared-memory CPU tensors created by a parent process and handed to every rank (``shared_pools``).
NVLink multicast stays off (``process.NO_MULTICAST``, set by ``init_rank``).

Cross-step safety (no rank overwrites a partial in step t+1 before every peer read it in step t): a rank writes
a partial of step t+1 only after its own step t ended. ``embed.out``: this rank's step t ended after its
``o_proj.0.ar`` tiles, which waited on every peer's ``o_proj.0`` tiles, which depend (through qkv, attention and
the merge, each qkv tile reading whole rows of x) on all of that peer's ``embed.ar`` tiles, the readers of this
rank's ``embed.out``. Every other partial's writers depend on this rank's ``embed.ar`` of step t+1, which waits
on every peer's ``embed`` tiles of step t+1, which run only after that peer's whole step t (its kernels run one
after the other), its readers included. ``graph.deps.check_cross_step`` checks exactly this on the built graph
(and the runner refuses a graph where it fails). The event counters are monotonic (waits compare with
expected x epoch), so they are never overwritten.

Pull or push (``push``, the streaming backend only; default pull). *Pull*: an all-reduce tile reads each peer's
partial from the peer's memory and polls the peer's counters (every wait and read an NVLink round trip on the
critical path). *Push*: a producer whose rows a peer reads (its record's F_SYS) stores them into every peer's
pool as well as its own (the same offsets in every pool: ``bind_pools``' slot per rank), then adds to its own
counter (gpu scope) and, with a system-scope release, to each peer's *receive* counter for it; the all-reduce
tile polls and reads only its own GPU's memory (``exec.persistent.push_counters`` gives the kernel the three
offset tables). The NVLink writes are posted; the producer's release waits for them, off the reader's path.
The graph, the tasks, the events and the sums (rank order, one rounding) are the same, so both give the same
bits. Cross-step safety holds with the roles mirrored: rank p's pushes of step t+1 into rank q's slot follow
p's step-t end (``embed.out``: after q's ``embed.ar`` tiles read slot p, through q's ``o_proj.0`` pushes that
p's ``o_proj.0.ar`` waited on) or p's ``embed.ar`` of step t+1 (which waits on q's step-t+1 ``embed`` pushes,
made after q's whole step t); the receive counters are monotonic, zeroed only by the rank barrier's rewind.

Backends: "triton" (``exec.megakernel``, every device and the interpreter; run on two H200s) or "gluon" (the
streaming kernel, ``exec.stream_runner``: the all-reduces are non-GEMV tile tasks of the re-tiled plan, its remote
waits and system-scope signals built as the Triton kernel's; run on two H200s in run 8); "auto" takes "gluon" where the
single-GPU "auto" would (``stream_support.unsupported`` / ``prefer_stream``, no Triton-only option given; with or
without ``profile``) and falls back to "triton" when the streaming kernel does not build. The default is
DEFAULT_BACKEND.

Logits: the LM head stays vocabulary-parallel; after the launch the runner gathers the logits and takes the
distributed argmax with ``TPGroup``'s collectives (as ``dist.tp_kernels``), inside the same CUDA graph as the
megakernel launch when it captures one (``MegakernelRunner(after=...)``).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from onekernel.dist.sharding import vocab_range
from onekernel.dist.tp_kernels import TPRankRunner, rank_barrier, rank_gemv
from onekernel.errors import InputError, ScheduleError
from onekernel.exec import sm_count, smem_per_block
from onekernel.exec.megakernel import MegakernelRunner
from onekernel.models.decode_graph import build_decode_step
from onekernel.ops.tiling import Tiling
from onekernel.runtime.runners import check_mode

ALIGN = 16
BACKENDS = ("auto", "gluon", "triton")
# The backend when none is given: "auto" (the streaming kernel for Llama-family bf16 steps). Run 8 (two H200s,
# 093e3f3): scripts/tp_check.py --modes megakernel-gluon on Llama-3.2-1B batch 1 matched TP=1 (relative error 3.3%,
# 8/8 greedy tokens; the forced timeout named the peer rank); bench --tp 2: Llama-3.1-8B batch 1 3.143 ms
# (the Triton backend 4.911, graph 3.515), its logits within 4.9% of the PyTorch TP reference.
DEFAULT_BACKEND = "auto"
TRITON_ONLY = ("spin_limit", "policy", "events", "prefetch", "schedule", "num_warps", "comm_workers")
GLUON_ONLY = ("wait_ms",)
# Polls before a remote wait gives up in the interpreter: a peer process may be a whole layer of interpreted
# tiles behind (seconds); on a GPU the megakernel's default (2**26 polls) holds.
INTERPRET_SPIN_LIMIT = 1 << 21


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pool_layout(graph, min_counters: int = 0, push_ranks: int = 0) -> tuple[int, int, dict[str, int]]:
    """(pool bytes, counter entries, {buffer name: byte offset}) of a tensor-parallel graph: the event counters
    (one int32 per task, or ``min_counters``: the streaming kernel's re-tiled graph may have more tasks,
    ``stream_plan.task_bound``) first, then every buffer that a peer buffer mirrors, in graph order, each 16-byte
    aligned. The same on every rank (identical graphs). ``push_ranks`` = n >= 2 (the push all-reduce): the counters
    n + 1 times over (this rank's, then a receive copy per sending rank: ``exec.persistent.push_counters``) and
    each mirrored buffer n times, slot r holding rank r's partial (``push_slot``); the counter entries returned
    are still one set's. ValueError for a push_ranks that is not 0 or an int >= 2 (a bool is not a rank count)."""
    if isinstance(push_ranks, bool) or not isinstance(push_ranks, int) or push_ranks == 1 or push_ranks < 0:
        raise ValueError(f"pool_layout: push_ranks must be 0 (pull) or the number of ranks >= 2, got {push_ranks!r}")
    n_counters = max(len(graph.tasks), min_counters, 1)
    off = _align(4 * n_counters * (1 + push_ranks))
    sources = {src for _, src in (graph.meta.get("peers") or {}).values()}
    offsets = {}
    for name, b in graph.buffers.items():
        if name in sources:
            offsets[name] = off
            off += _align(b.nbytes) * max(push_ranks, 1)
    return off, n_counters, offsets


def push_slot(offsets: dict, buffers: dict, name: str, rank: int) -> int:
    """Byte offset of rank ``rank``'s partial of mirrored buffer ``name`` in a push pool (``pool_layout``)."""
    return offsets[name] + rank * _align(buffers[name].nbytes)


def bind_pools(graph, tensors: dict, pools: list, rank: int, offsets: dict, n_counters: int,
               push: bool = False) -> list[torch.Tensor]:
    """Point ``tensors`` (the bound step's) of a tensor-parallel ``graph`` into the pools (``pool_layout``'s
    ``offsets`` and ``n_counters``; every rank's pool uint8, rank order) and return every rank's counters int32
    (1 set, push: n + 1 sets). This rank's counters are zeroed and its mirrored buffers poisoned (NaN: a missed
    write or push shows). Pull: a mirrored buffer lives in its rank's pool and ``peer{p}.X`` is rank p's own
    ``X`` (read over NVLink). Push: every pool holds a slot per rank for each mirrored buffer (``push_slot``);
    ``X`` is this rank's slot in its own pool and ``peer{p}.X`` slot p in its own pool, which rank p's producers
    fill (the same offset in every pool: ``exec.persistent.push_counters``' element offsets)."""
    n = len(pools)
    own = pools[rank]
    n_cnt = n_counters * (1 + n) if push else n_counters
    last = max((push_slot(offsets, graph.buffers, k, n - 1 if push else 0) + graph.buffers[k].nbytes
                for k in offsets), default=0)
    if _align(4 * n_cnt) > min(offsets.values(), default=_align(4 * n_cnt)) or any(p.numel() < last for p in pools):
        raise ValueError(f"bind_pools: the layout does not hold {'push' if push else 'pull'} slots for {n} ranks "
                         f"(pool_layout(push_ranks={n if push else 0}) makes one that does)")
    own[:_align(4 * n_cnt)].zero_()

    def view(pool, off, b):
        return pool[off:off + b.nbytes].view(b.dtype).view(b.shape)

    for src, off in offsets.items():
        b = graph.buffers[src]
        for r in (range(n) if push else ()):
            view(own, push_slot(offsets, graph.buffers, src, r), b).fill_(float("nan"))
        tensors[src] = view(own, push_slot(offsets, graph.buffers, src, rank), b) if push else view(own, off, b)
        tensors[src].fill_(float("nan"))
    for name, (p, src) in graph.meta["peers"].items():
        b = graph.buffers[name]
        tensors[name] = (view(own, push_slot(offsets, graph.buffers, src, p), b) if push
                         else view(pools[p], offsets[src], b))
    return [p[:4 * n_cnt].view(torch.int32) for p in pools]


def shared_pools(n_ranks: int, nbytes: int) -> list[torch.Tensor]:
    """``n_ranks`` zeroed CPU pools uint8 [nbytes] in shared memory (``share_memory_``): made in a parent process
    and passed to every rank process (torch.multiprocessing), each rank maps every pool at its own address, as
    symmetric memory maps the peers' GPU memory. For the Triton interpreter (tests)."""
    return [torch.zeros(nbytes, dtype=torch.uint8).share_memory_() for _ in range(n_ranks)]


def cuda_pools(nbytes: int, device) -> list[torch.Tensor]:
    """Every rank's pool uint8 [nbytes] as mapped on this rank's GPU: ``symm_mem.empty`` + ``rendezvous`` on the
    default group (a collective: every rank calls it, in the same order), then ``get_buffer`` per rank."""
    import warnings

    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    with warnings.catch_warnings():  # deprecated (a no-op) in recent torch, needed by older ones
        warnings.simplefilter("ignore")
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group)
    own = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(own, group)
    pools = [own if p == dist.get_rank() else handle.get_buffer(p, (nbytes,), torch.uint8, 0)
             for p in range(dist.get_world_size())]
    pools.append(handle)  # kept alive with the pools (dropped by the caller from the list of ranks)
    return pools


def _padded(weights: dict, name: str, rows: int) -> torch.Tensor:
    w = weights[name]
    if w.shape[0] == rows:
        return w
    return torch.cat([w, w.new_zeros(rows - w.shape[0], *w.shape[1:])])


def resolve_pools(pools, nbytes: int, n: int, dev) -> tuple[list, object]:
    """(every rank's pool uint8 [>= nbytes], the symmetric-memory handle to keep alive or None) from ``pools``: a
    list (``shared_pools``), a callable ``pools(nbytes, device)`` (ranks as threads: ``dist.threads.PoolFactory``)
    or None (GPUs: ``cuda_pools``, a collective). InputError for None off a GPU and for pools of the wrong count,
    dtype or size."""
    handle = None
    if callable(pools):  # ranks as threads of one process (dist.threads): every rank gets the same pools
        pools = list(pools(nbytes, dev))
    if pools is None:
        if dev.type != "cuda":
            raise InputError("the tensor-parallel pools off a GPU must be given (pools=: every rank's pool in shared "
                             "CPU memory: onekernel.dist.tp_megakernel.shared_pools, made before the ranks start)")
        pools = cuda_pools(nbytes, dev)
        handle = pools.pop()
    if len(pools) != n or any(p.dtype != torch.uint8 or p.numel() < nbytes for p in pools):
        raise InputError(f"pools must be {n} uint8 tensors of at least {nbytes} bytes (one per rank), got "
                         f"{[(tuple(p.shape), p.dtype) for p in pools]}")
    return pools, handle


def tp_step(model, cache, group, *, tiles: str, n_sm: int | None, ar_tiles: int | None, gemv: str | None):
    """The rank's bound tensor-parallel step (``build_decode_step(tp=(rank, n))``: all-reduce ops after embed,
    o_proj and down; every GEMV adds ``residual.zero``, the all-reduce the residual stream) over ``model`` (its
    ShardedModel) and ``cache``, the vocabulary padded to rank 0's range (module doc), tiled for ``n_sm`` SMs (None:
    the device's) with ``tiles``, on the ``gemv`` path (None: ``rank_gemv``'s). Identical graphs on every rank."""
    dev = cache.k.device
    shard = group.shard
    n, rank = shard.tp, shard.rank
    V = group.config.vocab_size
    v_pad = vocab_range(V, n, 0)[1] - vocab_range(V, n, 0)[0]  # rank 0's range is the longest
    cfg = dataclasses.replace(model.config, vocab_size=v_pad)
    weights = dict(model.weights)
    for name in ("tok_embeddings", "lm_head"):
        if name in weights:
            weights[name] = _padded(weights, name, v_pad)
    tiling = Tiling(sm_count(dev) if n_sm is None else n_sm, tiles, smem_per_block(dev))
    return build_decode_step(cfg, weights, cache, tiling=tiling, tp=(rank, n), ar_tiles=ar_tiles,
                             gemv=rank_gemv(group, cache.k.dtype, gemv))


def logits_gather(bound, group):
    """(logits float32 [B, V] NaN, next_tokens int32 [B] -1, gather): ``gather(ran=True)`` fills them from the
    rank's logits of a ``tp_step`` (its own rows, padding dropped) with the group's logits gather and distributed
    argmax (the kernel's own argmax where no row was padded and the kernel ran)."""
    t, dev, B = bound.tensors, bound.device, bound.batch
    V, v_local = group.config.vocab_size, group.shard.config.vocab_size
    logits = torch.full((B, V), float("nan"), dtype=torch.float32, device=dev)
    next_tokens = torch.full((B,), -1, dtype=torch.int32, device=dev)
    local, local_ids = t[bound.logits], t[bound.next_tokens]
    exact = local.shape[1] == v_local  # no padded rows: the kernel's own argmax is the rank's

    def gather(ran: bool = True) -> None:  # the rank's logits -> the whole logits and greedy tokens (every rank)
        lg = local[:, :v_local]
        logits.copy_(group.gather_logits(lg))
        next_tokens.copy_(group.argmax(lg, local_ids if exact and ran else None))

    return logits, next_tokens, gather


class TPMegakernelRunner(TPRankRunner):
    """One rank's megakernel runner over ``model`` (its ShardedModel) and ``cache`` (a KVCache of its local
    config), with the collectives of ``group`` (a TPGroup). Same interface as ``dist.tp_kernels.TPKernelRunner``:
    ``step(tokens int32 [B], global ids, the same on every rank) -> (logits float32 [B, V] (every rank's rows),
    next_tokens int32 [B])``, both owned by the runner and overwritten by the next step; ``prefill(prompts) ->
    logits [B, V]``; ``check()`` / ``poll()`` (KernelTimeoutError naming task, op, event and, for a remote wait,
    the peer rank).

    Options: ``interpret`` (the Triton interpreter, one worker; needs ``pools``), ``pools`` (every rank's pool, a
    ``shared_pools`` list, or a callable ``pools(nbytes, device) -> that list`` called with the bytes this runner
    needs: ranks as threads of one process, ``dist.threads.PoolFactory``; default on GPUs: ``cuda_pools``, a
    collective), ``tiles`` / ``n_sm`` (as
    ``make_step_runner``; default "fit"), ``gemv`` ("fma" | "mma" | None: the unsharded model's default,
    ``dist.tp_kernels.rank_gemv``; both backends run either path), ``ar_tiles`` (tiles per all-reduce op:
    ``decode_graph``), ``spin_limit`` (polls before a wait gives up; interpreter default INTERPRET_SPIN_LIMIT),
    ``backend`` ("auto" | "gluon" | "triton", default DEFAULT_BACKEND: module doc) and the chosen megakernel's own
    options (``exec.megakernel.MegakernelRunner``: ``spin_limit``, ``comm_workers`` (SM reservation), ...;
    ``exec.stream_runner.StreamMegakernelRunner``: ``wait_ms``; ``n_workers``, ``use_cuda_graph``,
    ``check_every``, ``profile`` both). ``push`` (bool, default False: the pull all-reduce; the streaming backend
    only): the push all-reduce (module doc). ``self.backend``: the one that runs; the GEMV path:
    ``self.bound.graph.meta["gemv"]``. Building it is collective (the pools' rendezvous, the fingerprint
    comparison). Raises InputError (pools missing or too small, an unknown backend or gemv path, "gluon" where it
    cannot run, an option of the other backend, ``push`` where the Triton kernel runs), ScheduleError (the ranks built different schedules, or the
    cross-step check failed), DeviceError (no GPU and not ``interpret``), RankError from a collective."""

    mode = "megakernel"

    def __init__(self, model, cache, group, *, interpret: bool = False, pools: list | None = None,
                 tiles: str | None = None, n_sm: int | None = None, spin_limit: int | None = None,
                 ar_tiles: int | None = None, gemv: str | None = None, **options):
        dev = cache.k.device
        check_mode("megakernel", dev, interpret)
        backend = options.pop("backend", None) or DEFAULT_BACKEND
        if backend not in BACKENDS:
            raise InputError(f"unknown megakernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if backend == "gluon" and (interpret or dev.type != "cuda"):
            raise InputError("backend='gluon' runs on Hopper GPUs only, not in the Triton interpreter")
        if options.pop("allreduce", None) not in (None, "megakernel"):
            raise InputError("--allreduce applies to the kernel modes eager, graph and pdl; the megakernel's "
                             "all-reduce is its own tile tasks")
        push = options.pop("push", False)
        if not isinstance(push, bool):
            raise InputError(f"push must be True (the push all-reduce) or False (pull), got {push!r}")
        self.model, self.cache, self.group = model, cache, group
        shard = group.shard
        n, rank = shard.tp, shard.rank
        self.bound = bound = tp_step(model, cache, group, tiles=tiles or "fit", n_sm=n_sm, ar_tiles=ar_tiles,
                                     gemv=gemv)
        g = bound.graph
        n_workers = options.get("n_workers") or (1 if interpret else sm_count(dev))
        self.backend = self._pick(backend, bound, interpret or dev.type != "cuda", options, spin_limit, n_workers)
        self.push = push
        if push and self.backend != "gluon":
            raise InputError("push=True (the push all-reduce) runs in the streaming (Gluon) megakernel only; this "
                             "step runs the Triton one (backend='gluon' says why not)")
        from onekernel.exec.stream_plan import task_bound
        # the streaming plan's re-tiled graph may have more tasks (events); pools large enough for it also serve a
        # fall back to the Triton kernel
        nbytes, n_counters, offsets = pool_layout(g, task_bound(g, n_workers) if self.backend == "gluon" else 0,
                                                  n if push else 0)
        pools, self._handle = resolve_pools(pools, nbytes, n, dev)
        self.pools = pools
        counters = bind_pools(g, bound.tensors, pools, rank, offsets, n_counters, push)

        self.logits, self.next_tokens, gather = logits_gather(bound, group)
        self._gather = gather
        if interpret and spin_limit is None:
            spin_limit = INTERPRET_SPIN_LIMIT
        self.runner = None
        if self.backend == "gluon":
            self.runner = self._stream_runner(bound, backend, rank, counters, gather, dict(options, push=push))
        if self.runner is None:
            if push:
                raise InputError("push=True (the push all-reduce) needs the streaming (Gluon) megakernel, which did "
                                 "not build here (backend='gluon' raises its error)")
            self.backend = "triton"
            self.runner = MegakernelRunner(bound, interpret=interpret, rank=rank, counters=counters, after=gather,
                                           spin_limit=spin_limit,
                                           **{k: v for k, v in options.items() if k not in GLUON_ONLY})
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # counters zeroed, partials poisoned before any peer can launch

        # PersistentRunner.rewind: every rank's step done, then every rank's rewind (no reference to self: no cycle)
        self.runner._rank_barrier = functools.partial(rank_barrier, group, dev)
        fp = torch.tensor([self.runner.fingerprint()], dtype=torch.int64, device=dev)
        every = [int(x) for x in group._gather(fp)]
        if len(set(every)) != 1:
            raise ScheduleError(f"rank {rank}: the ranks built different megakernel schedules or events (fingerprints "
                                f"{every}); every rank must build the same graph (same shapes, tiling, workers)")
        self.steps = 0

    @staticmethod
    def _pick(backend: str, bound, off_gpu: bool, options: dict, spin_limit, n_workers: int) -> str:
        """"gluon" or "triton" for ``backend`` (module doc); InputError for "gluon" where it cannot run or with a
        Triton-only option, and for a "triton" run given a Gluon-only option. ``profile`` (in ``options``) does not
        choose: both kernels stamp every task with its local and remote waits apart (``profile.tp_trace``)."""
        triton_opts = sorted(k for k in TRITON_ONLY if options.get(k) is not None or (k == "spin_limit" and spin_limit))
        gluon_opts = sorted(k for k in GLUON_ONLY if k in options)
        if backend == "triton" or off_gpu:
            if gluon_opts:
                raise InputError(f"option(s) {', '.join(gluon_opts)} belong to the streaming megakernel "
                                 "(backend='gluon'), not the Triton one")
            return "triton"
        from onekernel.exec.stream_support import prefer_stream, unsupported
        why = unsupported(bound)
        if backend == "gluon":
            if triton_opts:
                why = f"option(s) {', '.join(triton_opts)} belong to the Triton megakernel"
            if why:
                raise InputError(f"the streaming (Gluon) megakernel cannot run this step: {why}; use backend='triton'")
            return "gluon"
        if why or triton_opts or not prefer_stream(bound.graph, n_workers):  # profile=True: either backend stamps
            if gluon_opts:
                raise InputError(f"option(s) {', '.join(gluon_opts)} belong to the streaming megakernel, which 'auto' "
                                 f"did not pick here ({why or 'Triton options given or a model too small'})")
            return "triton"
        return "gluon"

    @staticmethod
    def _stream_runner(bound, backend: str, rank: int, counters, gather, options: dict):
        """The streaming runner, or None when "auto" must fall back (it did not build: logged)."""
        from onekernel.errors import OneKernelError
        from onekernel.exec.stream_runner import StreamMegakernelRunner

        kw = {k: v for k, v in options.items() if k not in TRITON_ONLY}
        try:
            return StreamMegakernelRunner(bound, rank=rank, counters=counters, after=gather, **kw)
        except Exception as e:  # noqa: BLE001 - "auto": a compile error of any kind costs the streaming kernel only
            if backend == "gluon" or isinstance(e, OneKernelError):
                raise
            import logging
            logging.getLogger("onekernel").warning(
                "the streaming megakernel did not build at TP > 1 (%s: %.200s); running the Triton megakernel "
                "instead (backend='gluon' raises the error)", type(e).__name__, e)
            return None

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gathered_step(tokens)
