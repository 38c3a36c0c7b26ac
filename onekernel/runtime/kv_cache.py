"""Static KV cache shared by every executor (docs/DESIGN.md, "KV cache and the step").

Layout (gpt-fast style, one tensor for all layers so kernels index it with a layer stride):
    k, v:      [n_layers, B, Hkv, S, head_dim]  in the model dtype
    seq_lens:  int32 [B]  tokens already in the cache per sequence = position of the next token

A decode step writes K/V at position ``seq_lens[b]`` and attends over ``[0, seq_lens[b]]`` inclusive; the
generation loop then does ``seq_lens += 1`` on the device.
"""
from __future__ import annotations

import torch

from onekernel.errors import DeviceError, InputError
from onekernel.models.config import ModelConfig
from onekernel.models.load import as_device
from onekernel.runtime.args import check_int

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class KVCache:
    """Preallocated K/V for ``batch`` sequences of up to ``max_seq_len`` tokens.

    Args:
        cfg: a ``ModelConfig`` (uses n_layers, n_kv_heads, head_dim).
        batch: number of sequences B (an int >= 1).
        max_seq_len: S, tokens per sequence the cache can hold (an int >= 1).
        dtype: dtype of k and v (the model dtype: torch.float32, float16 or bfloat16).
        device: torch device for all tensors ("cpu", "cuda" or "cuda:N").
    Raises:
        InputError: an argument of the wrong kind, or batch or max_seq_len < 1.
        DeviceError: a CUDA device without a CUDA GPU (or a torch built without CUDA), or a cache larger than the
            device's free memory (the message gives its size).
    """

    def __init__(self, cfg, batch: int, max_seq_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        if not isinstance(cfg, ModelConfig):
            raise InputError(f"cfg must be a ModelConfig (model.config, or models.config.get_config(name)), got "
                             f"{type(cfg).__name__} {cfg!r:.40}")
        check_int("batch", batch)
        check_int("max_seq_len", max_seq_len)
        if not isinstance(dtype, torch.dtype) or dtype not in DTYPES:
            raise InputError(f"dtype must be a torch.dtype, one of {', '.join(map(str, DTYPES))}; got {dtype!r:.40}")
        device = as_device("device", device)
        if batch < 1 or max_seq_len < 1:
            raise InputError(f"KV cache needs batch >= 1 and max_seq_len >= 1, got batch={batch}, "
                             f"max_seq_len={max_seq_len}")
        self.cfg = cfg
        self.batch = batch
        self.max_seq_len = max_seq_len
        self.dtype = dtype
        self.device = torch.device(device)
        self.shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_seq_len, cfg.head_dim)
        self.parent = None  # the whole cache, for a view made by ``slots``
        self._allocate()

    def _allocate(self) -> None:
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise DeviceError(f"the KV cache was asked for on {self.device}, but no CUDA GPU is available (or this "
                              f"torch was built without CUDA); use device='cpu'")
        gib = 2 * torch.Size(self.shape).numel() * torch.empty((), dtype=self.dtype).element_size() / 2 ** 30
        try:
            self.k = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
            self.v = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if isinstance(e, torch.OutOfMemoryError) or "memory" in str(e):
                self.k = self.v = None
                raise DeviceError(f"a KV cache of {self.batch} sequences x {self.max_seq_len} positions needs "
                                  f"{gib:.1f} GiB on {self.device}, more than is free; use a smaller batch or "
                                  f"max_seq_len (--max-seq-len)") from None
            raise
        self.seq_lens = torch.zeros(self.batch, dtype=torch.int32, device=self.device)

    def slots(self, start: int, stop: int) -> "KVCache":
        """A KVCache over slots ``start..stop-1`` of this one, sharing its memory (``k[:, start:stop]``,
        ``v[:, start:stop]``, ``seq_lens[start:stop]``; each layer's ``[stop - start, Hkv, S, hd]`` slice is
        contiguous), so a runner or ``reference.prefill`` built over the view reads and writes these slots
        only. Raises InputError unless ``0 <= start < stop <= batch``. ``reallocate`` is refused on a view."""
        check_int("start", start)
        check_int("stop", stop)
        if not 0 <= start < stop <= self.batch:
            raise InputError(f"slots({start}, {stop}) is outside the cache's {self.batch} slots; need "
                             f"0 <= start < stop <= {self.batch}")
        view = object.__new__(KVCache)
        view.__dict__.update(self.__dict__)
        view.batch, view.shape = stop - start, (*self.shape[:1], stop - start, *self.shape[2:])
        view.k, view.v, view.seq_lens = self.k[:, start:stop], self.v[:, start:stop], self.seq_lens[start:stop]
        view.parent = self
        return view

    def reset(self) -> None:
        """Empty the cache in place (same addresses, so captured CUDA graphs stay valid)."""
        self.k.zero_()
        self.v.zero_()
        self.seq_lens.zero_()

    def reallocate(self) -> None:
        """Allocate fresh, zeroed k, v and seq_lens at new addresses (the old tensors are kept alive until
        replaced, so the new ones cannot reuse their memory). Any captured graph must be re-captured.
        Raises InputError on a view (``slots``): its memory belongs to the whole cache."""
        if getattr(self, "parent", None) is not None:
            raise InputError("reallocate() was called on a view of a KV cache (KVCache.slots); reallocate the "
                             "whole cache and take the view again")
        old = (self.k, self.v, self.seq_lens)
        self._allocate()
        del old

    def nbytes(self) -> int:
        """Bytes held by k and v."""
        return self.k.numel() * self.k.element_size() * 2

    def __repr__(self) -> str:
        return f"KVCache(shape={self.shape}, dtype={self.dtype}, device={self.device})"
