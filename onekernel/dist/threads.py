"""Tensor-parallel ranks as threads of one process on one device (scripts/tp_one_gpu.py, tests/test_tp_threads.py).

Where only one GPU is at hand, the N ranks' persistent kernels can still run concurrently on it: each rank is a
Python thread with its own CUDA stream, and its megakernel gets SMs / N workers, so the N kernels are co-resident.
"Peer" memory is just the other ranks' tensors on the same device (one address space: the kernels' peer offsets
work unchanged). On the CPU the same runs in the Triton interpreter (one worker per rank).

* ``ThreadGroup``: a ``TPGroup`` whose collectives exchange tensors between the threads (a shared
  ``threading.Barrier`` and slots), so ``embed``, ``argmax``, ``gather_logits`` and the PyTorch prefill work;
* ``PoolFactory``: the ``pools=`` callable of ``TPMegakernelRunner`` (every rank's pool, allocated once);
* ``run_ranks``: runs ``fn(rank)`` in N threads, each under its own stream, and returns their results;
  ``warm_allocator``: cached device memory for a rank's stream before its first step;
* ``interpreter_threads``: makes the Triton interpreter's language patching safe for concurrent launches.
"""
from __future__ import annotations

import threading
from contextlib import nullcontext

import torch

from onekernel.dist.sharding import Shard
from onekernel.dist.tp_reference import TPGroup
from onekernel.errors import InputError, RankError

TIMEOUT_S = 120.0  # a rank waits this long at a collective for the others


class _Hub:
    """What the N ThreadGroups of one run share: the barrier and one exchange slot per rank."""

    def __init__(self, n: int, timeout: float):
        self.n, self.timeout = n, timeout
        self.barrier = threading.Barrier(n, timeout=timeout)
        self.slots: list = [None] * n


