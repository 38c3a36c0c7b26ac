"""Continuous batching on one thread: a KV cache of ``max_batch`` slots, one decode step for all live slots.

Between decode steps the engine frees the slots of cancelled requests, then prefills waiting requests (first
come, first served) into the lowest free slots (``runtime.reference.prefill`` over ``KVCache.slots(s, s + 1)``)
and samples their first token. A decode step runs at the smallest batch bucket holding the highest live slot
(``runtime.buckets``); idle slots inside it read token 0 at position 0 of their own slot and are never
emitted. Each request samples with its own ``Sampler`` (its own seeded generator), so its tokens depend only
on its prompt, parameters and seed. Pipelined as ``runtime.generate`` on a GPU: step k+1 is queued on the device
before the host waits for step k's tokens; a request that finished at step k ignores its token of step k+1, and its
slot is reset (token 0, seq_len 0) behind that step on the device stream.

Results go to each request's ``sink``, called on the engine thread with a ``TokenOut`` per token (the last one
has its ``finish_reason``) or an Exception when the engine failed.
"""
from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from onekernel.runtime.buckets import BucketRunners
from onekernel.runtime.reference import prefill
from onekernel.runtime.sampling import Sampler, SamplingParams
from onekernel.serve.metrics import Metrics
from onekernel.serve.text import StopText


class QueueFullError(Exception):
    """The wait queue holds ``max_queue`` requests (HTTP 429)."""


class EngineStoppedError(Exception):
    """The engine failed or was stopped (HTTP 503)."""


@dataclass(frozen=True)
class GenRequest:
    """prompt_ids: >= 1 ids; max_tokens >= 1 (prompt + max_tokens <= the cache length: checked by the caller);
    stop: strings ending the text (not included); stop_token_ids: ids ending it (not decoded, as EOS);
    top_logprobs: None (no logprobs) or k >= 0 (the chosen token's log-probability and the k most likely)."""
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    top_logprobs: int | None = None


@dataclass
class TokenOut:
    """One generated token: its id, its text piece (may be empty: text held back), natural-log probability
    under the model (``logprob``, float32 logits, before temperature) and the ``top`` [(id, logprob)] when
    asked, and ``finish_reason`` ("stop" | "length") on the request's last token."""
    token: int
    text: str
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    finish_reason: str | None = None


class _Seq:
    def __init__(self, req: GenRequest, sink, tokenizer, eos: set[int], device):
        self.req, self.sink, self.sampler = req, sink, Sampler([req.sampling], device)
        self.hidden = set(req.stop_token_ids) | (set() if req.ignore_eos else eos)
        self.text = StopText(tokenizer, req.stop, self.hidden)
        self.n_out, self.slot, self.done, self.cancelled = 0, None, False, False
        self.t_arrive = self.t_last = time.perf_counter()

    def sample(self, logits: torch.Tensor, greedy: torch.Tensor | None = None) -> torch.Tensor:
        """logits float32 [1, V] (and the runner's argmax int32 [1]) -> int32 [1] on the device."""
        return self.sampler(logits, greedy)


class Handle:
    """A submitted request: ``cancel()`` (any thread) drops it; its slot is freed before the next step."""

    def __init__(self, engine: "Engine", seq: _Seq):
        self._engine, self._seq = engine, seq

    def cancel(self) -> None:
        self._engine._cancel(self._seq)


@dataclass
class _Step:
    runner: object
    live: list[tuple[int, _Seq]]
    buf: int
    logprobs: dict


