"""Incremental detokenizing for streamed output (the generation loop's ``on_token`` text pieces)."""
from __future__ import annotations


class TextStream:
    """One sequence's text as its tokens arrive: ``push(token)`` returns the new text piece, holding it back
    while the text ends in an incomplete UTF-8 sequence (U+FFFD); ``finish()`` returns what was held back.
    Tokens in ``eos`` are kept in ``ids`` but not decoded. ``ids``: every token pushed; ``text``: the text so far."""

    def __init__(self, tokenizer, eos: set[int]):
        self.tok, self.eos, self.ids, self.text = tokenizer, eos, [], ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        if token in self.eos:
            return ""
        new = self.tok.decode([t for t in self.ids if t not in self.eos])
        if new.endswith("\ufffd") or not new.startswith(self.text):
            return ""
        piece, self.text = new[len(self.text):], new
        return piece

    def finish(self) -> str:
        new = self.tok.decode([t for t in self.ids if t not in self.eos])
        piece = new[len(self.text):] if new.startswith(self.text) else ""
        self.text = new
        return piece
