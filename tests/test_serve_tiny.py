"""`onekernel serve` on the tiny random model in reference mode, as a real process, talked to with the official
`openai` client and with plain HTTP: every answer equals the same request run alone through `generate`."""
import asyncio
import random

import httpx
import openai
import pytest

from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.sampling import SamplingParams
from onekernel.bench.serve_process import Server

# Module-scoped fixtures (its servers): README's command (pytest-xdist, --dist loadgroup)
# runs this module's tests in one worker, which builds them once.
pytestmark = pytest.mark.xdist_group("serve_tiny")

CTX = 96  # --max-seq-len


@pytest.fixture(scope="module")
def server():
    s = Server("--model", "tiny", "--random-weights", "--mode", "reference", "--max-batch", "8",
               "--max-seq-len", str(CTX), "--max-queue", "64")
    yield s
    s.close()


@pytest.fixture(scope="module")
def model():
    return load_model("tiny", random_weights=True)  # the server's weights (--seed 0)


def alone(model, prompt, n, sampling=None, chat=False) -> list[int]:
    """The tokens of one request run alone through generate (same context length as the server)."""
    res = generate(model, [prompt], max_new_tokens=n, sampling=sampling, chat=chat, max_seq_len=CTX)
    return res.sequences[0].generated_ids


def words(rng: random.Random) -> str:
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6)))
                    for _ in range(rng.randint(1, 8)))


def test_32_concurrent_streams_each_equal_generate_alone(server, model, seed):
    rng = random.Random(seed)
    jobs = [(words(rng), rng.randint(1, 40), rng.random() < 0.25) for _ in range(32)]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none")
    steps_before = server.metric("onekernel_decode_steps_total")

    async def one(prompt, n, sampled, i):
        kw = dict(temperature=0.9, top_p=0.95, seed=seed + i) if sampled else dict(temperature=0)
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=n, stream=True,
                                                 extra_body={"return_token_ids": True}, **kw)
        ids, texts, finish = [], [], []
        async for chunk in stream:
            c = chunk.choices[0]
            ids += c.token_ids
            texts.append(c.text)
            finish.append(c.finish_reason)
        return ids, texts, finish

    async def main():
        return await asyncio.gather(*[one(p, n, s, i) for i, (p, n, s) in enumerate(jobs)])
    results = asyncio.run(main())
    for i, ((prompt, n, sampled), (ids, texts, finish)) in enumerate(zip(jobs, results)):
        sampling = SamplingParams(0.9, None, 0.95, seed + i) if sampled else None
        assert ids == alone(model, prompt, n, sampling), f"request {i} ({prompt!r}, {n} tokens, sampled={sampled})"
        assert "".join(texts) == model.tokenizer.decode(ids)
        # a chunk per token that brings text (a byte of a character waits for the rest), the last says why it ended
        assert all(texts) and finish == [None] * (len(texts) - 1) + ["length"]
    # they were batched: fewer decode steps than tokens, and steps with more than one live slot
    assert server.metric("onekernel_decode_steps_total") - steps_before < sum(n for _, n, _ in jobs)
    assert server.metric('onekernel_batch_occupancy_bucket{le="1.0"}') < server.metric(
        "onekernel_batch_occupancy_count")
    assert server.metric("onekernel_running_requests") == 0
    assert server.metric("onekernel_time_to_first_token_seconds_count") >= 32
    assert server.metric("onekernel_inter_token_latency_seconds_count") >= sum(n - 1 for _, n, _ in jobs)
    assert server.metric('onekernel_requests_total{outcome="length"}') >= 32


def test_openai_client_completions_and_chat(server, model, seed):
    rng = random.Random(seed)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == ["tiny"]
    prompt, n = words(rng), rng.randint(3, 12)
    want = alone(model, prompt, n)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0, logprobs=3,
                                  extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert c.token_ids == want and c.text == model.tokenizer.decode(want) and c.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt.encode()), n)
    assert len(c.logprobs.token_logprobs) == n and all(len(t) <= 3 for t in c.logprobs.top_logprobs)
    # greedy: the chosen token is the most likely one
    assert all(lp >= max(top.values()) - 1e-5 for lp, top in zip(c.logprobs.token_logprobs, c.logprobs.top_logprobs))

    msg = words(rng)
    want = alone(model, msg, n, chat=True)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": msg}], max_tokens=n,
                                       temperature=0, logprobs=True, top_logprobs=2)
    assert r.choices[0].message.content == model.tokenizer.decode(want)
    assert r.choices[0].message.role == "assistant" and len(r.choices[0].logprobs.content) == n
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": msg}],
                                                 max_tokens=n, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks[1:-1]) == model.tokenizer.decode(want)
    assert all(ch.choices[0].delta.content for ch in chunks[1:-1]) and chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == n and chunks[-1].choices == []


def test_stop_strings_and_stop_token_ids(server, model, seed):
    rng = random.Random(seed)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    prompt = words(rng)
    full = alone(model, prompt, 30)
    text = model.tokenizer.decode(full)
    stop = text[10:12]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0, stop=[stop, "\x00\x01"])
    assert r.choices[0].text == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=30, temperature=0, stop=stop, stream=True))
    assert streamed == r.choices[0].text
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0,
                                  extra_body={"stop_token_ids": [full[5]], "return_token_ids": True})
    cut = full.index(full[5]) + 1
    assert r.choices[0].token_ids == full[:cut] and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == model.tokenizer.decode(full[:cut - 1])


BAD = [  # (body or raw text, status, param, words the message has)
    ("{not json", 400, None, "not valid JSON"),
    ({"max_tokens": 3}, 400, "prompt", "prompt is required"),
    ({"prompt": "hi", "max_tokens": "3"}, 400, "max_tokens", 'max_tokens must be an integer >= 1, or null; got "3"'),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature", "temperature must be a number from 0 to 2"),
    ({"prompt": "hi", "max_tokens": CTX}, 400, "max_tokens", "over the context"),
    ({"prompt": "", "max_tokens": 3}, 400, "prompt", "empty"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "model", "does not exist"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "stop has 5 strings; at most 4"),
    ({"prompt": "hi", "n": 2}, 400, "n", "n must be 1"),
    ({"prompt": [1, 2, 999]}, 400, "prompt", "outside the vocabulary"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "max_tokens must be an integer >= 1, or null; got 0"),
]


@pytest.mark.parametrize("body,status,param,words", BAD, ids=[b[3] for b in BAD])
def test_bad_completion_requests_get_openai_errors(server, body, status, param, words):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = httpx.post(server.url + "/v1/completions", **kw)
    err = r.json()["error"]
    assert r.status_code == status and err["param"] == param and words in err["message"], r.text
    assert set(err) == {"message", "type", "param", "code"}


def test_bad_chat_requests_and_the_server_keeps_serving(server):
    for body, param in [({"messages": []}, "messages"), ({"messages": [{"role": "robot", "content": "x"}]},
                                                          "messages[0].role"),
                        ({"messages": [{"role": "user", "content": ""}]}, "messages"),
                        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 50}, "top_logprobs")]:
        r = httpx.post(server.url + "/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert httpx.get(server.url + "/v2/nothing").status_code == 404
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "ok"}],
                                                              "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
