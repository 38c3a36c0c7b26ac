"""`onekernel serve` (tiny model, reference mode, a real process): every request field is honoured or refused.
Unsupported values and unknown keys get a 400 naming the field and what is allowed (plain HTTP and the official
`openai` client), the harmless values clients send by default are accepted and change nothing, bad values are
named in the request's own terms (no pydantic wording), and logprobs keep every top entry in OpenAI's shapes."""
import httpx
import openai
import pytest
import torch

from onekernel.bench.serve_process import Server
from onekernel.models.load import load_model
from onekernel.runtime.reference import prefill
from onekernel.runtime.kv_cache import KVCache
from onekernel.serve.format import token_text

# Module-scoped fixtures (one server): README's command (pytest-xdist, --dist loadgroup)
# runs this module's tests in one worker, which builds them once.
pytestmark = pytest.mark.xdist_group("serve_fields")

CTX = 64
MSG = [{"role": "user", "content": "hi"}]
JARGON = ("Input should", "Field required", ".str", "list[", "Extra inputs", "union")


@pytest.fixture(scope="module")
def server():
    s = Server("--model", "tiny", "--random-weights", "--mode", "reference", "--max-batch", "2",
               "--max-seq-len", str(CTX))
    yield s
    s.close()


C, H = "completions", "chat/completions"
BAD = [  # (endpoint, body or raw JSON text, param, words of the message)
    (C, {"prompt": "hi", "echo": True}, "echo", "echo is not supported"),
    (C, {"prompt": "hi", "best_of": 3}, "best_of", "best_of must be 1"),
    (C, {"prompt": "hi", "suffix": "end"}, "suffix", "suffix (text after the insertion) is not supported"),
    (C, {"prompt": "hi", "logit_bias": {"5": 2}}, "logit_bias", "logit_bias is not supported"),
    (C, {"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty", "presence_penalty is not supported"),
    (C, {"prompt": "hi", "promt": "x"}, "promt", "promt is not a field this server knows (did you mean 'prompt'?)"),
    (C, {"prompt": 7}, "prompt", "prompt must be a string, a list of token ids"),
    (C, {"prompt": ["a", "b"]}, "prompt", "prompt holds 2 prompts; this server takes one prompt per request"),
    (C, {"prompt": "hi", "stop": [1]}, "stop", "stop must be a string or a list of up to 4 strings; got [1]"),
    (C, '{"prompt": "hi", "temperature": NaN}', "temperature", "temperature must be a number from 0 to 2 (0: greedy), "
                                                               "or null; got NaN"),
    (C, '{"prompt": "hi", "temperature": Infinity}', "temperature", "got Infinity"),
    (C, '{"prompt": "hi", "top_p": NaN}', "top_p", "top_p must be a number greater than 0 and at most 1"),
    (C, {"prompt": "hi", "top_p": 0}, "top_p", "top_p must be a number greater than 0 and at most 1, or null; got 0"),
    (C, {"prompt": "hi", "temperature": 0.0001}, "temperature", "too small to sample with"),
    (C, {"prompt": "hi", "logprobs": 21}, "logprobs", "logprobs must be an integer from 0 to 20"),
    (C, {"prompt": "hi", "stream": "yes"}, "stream", 'stream must be true or false, or null; got "yes"'),
    (C, {"prompt": "hi", "stream_options": {"include_usage": 1}}, "stream_options.include_usage",
     "stream_options.include_usage must be true or false"),
    (C, "[1, 2]", None, "the request body must be a JSON object"),
    (H, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     "tools are not supported"),
    (H, {"messages": MSG, "tool_choice": "required"}, "tool_choice", 'tool_choice must be "none" or "auto"'),
    (H, {"messages": MSG, "functions": [{"name": "f"}]}, "functions", "functions are not supported"),
    (H, {"messages": MSG, "response_format": {"type": "json_object"}}, "response_format",
     'response_format must be {"type": "text"}'),
    (H, {"messages": MSG, "n": 2}, "n", "n must be 1"),
    (H, {"messages": MSG, "frequency_penalty": -1}, "frequency_penalty", "frequency_penalty is not supported"),
    (H, {"messages": MSG, "modalities": ["text", "audio"]}, "modalities", 'modalities must be ["text"]'),
    (H, {"messages": MSG, "store": True}, "store", "store must be false"),
    (H, {"messages": MSG, "top_logprobs": 3}, "top_logprobs", "top_logprobs needs logprobs: true"),
    (H, {"messages": MSG, "repetition_penalty": 1.1}, "repetition_penalty",
     "repetition_penalty is not a field this server knows; the request can have: audio, "),
    (H, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content",
     "messages[0].content must be a string or a list of text parts"),
    (H, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
     "messages[0].content[0].type", 'only text is supported; got a part of type "image_url"'),
    (H, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "this server has no tool calling"),
    (H, {"messages": [{"role": "user", "content": "x", "name": "ann"}]}, "messages[0].name",
     "messages[0].name is not supported"),
    (H, {"messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages[0].colour",
     "messages[0] can have: content, role"),  # not the fields that are only refused (name, tool_calls, ...)
    (H, {"messages": MSG, "max_tokens": 5, "max_completion_tokens": 7}, "max_completion_tokens",
     "max_tokens is 5 and max_completion_tokens is 7; send one of them"),
    (C, {"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options",
     "stream_options is only allowed with stream: true"),
    (H, {"messages": MSG, "stream": False, "stream_options": {}}, "stream_options", "only allowed with stream: true"),
    (H, {"messages": ["hi"]}, "messages[0]", 'messages[0] must be an object with a "role" and a "content", such as'),
    (H, {"messages": [{"content": "x"}]}, "messages[0].role", "messages[0].role is required: one of"),
    (H, {"messages": MSG, "logprobs": 2}, "logprobs", "logprobs must be true or false, or null; got 2"),
    # lone surrogates (a JSON \ud800 escape) in any text a tokenizer reads: a 400, not a 500
    (H, r'{"messages": [{"role": "user", "content": "\ud800"}]}', "messages[0].content",
     "messages[0].content is not valid UTF-8 text (character 0 is '\\ud800')"),
    (C, r'{"prompt": "a\ud800b"}', "prompt", "prompt is not valid UTF-8 text (character 1 is '\\ud800')"),
    (C, r'{"prompt": "hi", "stop": ["ok", "x\udfff"]}', "stop", "stop is not valid UTF-8 text (character 1"),
    (H, r'{"messages": [{"role": "user", "content": "hi"}], "stop": "\udc80"}', "stop", "stop is not valid UTF-8"),
    (H, r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "ok\ud800"}]}]}',
     "messages[0].content[0].text", "messages[0].content[0].text is not valid UTF-8 text (character 2"),
    (C, r'{"prompt": "hi", "\ud800": 1}', None, 'a key of the request is not valid UTF-8 text (got "\\ud800")'),
    (H, r'{"messages": [{"role": "user", "content": "hi", "k\ud800": 1}]}', "messages[0]",
     "a key of messages[0] is not valid UTF-8 text"),
]