class ThreadGroup(TPGroup):
    """Rank ``shard.rank``'s collectives with the other threads of ``hub`` (make them with ``thread_groups``).
    Each collective: this rank's tensor copied into its slot, its current stream synchronised, a barrier, every
    slot read (on this rank's stream), the stream synchronised, a second barrier (so no slot is replaced before all
    ranks read it). ``all_reduce`` sums floating tensors in fp32 in rank order 0..N-1 and rounds once to x's dtype
    (the same ops on the same data on every rank: identical bits). Raises RankError naming this rank when the
    others do not arrive within the hub's timeout or a rank failed (``abort``)."""

    def __init__(self, shard: Shard, hub: _Hub, allreduce: str = "nccl"):  # no torch.distributed group needed
        self.shard, self.config, self.hub = shard, shard.full, hub
        self.allreduce, self.where = allreduce, "start-up"

    def _sync(self, x: torch.Tensor) -> None:
        if x.is_cuda:
            torch.cuda.current_stream(x.device).synchronize()

    def _wait(self, name: str) -> None:
        try:
            self.hub.barrier.wait()
        except threading.BrokenBarrierError:
            raise RankError(f"rank {self.shard.rank} of {self.shard.tp}: {name} at {self.where}: the other ranks did "
                            f"not arrive within {self.hub.timeout:g} s, or one of them failed") from None

    def barrier(self, name: str = "barrier") -> None:
        """Wait for every rank (no tensors; the caller synchronises its stream if it needs to). RankError as above."""
        self._wait(name)

    def _exchange(self, name: str, x: torch.Tensor, fn):
        self.hub.slots[self.shard.rank] = x.detach().clone()
        self._sync(x)
        self._wait(name)
        out = fn(list(self.hub.slots))
        self._sync(x)
        self._wait(name)
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks (in place; returned)."""
        def total(parts):
            acc = parts[0].to(torch.float32 if x.is_floating_point() else x.dtype, copy=True)  # never the slot
            for p in parts[1:]:
                acc += p
            return acc
        x.copy_(self._exchange("all_reduce", x, total))
        return x

    def _gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self._exchange("all_gather", x, lambda parts: [p.to(x.device, copy=True) for p in parts])


def thread_groups(shards: list[Shard], timeout: float = TIMEOUT_S) -> list[ThreadGroup]:
    """One ThreadGroup per shard (rank order 0..N-1, one TP size), sharing one hub."""
    hub = _Hub(len(shards), timeout)
    if [s.rank for s in shards] != list(range(len(shards))) or any(s.tp != len(shards) for s in shards):
        raise InputError(f"thread_groups needs the shards of ranks 0..{len(shards) - 1} of one TP size")
    return [ThreadGroup(s, hub) for s in shards]


class PoolFactory:
    """``pools(nbytes, device) -> list of n uint8 tensors [nbytes]``, zeroed, on ``device``: allocated by the first
    rank that asks (under a lock; its stream synchronised), the same list returned to every rank. InputError when
    ranks ask for different sizes or devices."""

    def __init__(self, n: int):
        self.n, self.pools, self.key = n, None, None
        self._lock = threading.Lock()

    def __call__(self, nbytes: int, device) -> list[torch.Tensor]:
        key = (int(nbytes), torch.device(device))
        with self._lock:
            if self.pools is None:
                self.pools = [torch.zeros(key[0], dtype=torch.uint8, device=key[1]) for _ in range(self.n)]
                if key[1].type == "cuda":
                    torch.cuda.current_stream(key[1]).synchronize()
                self.key = key
            elif key != self.key:
                raise InputError(f"a rank asked for pools of {key[0]} bytes on {key[1]}, another for {self.key[0]} "
                                 f"bytes on {self.key[1]}: the ranks built different graphs")
            return list(self.pools)


def run_ranks(n: int, fn, groups: list[ThreadGroup] | None = None, device=None) -> list:
    """``[fn(0), ..., fn(n-1)]``, each call in its own thread; on a CUDA ``device`` each under its own stream
    (``torch.cuda.stream``: the current stream is per thread). When a rank raises, the ``groups``' barrier is
    broken (the others' collectives raise RankError at once) and the first error that is not such a consequence
    is re-raised here (else the first); the groups cannot be used again then. Installs ``interpreter_threads``."""
    interpreter_threads()
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)  # what the caller queued (weights, states) is done before a rank reads it
    results, errors = [None] * n, [None] * n

    def body(r: int) -> None:
        cuda = dev is not None and dev.type == "cuda"
        try:
            with torch.cuda.stream(torch.cuda.Stream(dev)) if cuda else nullcontext():
                results[r] = fn(r)
                if cuda:
                    torch.cuda.current_stream(dev).synchronize()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors[r] = e
            if groups:
                groups[0].hub.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), name=f"tp-rank{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [e for e in errors if e is not None]
    if failed:
        raise next((e for e in failed if not isinstance(e, RankError)), failed[0])
    return results


def warm_allocator(device, small: int = 64, big_mb: int = 512) -> None:
    """Give the current stream cached device memory (``small`` 1 MB blocks and one of ``big_mb`` MB, allocated and
    freed) so the rank's steps allocate from PyTorch's cache, not with cudaMalloc: CUDA lists a device memory
    allocation issued between two kernels of different streams as a reason they may not run concurrently (CUDA
    programming guide, "Implicit Synchronization"), and a rank's megakernel spins until its peers' run. Call it in
    a rank's thread after building its runner, then a barrier before the first step. Nothing on the CPU."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.empty(1 << 20, dtype=torch.uint8, device=device) for _ in range(small)]
    blocks.append(torch.empty(big_mb << 20, dtype=torch.uint8, device=device))
    del blocks


_patch_state = {"lock": threading.Lock(), "active": 0, "scopes": [], "local": threading.local()}


def interpreter_threads() -> bool:
    """Make the Triton interpreter's launches safe in concurrent threads (once per process; True when installed).
    A launch (``GridExecutor.__call__``) patches ``triton.language`` with interpreter versions and restores the
    originals when it ends; a second thread's launch running meanwhile would then call unpatched functions (and its
    own restore would leave the first patch in place for good). Here each launch's own patch scope (the first patch
    in its thread after it starts; nested calls' patches are never restored, as in Triton) is kept and the restores
    are deferred until no launch runs, then done in reverse order of patching. Every patch binds the same
    interpreter builder, so re-patching during another launch changes nothing it computes. The builder's grid index
    is global too: concurrent kernels must have grid (1,) (one worker: TPMegakernelRunner's in the interpreter)."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    if getattr(interp, "_onekernel_threads", False):
        return True
    if not hasattr(interp, "_LangPatchScope") or not hasattr(interp, "_patch_lang"):
        return False
    st, patch_lang, grid_call = _patch_state, interp._patch_lang, interp.GridExecutor.__call__
    local = st["local"]

    class Deferred(interp._LangPatchScope):
        def restore(self) -> None:  # the launch's restore: done when the last launch ends (safe_grid_call)
            pass

    def safe_patch_lang(fn):
        scope = patch_lang(fn)
        if not getattr(local, "launch", False):
            return scope  # a nested call's patch (never restored)
        local.launch = False
        with st["lock"]:
            st["scopes"].append(scope)
        return Deferred()

    def safe_grid_call(self, *args, **kwargs):
        with st["lock"]:
            st["active"] += 1
        local.launch = True
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            local.launch = False
            with st["lock"]:
                st["active"] -= 1
                if st["active"] == 0:
                    while st["scopes"]:
                        st["scopes"].pop().restore()

    interp._patch_lang = safe_patch_lang
    interp.GridExecutor.__call__ = safe_grid_call
    interp._onekernel_threads = True
    return True
