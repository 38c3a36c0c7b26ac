"""OpenAI response bodies (plain dicts) from the engine's ``TokenOut``s: completions, chat completions, their
stream chunks, logprobs and usage, in the shapes the official ``openai`` client parses."""
from __future__ import annotations

import time
import uuid

from onekernel.serve.engine import TokenOut


class Formatter:
    """The bodies of one request. ``chat``: chat.completion shapes, else text_completion; ``token_ids``: add
    the generated ids to each choice (vLLM's ``return_token_ids``)."""

    def __init__(self, tokenizer, model: str, chat: bool, prompt_ids: list[int], token_ids: bool):
        self.tok, self.model, self.chat, self.prompt_ids, self.token_ids = tokenizer, model, chat, prompt_ids, token_ids
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.offset = 0  # completions' text_offset of the next token

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, outs: list[TokenOut]) -> dict:
        n = len(self.prompt_ids)
        return {"prompt_tokens": n, "completion_tokens": len(outs), "total_tokens": n + len(outs)}

    def _piece(self, token: int) -> str:
        return self.tok.decode([token])

    def _logprobs(self, outs: list[TokenOut]) -> dict | None:
        if not outs or outs[0].logprob is None:
            return None
        if self.chat:
            def entry(t: int, lp: float) -> dict:
                s = self._piece(t)
                return {"token": s, "logprob": lp, "bytes": list(s.encode())}
            return {"content": [{**entry(o.token, o.logprob), "top_logprobs": [entry(t, lp) for t, lp in o.top]}
                                for o in outs]}
        offsets = []
        for o in outs:
            offsets.append(self.offset)
            self.offset += len(o.text)
        return {"tokens": [self._piece(o.token) for o in outs], "token_logprobs": [o.logprob for o in outs],
                "top_logprobs": [{self._piece(t): lp for t, lp in o.top} for o in outs], "text_offset": offsets}

    def _choice(self, outs: list[TokenOut], text: str, delta: dict | None) -> dict:
        c = {"index": 0, "logprobs": self._logprobs(outs), "finish_reason": outs[-1].finish_reason if outs else None}
        if self.chat:
            c["delta" if delta is not None else "message"] = delta if delta is not None else {
                "role": "assistant", "content": text}
        else:
            c["text"] = text
        if self.token_ids:
            c["token_ids"] = [o.token for o in outs]
        return c

    def response(self, outs: list[TokenOut]) -> dict:
        """The whole (non-streamed) response."""
        text = "".join(o.text for o in outs)
        body = {**self._head("chat.completion" if self.chat else "text_completion"),
                "choices": [self._choice(outs, text, None)], "usage": self.usage(outs)}
        if self.token_ids:
            body["prompt_token_ids"] = self.prompt_ids
        return body

    def chunk(self, out: TokenOut | None, usage: dict | None = None) -> dict:
        """A stream chunk: one token's (``out``), the chat stream's first (role only: ``out`` None), or the
        usage chunk (no choices) when ``usage`` is given."""
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        if usage is not None:
            return {**head, "choices": [], "usage": usage}
        if out is None:
            return {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]}
        return {**head, "choices": [self._choice([out], out.text, {"content": out.text})]}