@pytest.mark.parametrize("endpoint,body,param,words", BAD, ids=[f"{b[0][:4]}-{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_unsupported_unknown_and_bad_fields_get_one_clear_400(server, endpoint, body, param, words):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = httpx.post(f"{server.url}/v1/{endpoint}", **kw)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and words in err["message"], r.text
    assert set(err) == {"message", "type", "param", "code"} and not any(j in err["message"] for j in JARGON), r.text


def test_a_body_that_is_not_json_is_shown_as_text(server):
    """JSON sent as text/plain (or curl's default form type) was shown as a Python bytes repr (b'{...'); bytes
    that are not UTF-8 got FastAPI's "There was an error parsing the body"."""
    body = '{"messages": [{"role": "user", "content": "' + "long " * 20 + '"}]}'
    for ct, said in [("text/plain", "text/plain"), ("application/x-www-form-urlencoded", "application/x-www-form")]:
        r = httpx.post(f"{server.url}/v1/{H}", content=body, headers={"content-type": ct})
        msg = r.json()["error"]["message"]
        assert r.status_code == 400 and "Content-Type: application/json" in msg and said in msg, r.text
        assert msg.endswith(': {"messages": [{"role": "user", "content": "long long long...') and "b'" not in msg
    r = httpx.post(f"{server.url}/v1/{C}", content=b'{"prompt": "a\xff"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == ("the request body could not be read as JSON; "
                                                                     "send UTF-8 JSON text"), r.text


def test_retrieve_the_model_by_id(server):
    """GET /v1/models/{id} (the openai client's models.retrieve) was a 404 for the served model too."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    card = client.models.retrieve("tiny")
    assert (card.id, card.object, card.owned_by) == ("tiny", "model", "onekernel")
    assert card.model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found" and "'gpt-4o' does not exist" in e.value.body["message"]
    r = httpx.get(server.url + "/v1/models/org/name")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text


def test_harmless_defaults_are_accepted_and_change_nothing(server):
    """What clients send when they do not use a feature (nulls, n=1, zero penalties, no tools, text format, a
    user id, ...) gives the same answer as the bare request."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    want = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=5, temperature=0)
    got = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=5, temperature=0, n=1, presence_penalty=0, frequency_penalty=0,
        logit_bias={}, user="u1", stop=None, top_p=None, seed=None, tools=[], tool_choice="none",
        parallel_tool_calls=False, response_format={"type": "text"}, modalities=["text"], store=False,
        metadata={"a": "b"}, service_tier="auto", safety_identifier="s", prompt_cache_key="k",
        stream_options=None, extra_body={"top_k": -1, "ignore_eos": False})
    assert got.choices[0].message.content == want.choices[0].message.content
    want = client.completions.create(model="tiny", prompt="hi", max_tokens=5, temperature=0)
    got = client.completions.create(model="tiny", prompt=["hi"], max_tokens=5, temperature=0, n=1, best_of=1,
                                    echo=False, suffix=None, presence_penalty=0.0, frequency_penalty=0.0, user="u")
    assert got.choices[0].text == want.choices[0].text
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": None, "temperature": None,
                                                           "n": None, "logprobs": None}).status_code == 200
    both = {"messages": MSG, "max_tokens": 3, "max_completion_tokens": 3, "stream": False, "stream_options": None}
    r = httpx.post(server.url + "/v1/chat/completions", json=both)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


