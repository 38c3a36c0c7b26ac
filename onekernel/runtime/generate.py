"""Generation loop: tokenize, check limits, prefill, decode step by step, sample, stream, stop at EOS.

Every mode shares this loop and the KV cache; only the decode step differs. Prefill always runs the PyTorch
reference (``runtime.reference.prefill``); the decode step comes from
``runtime.runners.make_step_runner(mode, model, cache)`` (every mode, "reference" included). After each step the
loop does ``cache.seq_lens += 1`` on the device (docs/DESIGN.md, "KV cache and the step"). The prompts are
checked and tokenized by ``runtime.prompts``, sampled per sequence by ``runtime.sampling.Sampler`` and
detokenized for streaming by ``runtime.stream``.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from onekernel.errors import InputError
from onekernel.ops.tiling import MAX_BATCH
from onekernel.runtime.args import check_flag, check_int, check_model, gemv_options
from onekernel.runtime.buckets import bucket_for, bucket_sizes
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.prompts import encode_prompts
from onekernel.runtime.reference import prefill
from onekernel.runtime.runners import check_mode, make_step_runner
from onekernel.runtime.sampling import Sampler, SamplingParams
from onekernel.runtime.stream import TextStream


# The smallest KV-cache length a compiled (GPU) mode is built for when no max_seq_len is given.
CACHE_LEN_MIN = 512


def default_cache_len(needed: int, model_context: int, compiled: bool) -> int:
    """KV-cache length of a run without max_seq_len: ``needed`` (longest prompt + max_new_tokens) as is for
    the reference mode and the interpreter; for a compiled mode rounded up to a power of two >= CACHE_LEN_MIN,
    capped at ``model_context``, because the kernels are compiled for one cache length: runs with other prompt
    lengths then reuse the compiled kernels (and ``onekernel warmup``'s default matches short prompts)."""
    if not compiled:
        return needed
    return min(model_context, max(CACHE_LEN_MIN, 1 << (needed - 1).bit_length()))


@dataclass
class SequenceResult:
    """One sequence: prompt ids, generated ids (an EOS token, if produced, is the last id), decoded text
    (without EOS), and why it stopped ("eos" or "length")."""
    prompt_ids: list[int]
    generated_ids: list[int]
    text: str
    finish_reason: str


@dataclass
class Timings:
    """Milliseconds (host wall clock, device synchronized). A decode step is ``runner.step`` plus
    ``seq_lens += 1``; sampling and detokenizing are not in it. decode_ms_per_step is the median over
    the steps (0.0 when there were none); prefill_ms includes the first logits, not tokenization."""
    prefill_ms: float
    decode_ms_per_step: float
    total_ms: float
    decode_steps: int
    decode_ms_all: list[float] = field(default_factory=list, repr=False)


@dataclass
class GenerationResult:
    sequences: list[SequenceResult]
    timings: Timings
    mode: str
    device: str
    dtype: str
    bucket: int = 0  # the batch size the decode step ran at (>= the prompts: padded to a bucket)


def _model_device_dtype(model) -> tuple[torch.device, torch.dtype]:
    t = model.weights["tok_embeddings"]
    return t.device, t.dtype


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_prompt(sampling, n: int) -> list[SamplingParams]:
    """``sampling`` (None, one SamplingParams for every prompt, or a list of one per prompt) as n params."""
    if sampling is None or isinstance(sampling, SamplingParams):
        return [sampling or SamplingParams()] * n
    if not isinstance(sampling, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in sampling):
        raise InputError(f"sampling must be a SamplingParams or a list of one SamplingParams per prompt, got "
                         f"{sampling!r:.60}")
    if len(sampling) != n:
        raise InputError(f"sampling has {len(sampling)} SamplingParams for {n} prompts; pass one SamplingParams "
                         f"per prompt, or a single one for all of them")
    return list(sampling)


def generate(model, prompts: list[str] | list[list[int]], *, max_new_tokens: int = 32, mode: str = "reference",
             sampling: SamplingParams | list[SamplingParams] | None = None, chat: bool = False,
             on_token: Callable[[int, int, str], None] | None = None, max_seq_len: int | None = None,
             interpret: bool = False, ignore_eos: bool = False, parallel=None,
             gemv: str | None = None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens for each of 1..MAX_BATCH (16, ops/tiling.py) prompts of
    any lengths.

    Args:
        model: LoadedModel (config, weights, tokenizer, source), from ``models.load.load_model``.
        prompts: texts (tokenized; with ``chat`` the chat template is applied) or lists of token ids.
        mode: "reference" | "eager" | "graph" | "pdl" | "megakernel".
        sampling: SamplingParams for every prompt, or a list of one per prompt (default greedy). Each sequence
            samples with its own generator seeded with its seed, so its tokens depend only on its prompt, seed
            and parameters, not on the rest of the batch (``sampling.Sampler``).
        on_token: called as on_token(seq_index, token_id, text_piece) for every new token; the pieces of a
            sequence concatenate to its final text.
        max_seq_len: context limit (default and maximum: cfg.max_seq_len); also the KV-cache length when given.
        interpret: run a Triton mode on the CPU in the Triton interpreter; TRITON_INTERPRET=1 must be set
            before onekernel is imported (Triton reads it when a kernel is defined; the CLI sets it).
        ignore_eos: keep generating past EOS (for benchmarks).
        Batch buckets: a kernel mode runs its decode step at the smallest bucket size (1, 2, 4, 8, 16;
        ``runtime.buckets``) that holds the prompts, padded with one-token greedy sequences whose outputs are
        dropped, so 3 prompts reuse the batch-4 kernels (no new compile) and cost what 4 cost. Batch invariance
        (a row's logits do not depend on the other rows) keeps every prompt's tokens the same as alone.
        gemv: "fma" | "mma" | None: the GEMV path of a Triton mode's decode step (None: the model's,
            ``models.decode_graph.default_gemv``; a tensor-parallel rank takes the unsharded model's).
        parallel: None, or a tensor-parallel rank's group (``onekernel.dist.tp_reference.TPGroup``); then
            ``model`` is the rank's shard, prompts are checked against ``parallel.config`` (the whole model's),
            and the runner (``parallel.step_runner(mode, model, cache, interpret=..., gemv=...)``) does the prefill.
    Raises (all before anything runs):
        InputError: an argument of the wrong kind (model not a LoadedModel, a flag not a bool, ...), a gemv
            that ``runtime.args.gemv_options`` refuses, no
            prompts, more than MAX_BATCH, max_new_tokens < 1, an unknown mode, a sampling list that does not
            match the prompts, or a prompt ``runtime.prompts.encode_prompts`` refuses (empty, outside the
            vocabulary, prompt + max_new_tokens longer than the context).
        DeviceError: a GPU-only mode with the model not on a CUDA device and ``interpret`` False.
    """
    t_start = time.perf_counter()
    check_model(model)
    cfg, tok = (model.config if parallel is None else parallel.config), model.tokenizer
    for name, flag in (("chat", chat), ("interpret", interpret), ("ignore_eos", ignore_eos)):
        check_flag(name, flag)
    if isinstance(prompts, str):  # one prompt, not a sequence of one-character prompts
        prompts = [prompts]
    if prompts is not None and not isinstance(prompts, (list, tuple)):
        raise InputError(f"prompts must be a string or a list of prompts (strings or lists of token ids), got "
                         f"{type(prompts).__name__}")
    if on_token is not None and not callable(on_token):
        raise InputError(f"on_token must be a function on_token(seq_index, token_id, text_piece), got "
                         f"{type(on_token).__name__}")
    if max_seq_len is not None:
        check_int("max_seq_len (--max-seq-len)", max_seq_len)
    check_int("max_new_tokens (--max-new-tokens)", max_new_tokens)
    if not prompts:
        raise InputError("no prompt given; pass at least one prompt")
    if len(prompts) > MAX_BATCH:
        raise InputError(f"{len(prompts)} prompts were given, but the batch limit is {MAX_BATCH}; "
                         f"split them into runs of at most {MAX_BATCH}")
    params = _per_prompt(sampling, len(prompts))
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens (--max-new-tokens) must be >= 1, got {max_new_tokens}")
    device, dtype = _model_device_dtype(model)
    check_mode(mode, device, interpret)
    options = gemv_options(gemv, mode)
    ids = encode_prompts(tok, prompts, chat=chat, max_new_tokens=max_new_tokens, model_context=cfg.max_seq_len,
                         max_seq_len=max_seq_len, vocab_size=cfg.vocab_size)

    B = len(ids)
    compiled = mode != "reference" and not interpret
    cache_len = max_seq_len or default_cache_len(max(map(len, ids)) + max_new_tokens, cfg.max_seq_len, compiled)
    nb = B if mode == "reference" else bucket_for(B, bucket_sizes(MAX_BATCH))
    ids = ids + [ids[0][:1]] * (nb - B)  # padding rows: one token each, greedy, outputs dropped
    params = params + [SamplingParams()] * (nb - B)
    cache = KVCache(model.config, nb, cache_len, dtype, device)  # a rank's shard: its local KV heads
    if parallel is None:
        runner = make_step_runner(mode, model, cache, interpret=interpret, **options)
    else:
        runner = parallel.step_runner(mode, model, cache, interpret=interpret, **options)
    eos = set() if ignore_eos else set(tok.eos_token_ids)
    streams = [TextStream(tok, eos) for _ in range(B)]
    done = [False] * B
    sampler = Sampler(params, device)

    def emit_step(slot: int) -> None:
        """Wait for the step whose tokens went to host[slot], check the runner for an error of that step (a
        megakernel wait that timed out: raised before its tokens are used), then emit the tokens."""
        nonlocal t_last
        if events[slot] is not None:
            events[slot].synchronize()
        runner.poll()
        now = time.perf_counter()
        step_ms.append((now - t_last) * 1e3)
        t_last = now
        emit(host[slot])

    def emit(tokens: torch.Tensor) -> None:
        for b, t in enumerate(tokens.tolist()[:B]):
            if done[b]:
                continue
            piece = streams[b].push(t)
            if t in eos or len(streams[b].ids) >= max_new_tokens:
                done[b] = True
                piece += streams[b].finish()  # flush any held-back partial UTF-8 text
            if on_token is not None:
                on_token(b, t, piece)

    t0 = time.perf_counter()
    logits = prefill(model, cache, ids) if parallel is None else runner.prefill(ids)
    _sync(device)
    prefill_ms = (time.perf_counter() - t0) * 1e3
    tokens = sampler(logits)
    emit(tokens)
    # Pipelined: step k+1 is queued on the device before the host waits for step k's tokens (the next step's
    # input never leaves the device), so detokenizing, streaming and the launch overlap the GPU. The tokens
    # of each step are copied to pinned host memory behind it, with an event the host waits on. When the
    # last sequence finishes, the one step already queued beyond it is discarded (its position is inside the
    # cache: prompt + max_new_tokens <= its length).
    pinned = device.type == "cuda"
    host = [torch.empty(nb, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
    events = [torch.cuda.Event() if pinned else None for _ in range(2)]
    step_ms, pending, k, t_last = [], None, 0, time.perf_counter()
    while not all(done):
        logits, greedy = runner.step(tokens)
        cache.seq_lens += 1
        tokens = sampler(logits, greedy)  # a copy: the runner overwrites greedy at its next step
        host[k % 2].copy_(tokens, non_blocking=pinned)
        if pinned:
            events[k % 2].record()
        if pending is not None:
            emit_step(pending)
        pending, k = k % 2, k + 1

    seqs = [SequenceResult(p, s.ids, s.text, "eos" if s.ids and s.ids[-1] in eos else "length")
            for p, s in zip(ids[:B], streams)]
    timings = Timings(prefill_ms, statistics.median(step_ms) if step_ms else 0.0,
                      (time.perf_counter() - t_start) * 1e3, len(step_ms), step_ms)
    return GenerationResult(seqs, timings, mode, str(device), str(dtype).removeprefix("torch."), nb)
