"""OpenAI response bodies (plain dicts) from the engine's ``TokenOut``s: completions, chat completions, their
stream chunks, logprobs and usage, in the shapes the official ``openai`` client parses."""
from __future__ import annotations

import time
import uuid

from onekernel.serve.engine import TokenOut


def token_text(raw: bytes) -> str:
    """A token's text in logprobs: its bytes as UTF-8, or ``bytes:\\xe2\\x80`` (OpenAI's spelling) when they are
    not whole UTF-8 characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


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

    def _logprobs(self, outs: list[TokenOut]) -> dict | None:
        """Chat: ``{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``; completions:
        ``{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}``. A token's text is its bytes
        as UTF-8, or OpenAI's ``bytes:\\xNN`` spelling when they are part of a character, so no two tokens of a
        position share a key (``token_id:N`` if they still would)."""
        if not outs or outs[0].logprob is None:
            return None
        if self.chat:
            def entry(t: int, lp: float) -> dict:
                raw = self.tok.token_bytes([t])[0]
                return {"token": token_text(raw), "logprob": lp, "bytes": list(raw)}
            return {"content": [{**entry(o.token, o.logprob), "top_logprobs": [entry(t, lp) for t, lp in o.top]}
                                for o in outs]}
        offsets = []
        for o in outs:
            offsets.append(self.offset)
            self.offset += len(o.text)
        return {"tokens": [token_text(b) for b in self.tok.token_bytes([o.token for o in outs])],
                "token_logprobs": [o.logprob for o in outs], "top_logprobs": [self._top(o.top) for o in outs],
                "text_offset": offsets}

    def _top(self, top: list[tuple[int, float]]) -> dict[str, float]:
        keys: dict[str, float] = {}
        for (t, lp), raw in zip(top, self.tok.token_bytes([t for t, _ in top])):
            text = token_text(raw)
            keys[text if text not in keys else f"token_id:{t}"] = lp
        return keys

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

    def chunk(self, outs: list[TokenOut] | None, usage: dict | None = None) -> dict:
        """A stream chunk: the text of the tokens ``outs`` (one, or those whose text came with the last of them:
        the bytes of one character), the chat stream's first (role only: ``outs`` None), or the usage chunk (no
        choices) when ``usage`` is given."""
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        if usage is not None:
            return {**head, "choices": [], "usage": usage}
        if outs is None:
            return {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]}
        text = "".join(o.text for o in outs)
        return {**head, "choices": [self._choice(outs, text, {"content": text})]}