def test_the_openai_client_raises_the_400_and_the_server_keeps_serving(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    for kw, param in [({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                      ({"extra_body": {"min_p": 0.1}}, "min_p"), ({"n": 3}, "n")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, **kw)
        assert e.value.body["param"] == param and param in e.value.body["message"]
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_logprobs_keep_every_top_entry(server):
    """The byte tokenizer's ids 128..255 all decode to U+FFFD: keyed by decoded text, top_logprobs lost entries.
    Now a completion's 20 top entries are 20 keys (text, or bytes:\\xNN for part of a character) with the model's
    top-20 log-probabilities, and chat's entries carry each token's own bytes."""
    model = load_model("tiny", random_weights=True)
    prompt = "hello"
    logits = prefill(model, KVCache(model.config, 1, CTX), [list(prompt.encode())])[0]
    top = logits.log_softmax(-1).topk(20)
    want = {token_text(bytes([t])): v for v, t in zip(top.values.tolist(), top.indices.tolist())}
    assert any(k.startswith("bytes:\\x") for k in want), "the prompt should give a partial-character token"
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0, logprobs=20)
    lp = r.choices[0].logprobs
    assert lp.top_logprobs[0].keys() == want.keys()
    assert torch.allclose(torch.tensor([lp.top_logprobs[0][k] for k in want]), torch.tensor(list(want.values())))
    assert lp.tokens[0] == token_text(bytes([top.indices[0].item()]))
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=20)
    for pos in r.choices[0].logprobs.content:
        assert len({bytes(t.bytes) for t in pos.top_logprobs}) == 20 and pos.bytes == pos.top_logprobs[0].bytes
        assert all(t.token == token_text(bytes(t.bytes)) and len(t.bytes) == 1 for t in pos.top_logprobs)
