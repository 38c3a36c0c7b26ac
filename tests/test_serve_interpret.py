"""`onekernel serve --interpret --mode megakernel` on the tiny model (2 slots, a queue of 1): a request that
arrives while another decodes joins it and finishes first; a third waits in the queue, a fourth gets 429; a
client that goes away frees its slot; every answer equals `generate` in the same mode."""
import asyncio
import random

import httpx
import openai
import pytest

from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.bench.serve_process import Server, metric

CTX = 32


@pytest.fixture(scope="module")
def server():
    s = Server("--model", "tiny", "--random-weights", "--interpret", "--mode", "graph", "--max-batch", "2",
               "--max-seq-len", str(CTX), "--max-queue", "1")
    yield s
    s.close()


def test_join_queue_429_cancel_and_tokens_equal_generate(server, seed):
    rng = random.Random(seed)
    prompts = ["".join(rng.choice("klmnopqrst ") for _ in range(rng.randint(2, 9))) for _ in range(3)]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    events = []

    async def stream(i, n, started=None):
        # logprobs: a chunk per token (else a byte of a character waits for the rest)
        s = await client.completions.create(model="tiny", prompt=prompts[i], max_tokens=n, temperature=0, logprobs=0,
                                            stream=True, extra_body={"return_token_ids": True})
        ids = []
        async for chunk in s:
            ids += chunk.choices[0].token_ids
            if started is not None and not started.is_set():
                started.set()
        events.append(i)
        return ids

    async def main():
        a_started, b_started = asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(stream(0, 4, a_started))
        await a_started.wait()  # A is decoding
        b = asyncio.create_task(stream(1, 2, b_started))
        await b_started.wait()  # B holds the second slot: C must wait in the queue
        c = asyncio.create_task(client.completions.create(model="tiny", prompt=prompts[2], max_tokens=1,
                                                          temperature=0, extra_body={"return_token_ids": True}))
        async with httpx.AsyncClient() as h:
            while metric((await h.get(server.url + "/metrics")).text, "onekernel_waiting_requests") < 1:
                await asyncio.sleep(0.05)
            d = await h.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        return await a, await b, (await c).choices[0].token_ids, d

    a, b, c, d = asyncio.run(main())
    assert d.status_code == 429 and d.json()["error"]["code"] == "queue_full", d.text
    assert events == [1, 0]  # B joined A's batch and finished while A was still decoding
    model = load_model("tiny", random_weights=True)
    res = generate(model, prompts, max_new_tokens=4, mode="graph", interpret=True, max_seq_len=CTX)
    assert [a, b, c] == [s.generated_ids[:n] for s, n in zip(res.sequences, (4, 2, 1))]

    # a client that disconnects mid-stream: its request is cancelled and its slot freed
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"prompt": prompts[0], "max_tokens": 20, "stream": True, "logprobs": 0}) as r:
        next(r.iter_lines())
    while server.metric("onekernel_running_requests") > 0:
        pass
    assert server.metric('onekernel_requests_total{outcome="cancelled"}') == 1
    assert server.metric("onekernel_generation_tokens_total") < 4 + 2 + 1 + 20
