"""The PyTorch tensor-parallel decoder: ``runtime.reference`` over a rank's shard (``dist.sharding``) with the
collectives of Megatron-LM (Shoeybi et al. 2019, sections 3 and 3.1) through ``torch.distributed``:

* embedding: vocabulary-parallel; a rank embeds the tokens of its vocabulary range, zeros for the others, and
  the rows are all-reduced (exact: one rank contributes each row);
* per layer: one all-reduce of the O-projection's partial sums [B, T, D], one of down's;
* logits: each rank's vocabulary range [B, V/t]; greedy tokens by a distributed argmax (each rank's max and
  its index are all-gathered: 2 x B values per rank instead of V/t), and the whole logits all-gathered for
  sampling.

Every rank ends a step with the same logits and tokens, so every rank runs the same generation loop
(``runtime.generate`` with ``parallel=TPGroup``). The all-reduces sum the ranks' partial sums in rank order, so
the logits equal the single-device reference's within the rounding of the model dtype (fp32: ~1e-6 relative).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onekernel.dist.process import fault_point, timeout_s
from onekernel.dist.sharding import Shard, vocab_range
from onekernel.errors import InputError, RankError
from onekernel.models.config import ModelConfig, rope_inv_freq
from onekernel.runtime.reference import cpu_keys, decode_one_token, prefill


class TPGroup:
    """One rank's collectives over the default ``torch.distributed`` group (joined by ``process.init_rank``),
    for ``shard`` (its rank, TP size and vocabulary range). ``config`` is the whole model's config (what
    ``runtime.generate`` checks prompts against). A collective that fails (a peer died, or did not answer within
    ``process.timeout_s()``) raises RankError naming this rank and ``where`` (the step). ``allreduce``: the
    kernel modes' all-reduce when ``step_runner`` is not given one ("nccl" | "symm", ``dist.allreduce``)."""

    def __init__(self, shard: Shard, allreduce: str = "nccl"):
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() != shard.tp or dist.get_rank() != shard.rank:
            raise InputError(f"TPGroup for rank {shard.rank} of {shard.tp} needs the process group of that rank "
                             f"joined first (onekernel.dist.process.init_rank)")
        self.dist, self.shard, self.config = dist, shard, shard.full
        self.allreduce = allreduce  # the kernel modes' default all-reduce (dist.allreduce)
        self.where = "start-up"

    def _run(self, name: str, fn, *args) -> None:
        try:
            fn(*args)
        except RuntimeError as e:  # torch.distributed.DistBackendError and gloo/NCCL errors
            first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:200]
            raise RankError(f"rank {self.shard.rank} of {self.shard.tp}: {name} at {self.where} failed: another "
                            f"rank died or did not answer within {timeout_s():g} s ({first})") from None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks (in place; returned)."""
        self._run("all_reduce", self.dist.all_reduce, x)
        return x

    def embed(self, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Vocabulary-parallel embedding: tokens (int64, any shape) -> [*tokens.shape, D] in table's dtype, where
        ``table`` is this rank's rows [vocab_start, vocab_stop)."""
        local = tokens - self.shard.vocab_start
        inside = (local >= 0) & (local < table.shape[0])
        x = F.embedding(local.clamp(0, table.shape[0] - 1), table)
        return self.all_reduce(torch.where(inside[..., None], x, torch.zeros_like(x)))

    def _gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(x) for _ in range(self.shard.tp)]
        self._run("all_gather", self.dist.all_gather, parts, x.contiguous())
        return parts

    def argmax(self, logits: torch.Tensor, local_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Distributed greedy argmax: this rank's logits float32 [B, V_local] -> global token ids int32 [B], the
        lowest index among equal maxima (as ``torch.argmax`` over the whole logits). ``local_ids`` (int [B]):
        the rank's own argmax when a kernel already computed it (the lowest index of each row's maximum), so
        only its values are read."""
        if local_ids is None:
            best, idx = logits.max(dim=-1)
        else:
            idx = local_ids.long()
            best = logits.gather(1, idx[:, None])[:, 0]
        vals = torch.stack(self._gather(best))  # [t, B]
        ids = torch.stack(self._gather(idx + self.shard.vocab_start))
        rank = vals.argmax(dim=0)  # first maximum: the lowest rank, so the lowest index (ranges ascend)
        return ids.gather(0, rank[None])[0].to(torch.int32)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The whole logits float32 [B, V] from every rank's [B, V_local] (ranges of unequal length padded)."""
        V, t = self.config.vocab_size, self.shard.tp
        width = vocab_range(V, t, 0)[1]  # rank 0's range is the longest
        parts = self._gather(F.pad(logits, (0, width - logits.shape[-1])))
        return torch.cat([p[:, : b - a] for p, (a, b) in zip(parts, (vocab_range(V, t, r) for r in range(t)))], -1)

    def step_runner(self, mode: str, model, cache, *, interpret: bool = False, allreduce: str | None = None,
                    **options):
        """The rank's runner of ``mode`` (``runtime.generate``'s ``parallel`` hook): "reference" (this module's
        TPReferenceRunner; no options) or a kernel mode, eager | graph | pdl (``dist.tp_kernels.TPKernelRunner``
        with ``allreduce`` "nccl" | "symm", default the group's, and ``options``) or "megakernel"
        (``dist.tp_megakernel.TPMegakernelRunner``: the all-reduces are its tile tasks; ``options``); a kernel mode
        with ``allreduce`` "oneshot" is ``dist.tp_oneshot.TPOneShotRunner`` (our own all-reduce kernels). Both kernel
        runners take ``gemv`` ("fma" | "mma" | None: the unsharded model's path, ``dist.tp_kernels.rank_gemv``). Raises
        InputError for an unknown mode, options given to the reference mode, ``allreduce`` given to the
        megakernel, and as the runner classes."""
        check_tp_mode(mode)
        if mode == "reference":
            if options or allreduce is not None:
                raise InputError(f"the tensor-parallel reference mode takes no runner options, got "
                                 f"{', '.join(sorted(options)) or 'allreduce=' + str(allreduce)}")
            return TPReferenceRunner(model, cache, self)
        if mode == "megakernel":
            if allreduce is not None:
                raise InputError("--allreduce applies to the kernel modes eager, graph and pdl; the megakernel's "
                                 "all-reduce is its own tile tasks")
            from onekernel.dist.tp_megakernel import TPMegakernelRunner
            return TPMegakernelRunner(model, cache, self, interpret=interpret, **options)
        if (allreduce or self.allreduce) == "oneshot":  # the all-reduces as per-op kernels (dist.tp_oneshot)
            from onekernel.dist.tp_oneshot import TPOneShotRunner
            return TPOneShotRunner(mode, model, cache, self, interpret=interpret, **options)
        from onekernel.dist.tp_kernels import TPKernelRunner
        return TPKernelRunner(mode, model, cache, self, interpret=interpret, allreduce=allreduce or self.allreduce,
                              **options)


