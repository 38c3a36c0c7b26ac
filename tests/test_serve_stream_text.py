"""Streamed text on the tiny byte-level model (its ids 128..255 are single bytes), as a real server: a token that
is part of a UTF-8 character sends no chunk of its own (its bytes come with the token that completes the
character), unless logprobs are asked (then a chunk per token, each with its logprob); a cut at max_tokens inside
a character ends in U+FFFD, streamed or not."""
import openai
import pytest

from onekernel.bench.serve_process import Server
from onekernel.models.load import load_model
from onekernel.runtime.generate import generate

# Module-scoped fixtures (one server): README's command (pytest-xdist, --dist loadgroup)
# runs this module's tests in one worker, which builds them once.
pytestmark = pytest.mark.xdist_group("serve_stream_text")

CTX = 96


@pytest.fixture(scope="module")
def client():
    with Server("--model", "tiny", "--random-weights", "--mode", "reference", "--max-batch", "2",
                "--max-seq-len", str(CTX)) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="none")


@pytest.fixture(scope="module")
def model():
    return load_model("tiny", random_weights=True)  # the server's weights (--seed 0)


def alone(model, prompt: str, n: int, chat: bool = False) -> list[int]:
    return generate(model, [prompt], max_new_tokens=n, chat=chat, max_seq_len=CTX).sequences[0].generated_ids


@pytest.mark.parametrize("prompt,n", [("a", 12), ("hello", 8), ("hello", 5)])
def test_completion_chunks_carry_whole_characters(client, model, prompt, n):
    """Greedy "a" gives 笷 (3 bytes), "hello" Ȯ (2 bytes) among stray bytes; 5 tokens of "hello" end on Ȯ's
    first byte, which both the stream and the whole response spell U+FFFD."""
    ids = alone(model, prompt, n)
    text = model.tokenizer.decode(ids)
    assert any(t >= 0x80 for t in ids[:-1]), ids  # the premise: a token of part of a character
    kw = dict(model="tiny", prompt=prompt, max_tokens=n, temperature=0)
    chunks = [c.choices[0] for c in client.completions.create(
        **kw, stream=True, extra_body={"return_token_ids": True})]
    assert all(c.text for c in chunks) and len(chunks) < n, [c.text for c in chunks]  # no empty chunk
    assert "".join(c.text for c in chunks) == text == client.completions.create(**kw).choices[0].text
    assert sum((c.token_ids for c in chunks), []) == ids and chunks[-1].finish_reason == "length"
    if n == 5:
        assert text.endswith("\ufffd") and chunks[-1].text == "\ufffd"
    per_token = [c.choices[0] for c in client.completions.create(**kw, stream=True, logprobs=0)]
    assert len(per_token) == n and [len(c.logprobs.token_logprobs) for c in per_token] == [1] * n
    assert "".join(c.text for c in per_token) == text


def test_chat_chunks_carry_whole_characters(client, model):
    ids = alone(model, "hi", 10, chat=True)
    assert any(t >= 0x80 for t in ids[:-1]), ids
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=0)
    chunks = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True)]
    assert chunks[0].delta.role == "assistant" and all(c.delta.content for c in chunks[1:]) and len(chunks) < 11
    text = "".join(c.delta.content for c in chunks)
    assert text == model.tokenizer.decode(ids) == client.chat.completions.create(**kw).choices[0].message.content
    per_token = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True, logprobs=True)][1:]
    assert [len(c.logprobs.content) for c in per_token] == [1] * 10
    assert "".join(c.delta.content for c in per_token) == text
