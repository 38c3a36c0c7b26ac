"""OpenAI request bodies (pydantic, strict JSON types, finite numbers, no unknown fields) and ``ApiError``.

Every field of OpenAI's completions and chat completions requests is declared, so an unknown key is a 400 that
names it (as OpenAI's own API answers "Unrecognized request argument"); each field's ``description`` says what
it takes, in the words the 400 for a bad value uses (``invalid.py``). Fields this server cannot honour are
accepted only at their harmless values (``unsupported.py``); ``null`` means the default everywhere, as in
OpenAI's API. Extensions (vLLM's names): ``top_k``, ``stop_token_ids``, ``ignore_eos``, ``return_token_ids``.
Union-typed fields (``prompt``, ``stop``, a message's ``content``) are checked by hand (``checks.py``), so their
errors name the field, not pydantic's union members.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from onekernel.models.random_init import SEED_RANGE

MAX_STOP = 4  # stop strings per request, as OpenAI's API allows
MAX_TOP_LOGPROBS = 20
FLAG = "true or false, or null"


class ApiError(Exception):
    """An OpenAI-style error: HTTP ``status``, ``message``, ``type``, ``param`` (the field), ``code``."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        """The response body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _f(default, what: str, **limits):
    return Field(default, description=what, **limits)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` honoured; ``include_obfuscation`` accepted (nothing is padded)."""
    include_usage: bool | None = _f(None, FLAG)
    include_obfuscation: bool | None = _f(None, FLAG)


class ChatMessage(_Body):
    """One message. ``content`` and the fields of an assistant message sent back (``refusal``, ``tool_calls``,
    ``function_call``, ``audio``: accepted empty) are checked in ``checks.py``."""
    role: str = _f(..., 'one of "system", "developer", "user", "assistant"')
    content: JsonValue = _f(None, 'a string or a list of text parts ({"type": "text", "text": "..."})')
    name: str | None = _f(None, "a string")
    refusal: str | None = _f(None, "null")
    tool_calls: list[JsonValue] | None = _f(None, "an empty list or null")
    function_call: JsonValue = _f(None, "null")
    audio: JsonValue = _f(None, "null")
    tool_call_id: str | None = _f(None, "null")


class _Common(_Body):
    model: str | None = _f(None, "a string: the served model's id (GET /v1/models)")
    max_tokens: int | None = _f(None, "an integer >= 1, or null", ge=1)
    temperature: float | None = _f(None, "a number from 0 to 2 (0: greedy), or null", ge=0.0, le=2.0)
    top_p: float | None = _f(None, "a number greater than 0 and at most 1, or null", gt=0.0, le=1.0)
    top_k: int | None = _f(None, "an integer >= -1 (-1 or 0: no limit), or null", ge=-1)
    seed: int | None = _f(None, f"an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]}, or null",
                          ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: JsonValue = _f(None, f"a string or a list of up to {MAX_STOP} strings, or null")
    stop_token_ids: list[int] | None = _f(None, "a list of token ids (integers), or null")
    n: int | None = _f(None, "the integer 1, or null")
    stream: bool | None = _f(None, FLAG)
    stream_options: StreamOptions | None = _f(None, 'an object such as {"include_usage": true}, or null')
    ignore_eos: bool | None = _f(None, FLAG)
    return_token_ids: bool | None = _f(None, FLAG)
    presence_penalty: float | None = _f(None, "a number from -2 to 2 (only 0 is supported), or null", ge=-2, le=2)
    frequency_penalty: float | None = _f(None, "a number from -2 to 2 (only 0 is supported), or null", ge=-2, le=2)
    logit_bias: dict[str, float] | None = _f(None, "an object of token id -> number (only {} is supported)")
    user: str | None = _f(None, "a string (an end-user id; not used)")


class CompletionRequest(_Common):
    """``POST /v1/completions``."""
    prompt: JsonValue = _f(..., "a string, a list of token ids, or a list holding one of either")
    logprobs: int | None = _f(None, f"an integer from 0 to {MAX_TOP_LOGPROBS}, or null", ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = _f(None, "false or null (echo is not supported)")
    suffix: str | None = _f(None, "null (suffix is not supported)")
    best_of: int | None = _f(None, "the integer 1, or null")


class ChatRequest(_Common):
    """``POST /v1/chat/completions``."""
    messages: list[ChatMessage] = _f(..., "a list of at least one message ({\"role\": ..., \"content\": ...})",
                                     min_length=1)
    max_completion_tokens: int | None = _f(None, "an integer >= 1, or null", ge=1)
    logprobs: bool | None = _f(None, FLAG)
    top_logprobs: int | None = _f(None, f"an integer from 0 to {MAX_TOP_LOGPROBS}, or null", ge=0,
                                  le=MAX_TOP_LOGPROBS)
    tools: list[JsonValue] | None = _f(None, "an empty list or null (tools are not supported)")
    tool_choice: JsonValue = _f(None, '"none", "auto" or null (tools are not supported)')
    parallel_tool_calls: bool | None = _f(None, FLAG)
    functions: list[JsonValue] | None = _f(None, "an empty list or null (functions are not supported)")
    function_call: JsonValue = _f(None, '"none", "auto" or null (functions are not supported)')
    response_format: JsonValue = _f(None, '{"type": "text"} or null')
    modalities: list[str] | None = _f(None, '["text"] or null')
    audio: JsonValue = _f(None, "null (audio output is not supported)")
    prediction: JsonValue = _f(None, "null (predicted outputs are not supported)")
    reasoning_effort: JsonValue = _f(None, "null (the model has no reasoning setting)")
    verbosity: JsonValue = _f(None, "null (the model has no verbosity setting)")
    web_search_options: JsonValue = _f(None, "null (web search is not supported)")
    store: bool | None = _f(None, "false or null (nothing is stored)")
    metadata: dict[str, str] | None = _f(None, "an object of string -> string (tags; not used)")
    service_tier: str | None = _f(None, '"auto", "default" or null')
    prompt_cache_key: str | None = _f(None, "a string (a caching hint; not used)")
    prompt_cache_retention: str | None = _f(None, "a string (a caching hint; not used)")
    safety_identifier: str | None = _f(None, "a string (an end-user id; not used)")
