"""`onekernel serve --max-batch 1 --max-queue 0` (SmolLM2-135M's shape with random weights: slow enough on the CPU
that a request holds the slot while others arrive; a real process): 0 means nothing waits, but a
free slot still serves: requests one after another are all answered, and one sent while the slot is busy gets
HTTP 429 (OpenAI-style, the openai client's RateLimitError), the server serving on."""
import httpx
import openai
import pytest

from onekernel.bench.serve_process import Server


@pytest.fixture(scope="module")
def server():
    s = Server("--model", "smollm2-135m", "--random-weights", "--mode", "reference", "--max-batch", "1",
               "--max-queue", "0", "--max-seq-len", "128")
    yield s
    s.close()


def test_max_queue_0_serves_one_at_a_time_and_refuses_a_second(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    for _ in range(3):  # each request starts when the last one's answer has come back: the slot is free
        assert client.completions.create(model="smollm2-135m", prompt="hi", max_tokens=3).usage.completion_tokens == 3
    # logprobs: a chunk per token (random weights' stray bytes send no chunk until they make text)
    body = {"prompt": "hi", "max_tokens": 100, "ignore_eos": True, "stream": True, "logprobs": 0}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))  # a token: the request holds the slot
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2)
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    assert client.completions.create(model="smollm2-135m", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert server.metric('onekernel_requests_total{outcome="rejected"}') == 2
