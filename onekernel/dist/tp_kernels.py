"""The kernel modes (eager, graph, pdl) at tensor-parallel size > 1: a rank's decode step over its shard.

The rank's graph is ``models.decode_graph``'s for its local config (``Shard.config``: its q and KV heads, its
FFN rows, its vocabulary rows) on the unsharded model's GEMV path (``rank_gemv``: tensor cores for bf16 Llama
models, as at TP=1), run by the same executors (``exec.kernels``) with host calls after four kinds of
op (Megatron-LM, Shoeybi et al. 2019, sections 3 and 3.1; the same points as ``dist.tp_reference``):

    embed            the rank's tokens are ``tokens - vocab_start``; ``embed`` writes zeros for a token outside
                     [0, V_local), so the all-reduce of ``embed.out`` [B, D] is the whole embedding (exact)
    o_proj.{i}       h = x + attn @ wo^T with wo row-parallel: each rank's GEMV is a partial sum; rank 0 adds
    down.{i}         the residual, the others add zeros (``build_decode_step(residual=False)``), and the
                     all-reduce of the output [B, D] sums them: x + sum_r attn_r @ wo_r^T
    lm_head.argmax   logits [B, V_local] of the rank's rows -> the whole logits (all-gathered) and the greedy
                     tokens (distributed argmax of the kernels' local argmax: ``TPGroup.argmax``), copied
                     into the runner's own outputs

The all-reduce is ``dist.allreduce``'s: "nccl" (``torch.distributed.all_reduce``) or "symm" (symmetric memory's
one-shot kernel). In graph and pdl mode everything above (collectives included) is captured in the CUDA graph
with the kernels; a PDL chain breaks at each collective (the next kernel waits for it).

Numerics: with the residual added on one rank, h = round(round(x + round(p_0)) + round(p_1)) for 2 ranks (model
dtype rounding; fp32 on the CPU), against round(x + round(p_0 + p_1)) at TP=1: equal within the model dtype's
rounding. Tested in the Triton interpreter over gloo (tests/test_tp_kernels.py); on two GPUs by
scripts/tp_check.py.
"""
from __future__ import annotations

import torch

from onekernel.dist.allreduce import SymmAllReduce, check_allreduce
from onekernel.dist.process import fault_action, fault_point
from onekernel.errors import InputError
from onekernel.exec import DEFAULT_TILING, make_runner, sm_count, smem_per_block
from onekernel.models.decode_graph import build_decode_step, default_gemv
from onekernel.ops.tiling import Tiling
from onekernel.runtime.reference import prefill
from onekernel.runtime.runners import check_mode

KERNEL_MODES = ("eager", "graph", "pdl")


def rank_gemv(group, dtype: torch.dtype, gemv: str | None) -> str:
    """The GEMV path of a rank's decode step: ``gemv`` ("fma" | "mma"; another value is refused by the graph
    builder), or for None the unsharded model's default, ``default_gemv(group.config, dtype)``, so a model takes
    the same path at every TP size (it depends on the hidden size, which no rank shards); the one exception is the
    single-GPU megakernel of a model below that size, which runs the tensor cores where it streams
    (``runtime.runners.megakernel_step``) while its TP ranks keep the CUDA-core path. Every shard of a config
    that ``dist.sharding.check_tp`` and ``decode_graph.check_supported`` accept fits the MMA path: its GEMV
    widths (D, Hq/t * hd, F/t) stay multiples of 16 and hd >= 16 (tests/test_tp_sharding.py)."""
    return default_gemv(group.config, dtype) if gemv is None else gemv


def rank_barrier(group, dev) -> None:
    """Every rank's queued work done (a device sync on GPUs), then a collective every rank joins (``group``'s
    gather of one value). RankError from the collective."""
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)
    group._gather(torch.zeros(1, dtype=torch.int64, device=dev))


