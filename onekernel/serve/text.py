"""A request's output text as tokens arrive, with OpenAI stop strings: text that may be the start of a stop
string is held back until it is known not to be; the stop string and what follows it are never sent."""
from __future__ import annotations


class WindowText:
    """Incremental detokenizing in O(1) per token (vLLM's window): only the tokens since the last complete
    piece are decoded, so a long answer does not re-decode its whole text at every token (as
    ``runtime.stream.TextStream`` does). Exact for byte-level tokenizers (the window always starts at a
    character boundary); a tokenizer that cleans up spaces across tokens may differ from a whole decode at a
    window's edge. ``push(token) -> piece`` ("" while the text ends in an incomplete UTF-8 sequence; tokens in
    ``hidden`` are not decoded), ``finish() -> what was held back``."""

    def __init__(self, tokenizer, hidden: set[int]):
        self.tok, self.hidden, self.window = tokenizer, hidden, []  # window: [0, read) decoded, [read:] not yet
        self.read = 0

    def push(self, token: int) -> str:
        if token in self.hidden:
            return ""
        self.window.append(token)
        return self._piece(final=False)

    def finish(self) -> str:
        return self._piece(final=True)

    def _piece(self, final: bool) -> str:
        done, new = self.tok.decode(self.window[:self.read]), self.tok.decode(self.window)
        if not final and (len(new) <= len(done) or new.endswith("\ufffd")):
            return ""
        piece = new[len(done):]
        self.window, self.read = self.window[self.read:], len(self.window) - self.read
        return piece


class StopText:
    """``push(token) -> (piece, stopped)``: the new text to send, and whether a stop string was found (the
    piece then ends just before it). ``flush()`` returns the text held back (call it when the request ends
    for another reason). Tokens in ``hidden`` (EOS, stop token ids) are not decoded. ``text``: all text sent."""

    def __init__(self, tokenizer, stop: tuple[str, ...], hidden: set[int]):
        self.stream, self.stop, self.full, self.text = WindowText(tokenizer, hidden), stop, "", ""

    def push(self, token: int) -> tuple[str, bool]:
        self.full += self.stream.push(token)
        return self._take(final=False)

    def flush(self) -> str:
        self.full += self.stream.finish()
        return self._take(final=True)[0]

    def _take(self, final: bool) -> tuple[str, bool]:
        # text sent never holds the start of a stop string, so one can only begin after it
        hits = [i for i in (self.full.find(s, len(self.text)) for s in self.stop) if i >= 0]
        if hits:
            end, stopped = min(hits), True
        else:
            end, stopped = len(self.full), False
            if not final:  # hold back a tail that begins a stop string
                end -= max((k for s in self.stop for k in range(1, len(s)) if self.full.endswith(s[:k])), default=0)
        piece = self.full[len(self.text):max(end, len(self.text))]
        self.text += piece
        return piece, stopped
