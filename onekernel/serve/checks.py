"""A parsed request body (``protocol.py``) -> the engine's ``GenRequest``: the prompt (a completion's text or ids,
or the chat template over the messages, their contents kept as plain text), stop strings and ids, the context
check and the sampling parameters. Each bad value raises ``ApiError`` (400) naming the field as the request
spells it (``messages[1].content``) and what it takes."""
from __future__ import annotations

import json
import secrets

from onekernel.errors import InputError
from onekernel.runtime.prompts import utf8_problem
from onekernel.runtime.sampling import MIN_TEMPERATURE, SamplingParams
from onekernel.serve.engine import GenRequest
from onekernel.serve.protocol import MAX_STOP, ApiError, ChatRequest, CompletionRequest
from onekernel.serve.unsupported import check_message_fields, check_unsupported

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}  # developer: system
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for completions


def shown(value) -> str:
    """A request value as JSON, cut to 60 characters (for error messages)."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _utf8(text: str, param: str) -> str:
    """``text``, or ApiError (400) when it holds a lone surrogate (a JSON ``\\ud800``) that no tokenizer takes."""
    problem = utf8_problem(text)
    if problem:
        raise ApiError(f"{param} {problem}; send UTF-8 text (a \\uD800-\\uDFFF escape must be half of a "
                       f"surrogate pair)", param=param)
    return text


def _ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def completion_prompt(req: CompletionRequest, tokenizer, vocab_size: int) -> list[int]:
    """The prompt's token ids: a string, a list of ids, or a list holding one of either."""
    p = req.prompt
    if isinstance(p, list) and len(p) == 1 and (isinstance(p[0], str) or _ids(p[0])):
        p = p[0]
    elif isinstance(p, list) and len(p) > 1 and all(isinstance(x, str) or _ids(x) for x in p):
        raise ApiError(f"prompt holds {len(p)} prompts; this server takes one prompt per request (send one request "
                       f"each)", param="prompt")
    if p == "" or p == []:
        raise ApiError("prompt is empty; give at least one token of text", param="prompt")
    if not (isinstance(p, str) or _ids(p)):
        raise ApiError(f"prompt must be a string, a list of token ids, or a list holding one of either; got "
                       f"{shown(req.prompt)}", param="prompt")
    ids = tokenizer.encode(_utf8(p, "prompt")) if isinstance(p, str) else p
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ApiError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})", param="prompt")
    return ids


def _content(msg, where: str) -> str:
    """A message's content as text: a string, or the texts of a list of text parts joined."""
    c = msg.content
    if c is None and msg.role == "assistant":
        return ""
    if isinstance(c, str):
        return _utf8(c, f"{where}.content")
    if not isinstance(c, list):
        raise ApiError(f"{where}.content must be a string or a list of text parts ({{\"type\": \"text\", \"text\": "
                       f"\"...\"}}); got {shown(c)}", param=f"{where}.content")
    for j, part in enumerate(c):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else None
            why = f"a part of type {shown(kind)}" if kind else shown(part)
            raise ApiError(f"{at} must be a text part ({{\"type\": \"text\", \"text\": \"...\"}}): only text is "
                           f"supported; got {why}", param=f"{at}.type" if kind else at)
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise ApiError(f"{at} must be {{\"type\": \"text\", \"text\": a string}} and nothing else; got "
                           f"{shown(part)}", param=at)
        _utf8(part["text"], f"{at}.text")
    return "".join(part["text"] for part in c)


def chat_prompt(req: ChatRequest, tokenizer) -> list[int]:
    """The chat template applied to the messages, their contents kept as plain text (``Tokenizer.chat_plain``)."""
    msgs = []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            why = ": this server has no tool calling" if m.role in ("tool", "function") else ""
            raise ApiError(f"{where}.role must be one of {', '.join(map(shown, ROLES))}{why}; got {shown(m.role)}",
                           param=f"{where}.role")
        check_message_fields(m, where)
        msgs.append({"role": ROLES[m.role], "content": _content(m, where)})
    if not any(m["content"] for m in msgs):
        raise ApiError("every message is empty; give some text", param="messages")
    try:
        return tokenizer.chat_plain(msgs)
    except InputError as e:
        raise ApiError(str(e), param="messages") from None


