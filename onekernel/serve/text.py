"""A request's output text as tokens arrive, with OpenAI stop strings: text that may be the start of a stop
string is held back until it is known not to be; the stop string and what follows it are never sent."""
from __future__ import annotations

from onekernel.runtime.stream import TextStream


class StopText:
    """``push(token) -> (piece, stopped)``: the new text to send, and whether a stop string was found (the
    piece then ends just before it). ``flush()`` returns the text held back (call it when the request ends
    for another reason). Tokens in ``hidden`` (EOS, stop token ids) are not decoded. ``text``: all text sent."""

    def __init__(self, tokenizer, stop: tuple[str, ...], hidden: set[int]):
        self.stream, self.stop, self.full, self.text = TextStream(tokenizer, hidden), stop, "", ""

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