class TPRankRunner:
    """What a rank's kernel and megakernel runners share (they set ``model``, ``cache``, ``group``, ``runner``,
    ``logits``, ``next_tokens``, ``steps``): the PyTorch prefill with the group's collectives, the step count
    and fault point, the rank-local token ids, the step of a runner whose gather can run alone (``_gathered_step``),
    and ``check`` / ``poll`` of the inner runner."""

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        self.group.where = "prefill"
        return self.group.gather_logits(prefill(self.model, self.cache, prompts, tp=self.group))

    def _begin_step(self) -> None:
        self.steps += 1
        self.group.where = f"decode step {self.steps}"
        fault_point(self.group.shard.rank, self.steps)

    def _gathered_step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The inner runner's step (its launch ends with ``self._gather``, the logits gather), or, where the test
        fault ``skip`` names this rank and step, only ``self._gather(ran=False)``: the rank never launches but
        still joins its collectives (the peers' waits on it must give up and name it)."""
        self._begin_step()
        if fault_action(self.group.shard.rank, self.steps) == "skip":
            self._gather(ran=False)
            return self.logits, self.next_tokens
        self.runner.step(self.local_tokens(tokens))
        return self.logits, self.next_tokens

    def local_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens int32 [B] (global ids) -> the rank's ids, ``tokens - vocab_start`` (outside [0, V_local) embed
        0), into one buffer kept across steps (no allocation per step)."""
        buf = getattr(self, "_local", None)
        if buf is None or buf.shape != tokens.shape or buf.device != tokens.device:
            buf = self._local = torch.empty_like(tokens)
        return torch.sub(tokens, self.group.shard.vocab_start, out=buf)

    def check(self) -> None:
        self.runner.check()

    def poll(self) -> None:
        self.runner.poll()


class TPKernelRunner(TPRankRunner):
    """One rank's runner of ``mode`` (eager | graph | pdl) over ``model`` (its ShardedModel) and ``cache`` (a
    KVCache of its local config), with the collectives of ``group`` (a TPGroup).

    ``step(tokens int32 [B], the global ids, the same on every rank) -> (logits float32 [B, V] (every rank's
    rows), next_tokens int32 [B])``, both owned by the runner and overwritten by the next step;
    ``prefill(prompts) -> logits [B, V]`` (the PyTorch prefill with ``group``'s collectives); ``check()`` and
    ``poll()`` as every runner. Options: ``allreduce`` "nccl" | "symm", ``interpret`` (the Triton interpreter on
    the CPU), ``tiles`` / ``n_sm`` (``runtime.runners.make_step_runner``), ``gemv`` ("fma" | "mma" | None: the
    unsharded model's default, ``rank_gemv``; the path is ``self.bound.graph.meta["gemv"]``), and the executor's
    own. Building it is collective with "symm" (the buffer's rendezvous). Raises InputError (a mode that is not a
    kernel mode, an unknown or unsupported all-reduce, an unknown gemv path), DeviceError (no GPU and not
    ``interpret``), what ``build_decode_step`` raises; RankError from a collective."""

    def __init__(self, mode: str, model, cache, group, *, interpret: bool = False, allreduce: str = "nccl",
                 tiles: str | None = None, n_sm: int | None = None, gemv: str | None = None, **options):
        if mode not in KERNEL_MODES:
            raise InputError(f"TPKernelRunner runs {', '.join(KERNEL_MODES)}, not {mode!r}")
        dev = cache.k.device
        if allreduce == "oneshot":
            raise InputError("the one-shot all-reduce runs in dist.tp_oneshot.TPOneShotRunner (TPGroup.step_runner "
                             "picks it for allreduce='oneshot'), not TPKernelRunner")
        check_allreduce(allreduce, dev, cache.k.dtype)
        check_mode(mode, dev, interpret)
        self.mode, self.allreduce, self.model, self.cache, self.group = mode, allreduce, model, cache, group
        shard = group.shard
        tiling = Tiling(sm_count(dev) if n_sm is None else n_sm, tiles or DEFAULT_TILING[mode], smem_per_block(dev))
        self.bound = build_decode_step(model.config, model.weights, cache, tiling=tiling,
                                       residual=shard.rank == 0, gemv=rank_gemv(group, cache.k.dtype, gemv))
        t = self.bound.tensors
        B, D = t["embed.out"].shape
        reduce = (group.all_reduce if allreduce == "nccl" else
                  SymmAllReduce((B, D), t["embed.out"].dtype, dev))
        V = group.config.vocab_size
        self.logits = logits = torch.full((B, V), float("nan"), dtype=torch.float32, device=dev)
        self.next_tokens = next_tokens = torch.full((B,), -1, dtype=torch.int32, device=dev)
        bound = self.bound

        def gather() -> None:  # the rank's logits -> the whole logits and the greedy tokens (every rank)
            local = bound.tensors[bound.logits]
            logits.copy_(group.gather_logits(local))
            next_tokens.copy_(group.argmax(local, bound.tensors[bound.next_tokens]))  # the kernel's local argmax

        # host calls after ops (closures over tensors, not over self: no reference cycle keeps a dropped
        # runner's weights alive); names looked up at call time (the step's activations never move)
        after = {"embed": lambda: reduce(t["embed.out"]), "lm_head.argmax": gather}
        for i in range(model.config.n_layers):
            for op in (f"o_proj.{i}", f"down.{i}"):
                after[op] = lambda op=op: reduce(t[f"{op}.out"])
        self.runner = make_runner(mode, bound, interpret=interpret, after=after, **options)
        self.steps = 0

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._begin_step()
        self.runner.step(self.local_tokens(tokens))
        return self.logits, self.next_tokens