def _stops(req, vocab_size: int) -> tuple[tuple[str, ...], frozenset[int]]:
    stop = [req.stop] if isinstance(req.stop, str) else req.stop if req.stop is not None else []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(f"stop must be a string or a list of up to {MAX_STOP} strings; got {shown(req.stop)}",
                       param="stop")
    if len(stop) > MAX_STOP:
        raise ApiError(f"stop has {len(stop)} strings; at most {MAX_STOP} are allowed", param="stop")
    if any(not s for s in stop):
        raise ApiError("stop holds an empty string; every stop string needs at least one character", param="stop")
    for s in stop:
        _utf8(s, "stop")
    ids = req.stop_token_ids or []
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ApiError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab_size})",
                       param="stop_token_ids")
    return tuple(stop), frozenset(ids)


def _sampling(req) -> SamplingParams:
    t = 1.0 if req.temperature is None else req.temperature
    if 0 < t < MIN_TEMPERATURE:
        raise ApiError(f"temperature must be 0 (greedy) or from {MIN_TEMPERATURE} to 2; got {t} (too small to "
                       f"sample with: use 0)", param="temperature")
    seed = req.seed if req.seed is not None else secrets.randbits(63)
    top_k = None if req.top_k in (None, -1, 0) else req.top_k  # -1 (vLLM) and 0: no limit
    return SamplingParams(t, top_k, 1.0 if req.top_p is None else req.top_p, seed)


def to_gen_request(req, prompt_ids: list[int], max_tokens: int | None, context: int, vocab_size: int,
                   top_logprobs: int | None) -> GenRequest:
    """Check the common fields against the context (``context`` positions) and build the engine's request.
    ``max_tokens`` None: up to the context. Raises ApiError."""
    check_unsupported(req)
    if req.stream_options is not None and not req.stream:
        raise ApiError("stream_options is only allowed with stream: true", param="stream_options")
    stop, stop_ids = _stops(req, vocab_size)
    room = context - len(prompt_ids)
    if room < 1:
        raise ApiError(f"the prompt has {len(prompt_ids)} tokens, which fills the context of {context}; shorten "
                       f"it", param="prompt" if hasattr(req, "prompt") else "messages",
                       code="context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        n = len(prompt_ids)
        name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
        raise ApiError(f"the prompt has {n} token{'s' * (n != 1)} and {name} is {max_tokens}: {n + max_tokens} "
                       f"positions, over the context of {context}; lower {name} to at most {room}", param=name,
                       code="context_length_exceeded")
    return GenRequest(prompt_ids, max_tokens or room, _sampling(req), stop, stop_ids, bool(req.ignore_eos),
                      top_logprobs)


def completion_tokens(req: CompletionRequest) -> int:
    """A completion's max_tokens (null: OpenAI's default of 16)."""
    return DEFAULT_COMPLETION_TOKENS if req.max_tokens is None else req.max_tokens


def chat_tokens(req: ChatRequest) -> int | None:
    """A chat request's token limit: max_completion_tokens, or max_tokens (its older name); both must agree."""
    a, b = req.max_tokens, req.max_completion_tokens
    if a is not None and b is not None and a != b:
        raise ApiError(f"max_tokens is {a} and max_completion_tokens is {b}; send one of them (max_tokens is the "
                       f"older name of max_completion_tokens)", param="max_completion_tokens")
    return b if b is not None else a


def chat_logprobs(req: ChatRequest) -> int | None:
    """The top-k count of a chat request's logprobs (None: none asked); top_logprobs needs logprobs: true."""
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None
