"""The kernel modes (eager, graph, pdl) at tensor-parallel size > 1 with onekernel's own one-shot all-reduce
(``--allreduce oneshot``): the all-reduces are per-op kernels of the step like every other op, so they join the PDL
chain and the CUDA graph, and nothing is copied in or out.

The rank's step is the megakernel's tensor-parallel graph (``tp_megakernel.tp_step``: all-reduce ops after embed,
o_proj and down; every GEMV adds ``residual.zero``, the all-reduce the residual stream once; the vocabulary padded
to rank 0's range) with each all-reduce op turned into ``ops.allreduce.ALLREDUCE_ONESHOT``: a tile first posts its
run count into each peer's flag for that tile and polls its own flags until every peer has posted the same count,
then reads the peers' partial rows where they are and sums them in rank order, rounding once, so every rank gets
the same bits, the megakernel's. The producers (embed, o_proj, down) write their partials straight into this
rank's symmetric pool (``tp_megakernel.bind_pools``, pull layout), where the peers read them.

Why a tile's barrier is enough (per tile, no grid-wide wait): a tile runs only after its rank's previous kernels
finished (stream order; with PDL the per-op kernel's ``griddepcontrol.wait`` precedes the body), so a peer's
flag at count m says that peer's partials of its m-th run of the op are complete. Cross-step safety is the
megakernel's argument (``tp_megakernel``'s module doc) with kernels for tasks: a rank overwrites a partial in its
run m + 1 only after its all-reduce of the next layer's (or the next step's embed) run m + 1 passed its barrier,
which needs every peer to have launched that later kernel, so to have finished every kernel before it, the
readers of the partial's run m included. Counts never reset: one int32 per tile counts runs, 2^31 of them.

Faults: a poll gives up after ``spin_limit`` polls (default SPIN_LIMIT on GPUs, INTERPRET_SPIN_LIMIT in the
interpreter) and records (5, tile, op ordinal, seen, expected, peer); ``check()`` / ``poll()`` raise
KernelTimeoutError naming the op, tile and peer rank. A dead peer is handled by the launcher stopping the ranks.
"""
from __future__ import annotations

import torch

from onekernel.dist.tp_kernels import KERNEL_MODES, TPRankRunner, rank_barrier
from onekernel.dist.tp_megakernel import (INTERPRET_SPIN_LIMIT, bind_pools, logits_gather, pool_layout, resolve_pools,
                                          tp_step)
from onekernel.errors import InputError, KernelTimeoutError, ScheduleError
from onekernel.exec import DEFAULT_TILING, make_runner
from onekernel.exec.persistent import peer_counters
from onekernel.ops.allreduce import ALLREDUCE, ALLREDUCE_ONESHOT
from onekernel.runtime.runners import check_mode

# Polls before a barrier gives up on a GPU (one acquire read-modify-write on local memory each, ~0.3-1 us: about
# 1-4 s; the kernels are compiled and loaded when the runner is built, so ranks in step are never that far apart)
SPIN_LIMIT = 1 << 22


def oneshot_ops(graph, rank: int, spin: int) -> int:
    """Turn every all-reduce op of ``graph`` into ALLREDUCE_ONESHOT in place, declaring its buffers (``{op}.flags``
    int32 [tiles x N], ``{op}.mine`` int32 [tiles + 1], and the shared ``oneshot.pdelta`` int64 [N + 1]: the peers'
    flag offsets, then ``rank``, and ``oneshot.err`` int32 [8]); returns the flag entries all ops need (their regions
    follow each other in graph order). The same graph on every rank (the rank is data, not a constant), so every
    rank runs the same compiled kernels. Raises ValueError for a rank outside 0..N-1."""
    total = 0
    ar = [op for op in graph.ops if op.kind is ALLREDUCE]
    if not ar:
        return 0
    n = ar[0].params["N"]
    if not 0 <= rank < n:
        raise ValueError(f"oneshot_ops: rank {rank} is outside 0..{n - 1} (the all-reduces have {n} partials)")
    graph.add_buffer("oneshot.pdelta", (n + 1,), torch.int64, "scratch")
    graph.add_buffer("oneshot.err", (8,), torch.int32, "scratch")
    for op in ar:
        flags = graph.add_buffer(f"{op.name}.flags", (op.n_tiles * n,), torch.int32, "scratch")
        mine = graph.add_buffer(f"{op.name}.mine", (op.n_tiles + 1,), torch.int32, "scratch")
        op.kind = ALLREDUCE_ONESHOT
        op.args = {**op.args, "flags": flags.name, "mine": mine.name, "pdelta": "oneshot.pdelta", "err": "oneshot.err"}
        op.params = {**op.params, "SPIN": spin}
        total += op.n_tiles * n
    return total


