"""The HTTP routes (FastAPI): ``POST /v1/completions``, ``POST /v1/chat/completions`` (both streamed as
server-sent events with ``stream: true``), ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``,
``GET /metrics``.

Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed
JSON, missing or wrongly typed fields and bad values, 404 for an unknown model or route, 429 when the wait
queue is full, 503 when the engine has failed. A request's tokens come from the engine thread through an
``asyncio.Queue``; a client that goes away cancels its request (its slot is freed before the next step).
"""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from onekernel.serve.engine import Engine, EngineStoppedError, QueueFullError, TokenOut
from onekernel.serve.format import Formatter
from onekernel.serve.checks import (chat_logprobs, chat_prompt, chat_tokens, completion_prompt,
                                    completion_tokens, to_gen_request)
from onekernel.serve.invalid import validation_error
from onekernel.serve.protocol import ApiError, ChatRequest, CompletionRequest

DISCONNECT_POLL_S = 0.5  # how often a non-streamed request checks that its client is still there
BODIES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest}


def create_app(engine: Engine, model_name: str) -> FastAPI:
    """The app serving ``engine`` under the model id ``model_name`` (the engine must be started)."""
    app = FastAPI(title="onekernel", docs_url=None, redoc_url=None)
    tok, cfg = engine.model.tokenizer, engine.model.config
    context, created = engine.cache.max_seq_len, int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        err = validation_error(BODIES[request.url.path], exc.errors(), request.headers.get("content-type"))
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # e.g. not UTF-8
            exc.detail = "the request body could not be read as JSON; send UTF-8 JSON text"
        return JSONResponse(ApiError(str(exc.detail), status=exc.status_code,
                                     code="not_found" if exc.status_code == 404 else None).body(),
                            status_code=exc.status_code)

    @app.get("/health")
    async def health():
        ok = engine.healthy
        status = "ok" if ok else "shutting down" if engine.draining else "engine stopped"
        return JSONResponse({"status": status}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.text(), media_type=engine.metrics.content_type)

    card = {"id": model_name, "object": "model", "created": created, "owned_by": "onekernel", "max_model_len": context}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card]}

    def check_model(name: str | None) -> None:
        if name not in (None, model_name):
            raise ApiError(f"the model {name!r} does not exist; this server serves {model_name!r}", status=404,
                           param="model", code="model_not_found")

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        check_model(model_id)
        return card

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_model(body.model)
        ids = completion_prompt(body, tok, cfg.vocab_size)
        gen = to_gen_request(body, ids, completion_tokens(body), context, cfg.vocab_size, body.logprobs)
        return await _serve(request, engine, gen, body, Formatter(tok, model_name, False, ids,
                                                                  bool(body.return_token_ids)))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        check_model(body.model)
        ids = chat_prompt(body, tok)
        gen = to_gen_request(body, ids, chat_tokens(body), context, cfg.vocab_size, chat_logprobs(body))
        return await _serve(request, engine, gen, body, Formatter(tok, model_name, True, ids,
                                                                  bool(body.return_token_ids)))

    return app


async def _serve(request: Request, engine: Engine, gen, body, fmt: Formatter):
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    try:
        handle = engine.submit(gen, lambda item: loop.call_soon_threadsafe(queue.put_nowait, item))
    except QueueFullError as e:
        raise ApiError(str(e), status=429, type="rate_limit_error", code="queue_full") from None
    except EngineStoppedError as e:
        raise ApiError(str(e), status=503, type="server_error", code="engine_stopped") from None

    async def tokens():
        while True:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            yield item
            if item.finish_reason:
                return

    if body.stream:
        usage = body.stream_options is not None and bool(body.stream_options.include_usage)
        return StreamingResponse(_sse(tokens(), fmt, handle, usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        outs = await _collect(request, tokens())
    except EngineStoppedError as e:
        raise ApiError(str(e), status=503, type="server_error", code="engine_stopped") from None
    finally:
        handle.cancel()
    if outs is None:  # the client went away
        return Response(status_code=499)
    return fmt.response(outs)


async def _collect(request: Request, tokens) -> list[TokenOut] | None:
    """Every token of a non-streamed request, or None when its client disconnected first."""
    outs: list[TokenOut] = []

    async def run():
        async for out in tokens:
            outs.append(out)
    task = asyncio.ensure_future(run())
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            task.result()
            return outs
        if await request.is_disconnected():
            task.cancel()
            return None


async def _sse(tokens, fmt: Formatter, handle, usage: bool):
    """The event stream: (chat: a role chunk), a chunk per token that brings text (a token of no text yet, part
    of a character or held back for a stop string, goes with the next one; with logprobs every token has its
    chunk), the last with ``finish_reason``, (a usage chunk), ``data: [DONE]``."""
    outs, held = [], []
    try:
        if fmt.chat:
            yield f"data: {json.dumps(fmt.chunk(None))}\n\n"
        try:
            async for out in tokens:
                outs.append(out)
                held.append(out)
                if out.text or out.finish_reason or out.logprob is not None:
                    yield f"data: {json.dumps(fmt.chunk(held))}\n\n"
                    held = []
        except EngineStoppedError as e:
            yield f"data: {json.dumps(ApiError(str(e), status=503, type='server_error').body())}\n\n"
        if usage:
            yield f"data: {json.dumps(fmt.chunk(None, fmt.usage(outs)))}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        handle.cancel()
