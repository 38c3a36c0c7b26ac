"""Batch buckets: one KV cache of ``max_batch`` slots and one decode-step runner per bucket size, each over the
cache's first ``n`` slots (``KVCache.slots(0, n)``), so a step runs at the smallest bucket that holds the live
slots (what the server's continuous batching does; issue 12 item 4 for ``generate``).

Bucket sizes are the powers of two 1, 2, 4, 8, 16 below ``max_batch``, then ``max_batch`` itself (captured
CUDA graphs and compiled kernels exist only for these sizes). Runners are built on first use (``runner(n)``)
or all at once by ``warm``.
"""
from __future__ import annotations

from typing import Callable

import torch

from onekernel.errors import InputError
from onekernel.ops.tiling import MAX_BATCH
from onekernel.runtime.args import check_int
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """The bucket sizes for ``max_batch`` (1..MAX_BATCH, else InputError): powers of two below it, then it."""
    check_int("max_batch (--max-batch)", max_batch)
    if not 1 <= max_batch <= MAX_BATCH:
        raise InputError(f"max_batch (--max-batch) must be between 1 and {MAX_BATCH}, got {max_batch}")
    return tuple(b for b in (1, 2, 4, 8, 16) if b < max_batch) + (max_batch,)


def bucket_for(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest of ``sizes`` that is >= n (n >= 1); InputError when none is."""
    for b in sizes:
        if b >= n:
            return b
    raise InputError(f"{n} slots do not fit the largest batch bucket {sizes[-1]}")


class BucketRunners:
    """A KVCache of ``max_batch`` slots (``cache``: [L, max_batch, Hkv, max_seq_len, hd] in the model's dtype, on
    its device) and a runner of ``mode`` per bucket size over its first n slots.

    ``runner(n)`` -> the StepRunner of bucket n (built on first use; ``step(tokens int32 [n])`` reads and writes
    slots 0..n-1 only). Raises (when built) what ``runtime.runners.make_step_runner`` raises; InputError for a
    max_batch outside 1..MAX_BATCH or an n that is not a bucket size."""

    def __init__(self, mode: str, model, max_batch: int, max_seq_len: int, *, interpret: bool = False,
                 **options):
        self.sizes = bucket_sizes(max_batch)
        w = model.weights["tok_embeddings"]
        self.cache = KVCache(model.config, max_batch, max_seq_len, w.dtype, w.device)
        self.mode, self.model, self.interpret, self.options = mode, model, interpret, options
        self._runners: dict[int, object] = {}

    def size_for(self, n: int) -> int:
        """The bucket that holds slots 0..n-1."""
        return bucket_for(n, self.sizes)

    def runner(self, n: int):
        if n not in self.sizes:
            raise InputError(f"{n} is not a batch bucket; the buckets are {self.sizes}")
        if n not in self._runners:
            self._runners[n] = make_step_runner(self.mode, self.model, self.cache.slots(0, n),
                                                interpret=self.interpret, **self.options)
        return self._runners[n]

    def warm(self, on_bucket: Callable[[int, int, int], None] | None = None) -> None:
        """Build every bucket's runner and run one step of it (compiles the kernels, captures the graphs), then
        empty the cache. ``on_bucket(i, count, n)`` is called before bucket n (the i-th of count) is warmed."""
        for i, n in enumerate(self.sizes):
            if on_bucket is not None:
                on_bucket(i, len(self.sizes), n)
            r = self.runner(n)
            r.step(torch.zeros(n, dtype=torch.int32, device=self.cache.device))
            r.check()
        self.cache.reset()
