"""OpenAI request bodies (pydantic, strict JSON types) and their checks -> an engine ``GenRequest``.

Unknown fields are ignored (as the OpenAI API and vLLM do). Each bad field raises ``ApiError`` (HTTP 400, or 404
for an unknown model) naming the field in ``param``; the app turns it into an OpenAI-style error body.
Extensions (vLLM's names): ``top_k``, ``stop_token_ids``, ``ignore_eos``, ``return_token_ids``.
"""
from __future__ import annotations

import secrets
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from onekernel.errors import InputError
from onekernel.runtime.sampling import SamplingParams
from onekernel.serve.engine import GenRequest

MAX_STOP = 4  # stop strings per request, as OpenAI's API allows
MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    """An OpenAI-style error: HTTP ``status``, ``message``, ``type``, ``param`` (the field), ``code``."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=0, lt=2 ** 63)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


def _unsupported(req: _Common) -> None:
    if req.n != 1:
        raise ApiError(f"n must be 1 (one choice per request), got {req.n}", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise ApiError(f"{name} is not supported; leave it at 0", param=name)
    if req.logit_bias:
        raise ApiError("logit_bias is not supported", param="logit_bias")
    for name in ("echo", "suffix", "best_of"):
        if getattr(req, name, None) not in (None, False, 1):
            raise ApiError(f"{name} is not supported", param=name)


def _stops(req: _Common, vocab_size: int) -> tuple[tuple[str, ...], frozenset[int]]:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP:
        raise ApiError(f"at most {MAX_STOP} stop strings are allowed, got {len(stop)}", param="stop")
    if any(not s for s in stop):
        raise ApiError("a stop string is empty; every stop string needs at least one character", param="stop")
    ids = list(req.stop_token_ids or [])
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ApiError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab_size})",
                       param="stop_token_ids")
    return tuple(stop), frozenset(ids)


def completion_prompt(req: CompletionRequest, tokenizer, vocab_size: int) -> list[int]:
    """The prompt's token ids: a string, a list of ids, or a list of one of either."""
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        if len(p) != 1:
            raise ApiError(f"one prompt per request is supported, got a list of {len(p)}", param="prompt")
        p = p[0]
    ids = tokenizer.encode(p) if isinstance(p, str) else list(p)
    if not ids or (isinstance(p, str) and not p):
        raise ApiError("the prompt is empty; give at least one token of text", param="prompt")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ApiError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})", param="prompt")
    return ids


def chat_prompt(req: ChatRequest, tokenizer) -> list[int]:
    """The chat template applied to the messages, their contents kept as plain text (``Tokenizer.chat_plain``)."""
    msgs = [{"role": m.role, "content": m.content if isinstance(m.content, str)
             else "".join(part.text for part in m.content)} for m in req.messages]
    if not any(m["content"] for m in msgs):
        raise ApiError("every message is empty; give some text", param="messages")
    try:
        return tokenizer.chat_plain(msgs)
    except InputError as e:
        raise ApiError(str(e), param="messages") from None


def to_gen_request(req: _Common, prompt_ids: list[int], max_tokens: int | None, context: int,
                   vocab_size: int, top_logprobs: int | None) -> GenRequest:
    """Check the common fields against the context (``context`` positions) and build the engine's request.
    ``max_tokens`` None: up to the context. Raises ApiError."""
    _unsupported(req)
    stop, stop_ids = _stops(req, vocab_size)
    room = context - len(prompt_ids)
    if room < 1:
        raise ApiError(f"the prompt has {len(prompt_ids)} tokens, which fills the context of {context}; shorten "
                       f"it", param="prompt" if hasattr(req, "prompt") else "messages",
                       code="context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        n = len(prompt_ids)
        raise ApiError(f"the prompt has {n} token{'s' * (n != 1)} and max_tokens is {max_tokens}: "
                       f"{len(prompt_ids) + max_tokens} positions, over the context of {context}; lower max_tokens "
                       f"to at most {room}", param="max_tokens", code="context_length_exceeded")
    seed = req.seed if req.seed is not None else secrets.randbits(63)
    try:
        sampling = SamplingParams(req.temperature, None if req.top_k in (None, -1) else req.top_k, req.top_p, seed)
    except InputError as e:
        raise ApiError(str(e).replace(" (--temperature)", "").replace(" (--top-k)", ""),
                       param="temperature" if "temperature" in str(e) else "top_k") from None
    return GenRequest(prompt_ids, max_tokens or room, sampling, stop, stop_ids, req.ignore_eos, top_logprobs)