class TPOneShotRunner(TPRankRunner):
    """One rank's eager | graph | pdl runner with the one-shot all-reduce (module doc), over ``model`` (its
    ShardedModel) and ``cache`` (a KVCache of its local config), with the collectives of ``group`` (a TPGroup:
    the logits gather and distributed argmax after the LM head, a host call as in ``TPKernelRunner``).
    ``step(tokens int32 [B]) -> (logits float32 [B, V], next_tokens int32 [B])``, both owned by the runner;
    ``prefill``; ``check()`` / ``poll()`` raise KernelTimeoutError when a barrier gave up. Options: ``interpret``
    (the Triton interpreter; needs ``pools``), ``pools`` (as ``TPMegakernelRunner``: a list, a callable, or None
    on GPUs: symmetric memory, a collective), ``tiles`` / ``n_sm`` / ``gemv`` / ``ar_tiles`` (``tp_megakernel.tp_step``),
    ``spin_limit`` (polls before a barrier gives up), and the executor's own (``exec.kernels``). Building it is
    collective (the pools' rendezvous, a comparison of the ranks' all-reduce tiles). Raises InputError (not a kernel
    mode, pools missing or too small), ScheduleError (the ranks built other all-reduce tiles), DeviceError (no GPU
    and not ``interpret``), RankError from a collective."""

    def __init__(self, mode: str, model, cache, group, *, interpret: bool = False, pools=None,
                 tiles: str | None = None, n_sm: int | None = None, gemv: str | None = None,
                 ar_tiles: int | None = None, spin_limit: int | None = None, **options):
        if mode not in KERNEL_MODES:
            raise InputError(f"the one-shot all-reduce runs in the kernel modes {', '.join(KERNEL_MODES)}, not {mode!r}")
        dev = cache.k.device
        check_mode(mode, dev, interpret)
        self.mode, self.allreduce, self.model, self.cache, self.group = mode, "oneshot", model, cache, group
        n, rank = group.shard.tp, group.shard.rank
        spin = spin_limit or (INTERPRET_SPIN_LIMIT if interpret else SPIN_LIMIT)
        self.bound = bound = tp_step(model, cache, group, tiles=tiles or DEFAULT_TILING[mode], n_sm=n_sm,
                                     ar_tiles=ar_tiles, gemv=gemv)
        g, t = bound.graph, bound.tensors
        n_flags = oneshot_ops(g, rank, spin)
        nbytes, n_counters, offsets = pool_layout(g, n_flags)
        pools, self._handle = resolve_pools(pools, nbytes, n, dev)
        self.pools = pools
        counters = bind_pools(g, t, pools, rank, offsets, n_counters)
        own, pdelta = peer_counters(counters, rank, n_counters, dev)
        t["oneshot.pdelta"] = torch.cat([pdelta, torch.tensor([rank], dtype=torch.int64, device=dev)])
        t["oneshot.err"] = self.err = torch.zeros(8, dtype=torch.int32, device=dev)
        cuda = dev.type == "cuda"
        self._side = torch.cuda.Stream(dev) if cuda else None  # poll(): reads err beside the queued steps
        self._err_host = torch.zeros(8, dtype=torch.int32, pin_memory=cuda)
        self._failed = None
        off, self._ar = 0, []
        for i, op in enumerate(o for o in g.ops if o.kind is ALLREDUCE_ONESHOT):
            t[op.args["flags"]] = own[off:off + op.n_tiles * n]
            off += op.n_tiles * n
            mine = torch.zeros(op.n_tiles + 1, dtype=torch.int32, device=dev)
            mine[-1] = i  # the op's ordinal, for the error report
            t[op.args["mine"]] = mine
            self._ar.append(op.name)
        self.logits, self.next_tokens, gather = logits_gather(bound, group)
        self._gather = gather
        self.runner = make_runner(mode, bound, interpret=interpret, after={"lm_head.argmax": gather}, **options)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # flags zeroed, partials poisoned before any peer can post or read
        shape = torch.tensor([len(self._ar), n_flags], dtype=torch.int64, device=dev)
        every = [tuple(int(x) for x in s) for s in group._gather(shape)]  # also: no rank launches before all bound
        if len(set(every)) != 1:
            raise ScheduleError(f"rank {rank}: the ranks built different all-reduce tiles ((ops, flags) per rank "
                                f"{every}); every rank must build the same graph (same shapes and tiling)")
        self.load_kernels()  # a cold compile on one rank must not run its peers' first barriers out of polls
        self.steps = 0

    def load_kernels(self) -> None:
        """Compile and load every kernel of a step without meeting the peers: every op's kernel launched once
        (``launch_all``: on whatever the step's inputs hold) with the all-reduce barriers off (err[0] preset: no
        tile waits) and no logits gather, its outputs discarded (the KV rows it wrote at the current positions are
        rewritten by the next step), then the run counts, this rank's flags and the error word
        back to zero. Collective (two barriers: every rank's stray posts land before any rank clears its flags).
        The constructor calls it: a rank compiling its kernels (seconds, cold) while a peer's first all-reduce
        spins would run that peer out of polls; and where ranks share one device (dist.threads) loading a kernel's
        module waits for the device to drain, so a rank loading one while a peer's all-reduce spins on it stalls
        until the poll limit (run 38 call 382)."""
        dev = self.err.device
        after, self.runner.after = self.runner.after, {}
        self.err[0] = 7  # any non-zero word: the polls stop at once and record nothing
        try:  # every op's kernel once, as the mode launches them (PDL included), never captured in a CUDA graph
            self.runner.launch_all()
        finally:
            self.runner.after = after
        rank_barrier(self.group, dev)
        t = self.bound.tensors
        for op in self._ar:
            t[f"{op}.flags"].zero_()
            t[f"{op}.mine"][:-1].zero_()
        self.err.zero_()
        rank_barrier(self.group, dev)

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._failed:  # the barriers stop polling once one gave up: later steps would not meet the peers
            raise KernelTimeoutError(self._failed)
        return self._gathered_step(tokens)

    def _raise_if(self, err: list[int]) -> None:
        if err[0] == 5:
            _, tile, op, seen, want, peer = err[:6]
            name = self._ar[op] if 0 <= op < len(self._ar) else f"#{op}"
            self._failed = (
                f"{self.mode}: all-reduce {name} tile {tile} waited on peer rank {peer} and saw its run count {seen} "
                f"< {want} (this rank's) after the poll limit; rank {peer} did not reach that all-reduce (it died, "
                f"hangs, or ran fewer steps); this runner's all-reduce counts are inconsistent now: build a new one")
            raise KernelTimeoutError(self._failed)

    def check(self) -> None:
        """KernelTimeoutError when a barrier gave up (reads the error word: a sync), then the executor's check.
        After one, ``step`` refuses (KernelTimeoutError) until a new runner is built."""
        self._raise_if(self.err.tolist())
        self.runner.check()

    def poll(self) -> None:
        """As ``check`` for the steps that finished, without waiting for the ones queued: the error word is copied
        on a side stream into pinned memory (as ``exec.persistent.PersistentRunner.poll``)."""
        if self._side is None:
            return self.check()
        with torch.cuda.stream(self._side):
            self._err_host.copy_(self.err, non_blocking=True)
        self._side.synchronize()
        self._raise_if(self._err_host.tolist())
