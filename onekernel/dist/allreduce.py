"""The all-reduce a tensor-parallel kernel step runs after its row-parallel GEMVs: how a rank's partial sums
[B, D] become the sum over the ranks, in place.

* ``"nccl"``: ``torch.distributed.all_reduce`` on the group (NCCL on GPUs, gloo on the CPU); captured in a CUDA
  graph by the graph and pdl modes. Faults: the group's timeout (``process.timeout_s``), RankError.
* ``"symm"``: PyTorch symmetric memory's one-shot all-reduce (``torch.distributed._symmetric_memory``; kernel
  ``one_shot_all_reduce_kernel`` in torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu): one kernel
  copies the partial sums into this rank's symmetric buffer, meets the peers at a barrier of per-block signals,
  reads every rank's buffer over NVLink and sums them, then meets them again (so the buffer can be reused by the
  next all-reduce at once). One buffer [B, D] per runner, allocated and rendezvoused (a collective) when the
  runner is built. CUDA only, float32 or bfloat16 (the kernel's types). A dead peer leaves its barrier spinning:
  the launcher (``process.launch``) stops the ranks after one fails; torchrun's ranks are stopped by torchrun.
* ``"oneshot"``: onekernel's own one-shot all-reduce, a per-op kernel of the step (``dist.tp_oneshot``): the
  GEMVs write their partials straight into symmetric memory, each all-reduce tile meets its peers' same tile at a
  flag barrier, then reads and sums their rows; it joins the PDL chain and the CUDA graph. CUDA GPUs from the CLI;
  the runner also runs in the Triton interpreter when given pools (tests).
"""
from __future__ import annotations

import torch

from onekernel.errors import InputError

ALLREDUCES = ("nccl", "symm", "oneshot")
SYMM_DTYPES = (torch.float32, torch.bfloat16)
GPU_ONLY = {"symm": "PyTorch symmetric memory maps the peers' GPU memory",
            "oneshot": "its kernels read the peers' GPU memory"}  # kind -> why it needs CUDA GPUs


def check_allreduce(kind: str, device, dtype: torch.dtype | None = None) -> str:
    """``kind`` if it can run on ``device`` (and ``dtype`` when given); call it before anything loads. Raises
    InputError for an unknown kind, for "symm" or "oneshot" off a CUDA device ("--allreduce symm needs CUDA GPUs") or for a
    dtype symmetric memory's one-shot kernel does not reduce."""
    if kind not in ALLREDUCES:
        raise InputError(f"unknown all-reduce {kind!r} (--allreduce); choose one of {', '.join(ALLREDUCES)}")
    if kind in GPU_ONLY and torch.device(device).type != "cuda":
        raise InputError(f"--allreduce {kind} needs CUDA GPUs ({GPU_ONLY[kind]}); on the CPU use --allreduce nccl "
                         "(gloo's all-reduce there)")
    if kind == "symm" and dtype is not None and dtype not in SYMM_DTYPES:
        raise InputError(f"--allreduce symm reduces float32 or bfloat16 (symmetric memory's one-shot kernel), not "
                         f"{dtype}; use --allreduce nccl or --dtype bf16")
    return kind


class SymmAllReduce:
    """``self(x)``: x [B, D] (``shape``, ``dtype``, contiguous, on ``device``) summed over the default group's
    ranks in place, by ``symm_mem.one_shot_all_reduce_copy_out(buffer, x, "sum", group, out=x)``. Building it is
    a collective (every rank builds one, in the same order). Raises as ``check_allreduce``."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device):
        import warnings

        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        check_allreduce("symm", device, dtype)
        self.group = dist.group.WORLD.group_name
        with warnings.catch_warnings():  # deprecated (a no-op) in recent torch, needed by older ones
            warnings.simplefilter("ignore")
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(self.group)
        self.shape = tuple(shape)
        self.buffer = symm_mem.empty(self.shape, dtype=dtype, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, self.group)
        self.op = torch.ops.symm_mem.one_shot_all_reduce_copy_out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape) != self.shape or x.dtype != self.buffer.dtype:
            raise InputError(f"symmetric all-reduce of a {tuple(x.shape)} {x.dtype} tensor; it was built for "
                             f"{self.shape} {self.buffer.dtype}")
        self.op(self.buffer, x, "sum", self.group, x)  # each element is copied, then reduced, by one thread
        return x