TP_MODES = ("reference", "eager", "graph", "pdl", "megakernel")


def check_tp_mode(mode: str) -> None:
    """InputError unless ``mode`` runs at TP > 1 (TP_MODES)."""
    if mode not in TP_MODES:
        raise InputError(f"unknown mode {mode!r} at --tp > 1; choose one of {', '.join(TP_MODES)}")


class TPReferenceRunner:
    """StepRunner of a rank (``exec.base`` interface): ``step(tokens int32 [B]) -> (logits float32 [B, V] (the
    whole vocabulary, gathered), next int32 [B] (distributed argmax))``, ``prefill(prompts) -> logits [B, V]``;
    ``model`` is the rank's ShardedModel and ``cache`` a KVCache of its local config. Raises InputError when a
    sequence would decode past the cache, RankError when a collective fails."""

    mode = "reference"

    def __init__(self, model, cache, group: TPGroup):
        self.model, self.cache, self.group = model, cache, group
        self.cfg: ModelConfig = model.config
        self.inv_freq = rope_inv_freq(self.cfg).to(device=cache.k.device, dtype=torch.float32)
        self.steps = 0

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        self.group.where = "prefill"
        return self.group.gather_logits(prefill(self.model, self.cache, prompts, tp=self.group))

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, g = self.cache, self.group
        longest = int(c.seq_lens.max())
        if longest >= c.max_seq_len:
            raise InputError(f"decode past the end of the KV cache ({c.max_seq_len} positions)")
        self.steps += 1
        g.where = f"decode step {self.steps}"
        fault_point(g.shard.rank, self.steps)
        local = decode_one_token(self.cfg, self.model.weights, c.k, c.v, c.seq_lens, tokens, self.inv_freq, tp=g,
                                 keys=cpu_keys(c, longest))
        return g.gather_logits(local), g.argmax(local)

    def check(self) -> None:
        """Nothing to check: collectives raise their errors at once."""

    poll = check
