"""The OpenAI request fields this server does not honour: each is accepted at its harmless values (what a client
sends when it does not use the feature: null, 1, 0, false, an empty list or object, "none"/"auto"), and any other
value is a 400 that names the field, says why and what to send instead. Fields that never change the answer
(``user``, ``metadata``, ``safety_identifier``, ``prompt_cache_key``, ``prompt_cache_retention``,
``parallel_tool_calls``, ``stream_options.include_obfuscation``) are accepted as they are."""
from __future__ import annotations

from onekernel.serve.protocol import ApiError


def _empty(v) -> bool:
    return v is None or v is False or v == 0 or v == "" or v == [] or v == {}


def _one_of(*ok):
    return lambda v: v is None or v in ok


_NO_TOOLS = "this server has no tool or function calling; leave it out"

# field -> (is the value harmless?, why another value is refused and what to send)
RULES = {
    "n": (_one_of(1), "n must be 1: one choice per request (send n requests for n choices)"),
    "best_of": (_one_of(1), "best_of must be 1: one candidate per request"),
    "echo": (_empty, "echo is not supported; leave it out or false"),
    "suffix": (_empty, "suffix (text after the insertion) is not supported; leave it out"),
    "presence_penalty": (_empty, "presence_penalty is not supported; leave it out or 0"),
    "frequency_penalty": (_empty, "frequency_penalty is not supported; leave it out or 0"),
    "logit_bias": (_empty, "logit_bias is not supported; leave it out or {}"),
    "tools": (_empty, f"tools are not supported: {_NO_TOOLS}"),
    "tool_choice": (_one_of("none", "auto"), f'tool_choice must be "none" or "auto": {_NO_TOOLS}'),
    "functions": (_empty, f"functions are not supported: {_NO_TOOLS}"),
    "function_call": (_one_of("none", "auto"), f'function_call must be "none" or "auto": {_NO_TOOLS}'),
    "response_format": (_one_of({"type": "text"}), 'response_format must be {"type": "text"}: JSON mode and JSON '
                        'schemas (constrained decoding) are not supported'),
    "modalities": (_one_of(["text"]), 'modalities must be ["text"]: this server writes text only'),
    "audio": (_empty, "audio output is not supported; leave it out"),
    "prediction": (_empty, "predicted outputs are not supported; leave prediction out"),
    "reasoning_effort": (_empty, "reasoning_effort is not supported: the model has no reasoning setting"),
    "verbosity": (_empty, "verbosity is not supported: the model has no verbosity setting"),
    "web_search_options": (_empty, "web search is not supported; leave web_search_options out"),
    "store": (_empty, "store must be false: this server stores no completions"),
    "service_tier": (_one_of("auto", "default"), 'service_tier must be "auto" or "default": there is one tier'),
}


def check_unsupported(req) -> None:
    """ApiError (400, ``param`` the field) for the first field of ``req`` set to a value it cannot honour."""
    for name in req.model_fields_set:
        rule = RULES.get(name)
        if rule is not None and not rule[0](getattr(req, name)):
            raise ApiError(rule[1], param=name, code="unsupported_parameter")


# a message's fields that only tool calls, audio or a replayed assistant turn fill: accepted empty
_MESSAGE_RULES = {"tool_calls": _NO_TOOLS, "function_call": _NO_TOOLS, "tool_call_id": _NO_TOOLS,
                  "audio": "audio messages are not supported; send the transcript as content",
                  "refusal": "send the refusal's text as the content",
                  "name": "the chat template has no place for a speaker's name; put it in the content"}


def check_message_fields(msg, where: str) -> None:
    """ApiError for a message (``where``: "messages[i]") with a non-empty field of ``_MESSAGE_RULES``."""
    for name, why in _MESSAGE_RULES.items():
        if not _empty(getattr(msg, name)):
            raise ApiError(f"{where}.{name} is not supported: {why}", param=f"{where}.{name}",
                           code="unsupported_parameter")