class Engine:
    """The batching engine over ``model`` (a LoadedModel) in ``mode``, ``max_batch`` slots of ``max_seq_len``
    positions, at most ``max_queue`` requests waiting beyond the free slots (0: none wait, a free slot still
    serves); ``pipeline`` (default: on a GPU) queues the next step before emitting the last one's tokens.
    ``warm()`` compiles every bucket, ``start()`` starts the thread, ``submit(req, sink) -> Handle`` (any thread)
    queues a request: QueueFullError, EngineStoppedError. ``drain()`` refuses new requests, ``abort()`` also
    stops the running ones (shutdown); ``stop()`` ends the thread. ``options``: the runners' own (``gemv``), passed
    to ``runtime.buckets.BucketRunners``. Raises what ``runtime.buckets.BucketRunners`` raises."""

    def __init__(self, model, mode: str, max_batch: int, max_seq_len: int, *, interpret: bool = False,
                 max_queue: int = 256, metrics: Metrics | None = None, pipeline: bool | None = None,
                 **options):
        self.model, self.mode, self.max_queue = model, mode, max_queue
        self.buckets = BucketRunners(mode, model, max_batch, max_seq_len, interpret=interpret, **options)
        self.cache, dev = self.buckets.cache, self.buckets.cache.device
        self.metrics = metrics or Metrics()
        self.eos = set(model.tokenizer.eos_token_ids)
        self.tokens = torch.zeros(max_batch, dtype=torch.int32, device=dev)  # each slot's next input token
        self.live = torch.zeros(max_batch, dtype=torch.int32, device=dev)  # 1 where the slot holds a request
        self.pinned = dev.type == "cuda"
        # on the CPU a step is done when launched: pipelining would only delay each token by a step
        self.pipeline = self.pinned if pipeline is None else pipeline
        self.host = [torch.zeros(max_batch, dtype=torch.int32, pin_memory=self.pinned) for _ in range(2)]
        self.events = [torch.cuda.Event() if self.pinned else None for _ in range(2)]
        self.slots: list[_Seq | None] = [None] * max_batch
        self.queue: deque[_Seq] = deque()
        self.cv = threading.Condition()
        self.error: BaseException | None = None
        self._stopping, self._thread = False, None
        self._draining = self._aborting = False  # shutting down: no new requests / stop the running ones

    def warm(self, on_bucket: Callable[[int, int, int], None] | None = None) -> None:
        """Prefill once and run one step of every bucket (``BucketRunners.warm``), then empty the cache."""
        prefill(self.model, self.cache.slots(0, 1), [[0]])
        self.buckets.warm(on_bucket)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="onekernel-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self.cv:
            self._stopping = True
            self.cv.notify_all()
        if self._thread is not None:
            self._thread.join()

    @property
    def healthy(self) -> bool:
        return (self.error is None and not self._draining and self._thread is not None
                and self._thread.is_alive())

    @property
    def draining(self) -> bool:
        """True once ``drain()`` or ``abort()`` was called (the server is shutting down)."""
        return self._draining

    def drain(self) -> int:
        """Refuse new requests from now on (EngineStoppedError; unhealthy); returns how many are running or waiting."""
        with self.cv:  # a Condition's lock is reentrant: safe in a signal handler of the thread holding it
            self._draining = True
            return sum(q is not None for q in self.slots) + len(self.queue)

    def abort(self) -> int:
        """Refuse new requests and stop the running and waiting ones before the next step: each gets an
        EngineStoppedError (a stream ends with an error chunk, a plain request gets 503); returns how many."""
        with self.cv:
            self._draining = self._aborting = True
            self.cv.notify_all()
            return sum(q is not None and not q.done for q in self.slots) + len(self.queue)

    def submit(self, req: GenRequest, sink: Callable[[object], None]) -> Handle:
        seq = _Seq(req, sink, self.model.tokenizer, self.eos, self.cache.device)
        with self.cv:
            if self._draining and self.error is None:
                raise EngineStoppedError("the server is shutting down and takes no new requests")
            if self.error is not None or self._stopping:
                raise EngineStoppedError(f"the engine has stopped ({self.error!r:.200})")
            free = sum(q is None for q in self.slots)  # the first `free` queued requests take a slot next
            if len(self.queue) >= self.max_queue + free:
                self.metrics.requests.labels("rejected").inc()
                raise QueueFullError(f"every slot is busy and the queue is full ({self.max_queue} requests wait "
                                     f"for a slot); retry later")
            self.queue.append(seq)
            self.metrics.waiting.set(len(self.queue))
            self.cv.notify_all()
        return Handle(self, seq)

    def _cancel(self, seq: _Seq) -> None:
        with self.cv:
            seq.cancelled = True
            if seq in self.queue:
                self.queue.remove(seq)
                self.metrics.waiting.set(len(self.queue))
            self.cv.notify_all()

    def _run(self) -> None:
        try:
            with torch.no_grad():
                self._loop()
        except BaseException as e:  # a device or runner error: fail every request, report unhealthy
            traceback.print_exc()
            self.error = e
            self._fail_all(EngineStoppedError(f"the engine failed: {type(e).__name__}: {e}"), "error")

    def _fail_all(self, err: EngineStoppedError, outcome: str) -> None:
        """Send ``err`` to every running and waiting request and drop them (running ones' slots reset unless the
        engine failed)."""
        with self.cv:
            seqs = [q for q in self.slots if q is not None] + list(self.queue)
            self.queue.clear()
            self.metrics.waiting.set(0)
        for q in seqs:
            if self.error is None and q.slot is not None:
                self._finish(q, outcome)
            else:
                q.done = True
                self.metrics.requests.labels(outcome).inc()
            self._send(q, err)

    def _loop(self) -> None:
        pending, k = None, 0
        while not self._stopping:
            if self._aborting:
                self._fail_all(EngineStoppedError("the server is shutting down: the request was stopped"), "cancelled")
            for s, q in enumerate(self.slots):
                if q is not None and q.cancelled:
                    self._finish(q, "cancelled")
            self._admit()
            self._compact()
            live = [(s, q) for s, q in enumerate(self.slots) if q is not None]
            step = self._launch(live, k % 2) if live else None
            k += 1
            if pending is not None:
                self._emit(pending)
            pending = step
            if step is not None and not self.pipeline:
                self._emit(step)
                pending = None
            if not live and pending is None:
                with self.cv:
                    self.cv.wait_for(lambda: self.queue or self._stopping, timeout=1.0)

    def _admit(self) -> None:
        """Prefill waiting requests into the lowest free slots and emit their first tokens."""
        while True:
            with self.cv:
                free = [s for s, q in enumerate(self.slots) if q is None]
                if not free or not self.queue:
                    return
                seq = self.queue.popleft()
                self.metrics.waiting.set(len(self.queue))
                if seq.cancelled:
                    continue
                s = seq.slot = free[0]
                self.slots[s] = seq
            self.metrics.running.inc()
            self.metrics.prompt_tokens.inc(len(seq.req.prompt_ids))
            logits = prefill(self.model, self.cache.slots(s, s + 1), [seq.req.prompt_ids])
            tok = seq.sample(logits)
            self.tokens[s:s + 1] = tok
            self.live[s] = 1
            lp = self._logprobs(seq, logits[0], tok[0])
            self._push(seq, int(tok[0]), _host(lp))

    def _compact(self) -> None:
        """Move the highest live slot into the lowest free one while that lets the step run at a smaller bucket
        (its K/V, position and next token are copied behind the steps already queued; a queued step's tokens
        are still read from the slot it ran in)."""
        while True:
            live = [s for s, q in enumerate(self.slots) if q is not None]
            if not live or self.buckets.size_for(len(live)) >= self.buckets.size_for(live[-1] + 1):
                return
            src, dst = live[-1], self.slots.index(None)
            seq, c = self.slots[src], self.cache
            n = min(c.max_seq_len, len(seq.req.prompt_ids) + seq.n_out + 1)  # positions written so far
            c.k[:, dst, :, :n] = c.k[:, src, :, :n]
            c.v[:, dst, :, :n] = c.v[:, src, :, :n]
            for t in (c.seq_lens, self.tokens, self.live):
                t[dst] = t[src]
                t[src] = 0
            with self.cv:
                self.slots[dst], self.slots[src], seq.slot = seq, None, dst
            self.metrics.moves.inc()

    def _logprobs(self, seq: _Seq, logits: torch.Tensor, token: torch.Tensor):
        """(chosen log-prob, top values, top ids) on the device for a request that asked for them, else None."""
        k = seq.req.top_logprobs
        if k is None:
            return None
        lp = logits.float().log_softmax(-1)
        top = lp.topk(k) if k else (lp[:0], lp[:0].long())
        return lp[token.long()], top[0], top[1]

    def _launch(self, live: list[tuple[int, _Seq]], buf: int) -> _Step:
        """Queue one decode step of every live slot (and the sampling behind it) on the device."""
        n = self.buckets.size_for(live[-1][0] + 1)
        runner = self.buckets.runner(n)
        logits, greedy = runner.step(self.tokens[:n])
        self.cache.seq_lens[:n] += self.live[:n]
        out = greedy.clone()  # the runner overwrites greedy at its next step
        lps = {}
        for s, q in live:
            if not q.sampler.greedy:
                out[s:s + 1] = q.sample(logits[s:s + 1])
            lp = self._logprobs(q, logits[s], out[s])
            if lp is not None:
                lps[s] = lp
        self.tokens[:n] = out * self.live[:n]
        self.host[buf][:n].copy_(out, non_blocking=self.pinned)
        if self.pinned:
            self.events[buf].record()
        self.metrics.step(len(live), n)
        return _Step(runner, live, buf, lps)

    def _emit(self, step: _Step) -> None:
        """Wait for a launched step, check its runner for a device-side error, then push its tokens."""
        if self.events[step.buf] is not None:
            self.events[step.buf].synchronize()
        step.runner.poll()
        tokens = self.host[step.buf].tolist()
        for s, q in step.live:
            if not q.done and not q.cancelled:
                self._push(q, tokens[s], _host(step.logprobs.get(s)))

    def _push(self, seq: _Seq, token: int, lp) -> None:
        now = time.perf_counter()
        (self.metrics.itl if seq.n_out else self.metrics.ttft).observe(now - (seq.t_last if seq.n_out else
                                                                              seq.t_arrive))
        seq.n_out, seq.t_last = seq.n_out + 1, now
        self.metrics.generated_tokens.inc()
        piece, stopped = seq.text.push(token)
        reason = ("stop" if stopped or token in seq.hidden else
                  "length" if seq.n_out >= seq.req.max_tokens else None)
        if reason and not stopped:
            piece += seq.text.flush()
        out = TokenOut(token, piece, finish_reason=reason)
        if lp is not None:
            out.logprob, out.top = lp[0], list(zip(lp[2], lp[1]))
        if reason:  # the slot is free before the client hears the last token (and may send its next request)
            self._finish(seq, reason)
        self._send(seq, out)

    def _send(self, seq: _Seq, item) -> None:
        try:
            seq.sink(item)
        except Exception:  # the receiver is gone (its event loop closed): drop the request
            seq.cancelled = True

    def _finish(self, seq: _Seq, reason: str) -> None:
        """Mark ``seq`` done and reset its slot behind the steps already queued (token 0, seq_len 0, idle)."""
        seq.done = True
        self.metrics.requests.labels(reason).inc()
        s = seq.slot
        if s is not None and self.slots[s] is seq:
            with self.cv:
                self.slots[s] = None
            self.tokens[s] = 0
            self.live[s] = 0
            self.cache.seq_lens[s] = 0
            self.metrics.running.dec()


def _host(lp):
    """Device logprob tensors -> (float, [values], [ids]) on the host, or None."""
    return None if lp is None else (float(lp[0]), lp[1].tolist(), lp[2].tolist())
