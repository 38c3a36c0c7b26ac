"""A request body pydantic refused -> one ``ApiError`` in the request's own terms: the field as the request spells
it (``messages[0].role``, ``stream_options.include_usage``), what it takes (the field's ``description`` in
``protocol.py``) and what was sent, e.g. ``temperature must be a number from 0 to 2 (0: greedy), or null; got
NaN``. An unknown field is named with the fields its object has (and the nearest spelling)."""
from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel

from onekernel.serve.checks import shown
from onekernel.serve.protocol import ApiError, ChatMessage

# fields a model declares only to refuse (or accept empty) with a reason: not offered for an unknown key
REFUSED = {ChatMessage: {"name", "refusal", "tool_calls", "function_call", "audio", "tool_call_id"}}
# what a list element must be, for a list of objects (``messages: ["hi"]``)
ELEMENT = {ChatMessage: 'an object with a "role" and a "content", such as {"role": "user", "content": "hi"}'}


def _model_in(annotation) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (``Model``, ``list[Model]``, ``Model | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _walk(model: type[BaseModel], loc: tuple) -> tuple[str, str, type[BaseModel] | None, str | None]:
    """(the path as the request spells it, its parent's path, the model holding the last field, that field's
    description). The walk stops at a field that is not a model (inside a list of ids or a mapping)."""
    path, parent, owner, holder, desc = "", "", model, None, None
    for key in loc:
        if owner is None:
            break
        if isinstance(key, int):
            path += f"[{key}]"
            continue
        parent, path = path, f"{path}.{key}" if path else str(key)
        field = owner.model_fields.get(key)
        holder, desc = owner, field.description if field is not None else None
        owner = _model_in(field.annotation) if field is not None else None
    return path, parent, holder, desc


def _unknown(path: str, parent: str, key: str, holder: type[BaseModel]) -> str:
    fields = sorted(set(holder.model_fields) - REFUSED.get(holder, set()))
    near = difflib.get_close_matches(key, fields, n=1, cutoff=0.8)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"{path} is not a field this server knows{hint}; {parent or 'the request'} can have: {', '.join(fields)}"


def _not_json(body: bytes, content_type: str | None) -> ApiError:
    """A body FastAPI did not parse as JSON (sent without Content-Type: application/json): its start as text."""
    text = body.decode("utf-8", "replace")
    start = text if len(text) <= 60 else text[:57] + "..."
    return ApiError(f"the request body must be a JSON object sent with Content-Type: application/json; it came "
                    f"as {content_type or 'no Content-Type'}: {start}")


def validation_error(model: type[BaseModel], errors: list[dict], content_type: str | None = None) -> ApiError:
    """The ApiError (400) for FastAPI's ``RequestValidationError.errors()`` on a body of ``model``: an unknown
    field first (it often explains a missing one), else the first error. ``content_type``: the request's."""
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    kind, loc = err.get("type"), tuple(err.get("loc", ()))[1:]  # loc[0] is "body"
    if kind == "json_invalid":
        return ApiError(f"the request body is not valid JSON ({err.get('ctx', {}).get('error', err.get('msg'))})")
    if kind == "string_unicode":  # a key holding a lone surrogate (values are checked in checks.py)
        path = _walk(model, loc)[0]
        return ApiError(f"a key of {path or 'the request'} is not valid UTF-8 text (got {shown(err.get('input'))}); "
                        f"send UTF-8 text", param=path or None)
    if not loc and isinstance(err.get("input"), bytes):
        return _not_json(err["input"], content_type)
    if not loc:
        return ApiError("the request body must be a JSON object (Content-Type: application/json); got "
                        f"{shown(err.get('input'))}")
    path, parent, holder, desc = _walk(model, loc)
    if kind == "extra_forbidden":
        return ApiError(_unknown(path, parent, str(loc[-1]), holder), param=path, code="unknown_parameter")
    if kind in ("model_type", "model_attributes_type") and isinstance(loc[-1], int):  # in a list of objects
        field = holder.model_fields.get(next(k for k in reversed(loc) if isinstance(k, str)))
        desc = ELEMENT.get(_model_in(field.annotation) if field else None, "an object")
    desc = desc or "a value of the type OpenAI's API gives it"
    if kind == "missing":
        return ApiError(f"{path} is required: {desc}", param=path)
    return ApiError(f"{path} must be {desc}; got {shown(err.get('input'))}", param=path)
