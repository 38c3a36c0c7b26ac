"""Load for the serving benchmark: N concurrent streaming clients against a running ``onekernel serve``, each
sending its requests one after another, timing every server-sent event as it arrives.

Each request: a prompt of ``prompt_len`` random token ids (seeded), ``max_tokens`` greedy tokens with
``ignore_eos`` (every request generates exactly ``max_tokens``), streamed. Per request the client records the
time to the first token (send -> first chunk) and the gaps between chunks (inter-token latency); a chunk that
brings k tokens (its ``token_ids``: a character's bytes come together) counts as k gaps of a k-th of its gap.
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time

import httpx


async def _one(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    t0 = time.perf_counter()
    stamps, counts = [], []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(line[:300])
                stamps.append(time.perf_counter())
                counts.append(len(chunk["choices"][0]["token_ids"]))
    if sum(counts) != max_tokens:
        raise RuntimeError(f"a request got {sum(counts)} tokens, not {max_tokens}")
    itl = [(b - a) / k for a, b, k in zip(stamps, stamps[1:], counts[1:]) for _ in range(k)]
    return {"ttft_s": stamps[0] - t0, "itl_s": itl, "tokens": sum(counts)}


def _pct(xs: list[float], q: float) -> float | None:
    """The q-quantile (0..1, nearest rank) of xs in milliseconds, None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return 1e3 * s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def run_clients(url: str, clients: int, requests_per_client: int, prompt_len: int, max_tokens: int,
                vocab: int, seed: int = 0) -> dict:
    """Run ``clients`` concurrent clients of ``requests_per_client`` requests each. Returns {clients, requests,
    tokens, wall_s, tokens_per_s (all generated tokens / wall time), ttft_p50_ms, ttft_p99_ms, itl_p50_ms,
    itl_p99_ms, itl_mean_ms}. Raises RuntimeError when a request fails or gets fewer tokens."""
    rng = random.Random(seed)
    low = min(100, vocab // 2)  # ids past the control tokens at the start of most vocabularies
    prompts = [[[rng.randrange(low, vocab) for _ in range(prompt_len)] for _ in range(requests_per_client)]
               for _ in range(clients)]

    async def client(c: httpx.AsyncClient, mine: list[list[int]]) -> list[dict]:
        return [await _one(c, url, p, max_tokens) for p in mine]

    async def main():
        limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as c:
            t0 = time.perf_counter()
            per = await asyncio.gather(*[client(c, p) for p in prompts])
            return per, time.perf_counter() - t0

    per, wall = asyncio.run(main())
    reqs = [r for rs in per for r in rs]
    itl = [x for r in reqs for x in r["itl_s"]]
    tokens, ttft = sum(r["tokens"] for r in reqs), [r["ttft_s"] for r in reqs]
    return {"clients": clients, "requests": len(reqs), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_p50_ms": _pct(ttft, 0.5), "ttft_p99_ms": _pct(ttft, 0.99),
            "itl_p50_ms": _pct(itl, 0.5), "itl_p99_ms": _pct(itl, 0.99),
            "itl_mean_ms": 1e3 * statistics.fmean(itl) if itl else None}
