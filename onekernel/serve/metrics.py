"""The server's Prometheus metrics (``GET /metrics``, text format), in a registry of their own.

Counters: requests by outcome (stop, length, cancelled, error, rejected), prompt and generated tokens, decode
steps, slot moves (compaction). Histograms: time to first token (seconds, from arrival: queueing and prefill
included), inter-token latency (seconds); batch occupancy (live slots per decode step) and the bucket each step
ran at. Gauges: running and waiting requests.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_SLOTS = (1, 2, 3, 4, 6, 8, 12, 16)


class Metrics:
    """What the engine reports; ``text()`` renders it (bytes, Prometheus text format 0.0.4)."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("onekernel_requests", "Requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("onekernel_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter("onekernel_generation_tokens", "Tokens generated", registry=r)
        self.steps = Counter("onekernel_decode_steps", "Decode steps run", registry=r)
        self.moves = Counter("onekernel_slot_moves", "Requests moved to a lower slot for a smaller bucket",
                             registry=r)
        self.ttft = Histogram("onekernel_time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY,
                              registry=r)
        self.itl = Histogram("onekernel_inter_token_latency_seconds", "Time between a request's tokens",
                             buckets=_LATENCY, registry=r)
        self.occupancy = Histogram("onekernel_batch_occupancy", "Live slots per decode step", buckets=_SLOTS,
                                   registry=r)
        self.bucket = Histogram("onekernel_batch_bucket", "Batch bucket each decode step ran at", buckets=_SLOTS,
                                registry=r)
        self.running = Gauge("onekernel_running_requests", "Requests holding a KV-cache slot", registry=r)
        self.waiting = Gauge("onekernel_waiting_requests", "Requests queued for a slot", registry=r)

    def step(self, live: int, bucket: int) -> None:
        self.steps.inc()
        self.occupancy.observe(live)
        self.bucket.observe(bucket)

    def text(self) -> bytes:
        return generate_latest(self.registry)
