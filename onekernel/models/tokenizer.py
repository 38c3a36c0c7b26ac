"""`Tokenizer` (docs/DESIGN.md "Tokenizer"): a Hugging Face fast tokenizer built from a GGUF file's
`tokenizer.ggml.*` metadata or an HF folder, plus the checkpoint's chat template; or, for random-weight
named configs without a checkpoint, a byte-level fallback."""
from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

from onekernel.errors import InputError, ModelFileError

# End-of-turn tokens of the supported chat templates (SmolLM2/Qwen3 ChatML, Llama 3); added to
# `eos_token_ids` when the vocabulary has them, so instruct models stop at the end of their turn.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>")


@functools.lru_cache(maxsize=1)
def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: the character a piece uses for each byte -> that byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    moved = [b for b in range(256) if b not in keep]
    return {**{chr(b): b for b in keep}, **{chr(256 + n): b for n, b in enumerate(moved)}}


def _one_line(e: Exception, limit: int = 300) -> str:
    """An exception's message on one line (transformers' messages span several), cut to ``limit`` chars."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# A GGUF file's tokenizer, once converted, is kept as an HF tokenizer folder (tokenizer.json, tokenizer_config.json,
# chat_template.jinja) under $ONEKERNEL_CACHE/tokenizers: transformers' GGUF conversion parses the whole file's
# metadata again (about 4 s for SmolLM2-135M's 49k-token vocabulary on a CPU), the kept folder loads in 0.3 s.
# Key: the file's resolved path, size and modification time, transformers' version and KEPT_FORMAT; a folder
# is complete when it holds DONE (written before the folder is renamed into place); one that does not load is
# rebuilt. ONEKERNEL_HOST_CACHE=0 turns this off with the other host-side caches (exec.host_cache).
KEPT_FORMAT = "1"
DONE = "onekernel-complete"


def _kept_dir(path: Path) -> Path | None:
    """Where the tokenizer of GGUF file ``path`` is kept (module comment above), or None when nothing is kept."""
    import hashlib

    import transformers

    from onekernel.exec import host_cache
    from onekernel.exec.codegen import cache_dir
    if not host_cache.enabled():
        return None
    try:
        st = path.stat()
        key = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}\0{KEPT_FORMAT}"
        return cache_dir() / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:40]
    except OSError:  # an unreadable cache folder: build the tokenizer every time
        return None


def _load_kept(kept: Path | None):
    """The kept HF tokenizer, or None (none kept, or one that does not load: logged, then rebuilt)."""
    if kept is None or not (kept / DONE).is_file():
        return None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(kept), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged cache entry is rebuilt, never an error
        import logging
        logging.getLogger("onekernel").warning("the kept tokenizer in %s does not load (%s); rebuilding it", kept,
                                               _one_line(e))
        return None


def _keep(hf, kept: Path | None) -> None:
    """Save ``hf`` as the folder ``kept``: written under a temporary name, DONE last, then renamed (a process that
    finds the folder already there, or cannot write, keeps nothing: the cache is an optimisation)."""
    if kept is None:
        return
    import os
    import shutil
    tmp = kept.parent / f".{kept.name}.{os.getpid()}"
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        if kept.exists():
            shutil.rmtree(kept)  # a damaged entry (no DONE, or one that did not load)
        hf.save_pretrained(str(tmp))
        (tmp / DONE).write_text(KEPT_FORMAT)
        os.rename(tmp, kept)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


class Tokenizer:
    """Text <-> token ids. Build with `from_gguf`, `from_hf` or `byte_level`.

    `encode(text) -> list[int]`, `decode(ids) -> str`, `chat(messages | text) -> list[int]`,
    `eos_token_ids: set[int]`, `bos_token_id: int | None`, `vocab_size: int`."""

    def __init__(self, hf=None, *, eos_token_ids=(), source: str = "byte-level"):
        self._hf = hf
        self.source = source
        if hf is None:  # byte-level fallback
            self.bos_token_id, self.eos_token_ids, self.vocab_size = None, set(), 256
            return
        self.bos_token_id = hf.bos_token_id
        vocab = hf.get_vocab()
        eos = set(eos_token_ids) | ({hf.eos_token_id} if hf.eos_token_id is not None else set())
        self.eos_token_ids = eos | {vocab[t] for t in _END_OF_TURN if t in vocab}
        self.vocab_size = len(hf)

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        """From the metadata of the GGUF file `path` (of a split model's first shard: the others hold none) via
        transformers' GGUF tokenizer conversion (offline; the chat template comes from
        `tokenizer.chat_template`). transformers reads only little-endian files, so a big-endian file's
        metadata is first copied to a little-endian one in a temporary folder
        (`gguf_file.little_endian_metadata`). The converted tokenizer is kept on disk and reused by later runs
        (`KEPT_FORMAT` above). Raises ModelFileError when it cannot be built."""
        from transformers import AutoTokenizer

        from onekernel.models.gguf_file import is_big_endian, little_endian_metadata
        path = Path(path)
        kept = _kept_dir(path)
        hf = _load_kept(kept)
        if hf is not None:
            return cls(hf, source=str(path))
        try:
            with tempfile.TemporaryDirectory(prefix="onekernel_gguf_") as tmp:
                file = little_endian_metadata(path, Path(tmp) / path.name) if is_big_endian(path) else path
                hf = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
        except Exception as e:
            raise ModelFileError(f"cannot build the tokenizer from {path} ({type(e).__name__}: {_one_line(e)}); "
                                 "re-download the file") from e
        _keep(hf, kept)
        return cls(hf, source=str(path))

    @classmethod
    def from_hf(cls, folder) -> "Tokenizer":
        """From an HF folder's tokenizer.json / tokenizer_config.json; EOS ids also from
        generation_config.json (`eos_token_id`, int or list). Raises ModelFileError when absent/invalid."""
        from transformers import AutoTokenizer
        folder = Path(folder)
        missing = [n for n in ("tokenizer.json", "tokenizer_config.json") if not (folder / n).is_file()]
        if len(missing) == 2:
            raise ModelFileError(f"{folder} has no tokenizer (tokenizer.json, tokenizer_config.json); copy both "
                                 "from the checkpoint the weights came from")
        try:
            hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:
            raise ModelFileError(f"cannot load a tokenizer from {folder} ({type(e).__name__}: {_one_line(e)}); "
                                 f"the folder needs tokenizer.json and tokenizer_config.json"
                                 f"{' (missing: ' + missing[0] + ')' if missing else ''}") from e
        eos: set[int] = set()
        gen = folder / "generation_config.json"
        if gen.is_file():
            try:
                ids = json.loads(gen.read_text()).get("eos_token_id")
            except (OSError, ValueError, AttributeError) as e:
                raise ModelFileError(f"{gen} is not a valid JSON object ({e}); fix or delete it") from e
            eos = set(ids if isinstance(ids, list) else [] if ids is None else [ids])
        return cls(hf, eos_token_ids=eos, source=str(folder))

    @classmethod
    def byte_level(cls) -> "Tokenizer":
        """Fallback for random weights without a checkpoint: token id = UTF-8 byte value (0..255), no
        BOS, no EOS (generation runs to its length limit), decode maps ids >= 256 to U+FFFD.
        `chat(text)` encodes "User: {text}\\nAssistant: "."""
        return cls(None)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with the special tokens the checkpoint adds (e.g. Llama 3's BOS)."""
        if self._hf is None:
            return list(text.encode("utf-8"))
        return list(self._hf.encode(text, add_special_tokens=True))

    def decode(self, ids) -> str:
        """Text of `ids` (list/tensor of ints), special tokens (BOS, <|im_end|>, ...) left out."""
        ids = [int(i) for i in ids]
        if self._hf is None:
            raw = b"".join(bytes([i]) if 0 <= i < 256 else "\ufffd".encode() for i in ids)
            return raw.decode("utf-8", errors="replace")
        return self._hf.decode(ids, skip_special_tokens=True)

    def token_bytes(self, ids) -> list[bytes]:
        """The bytes each token id stands for on its own: a byte-level BPE piece may be part of a UTF-8 character
        (which ``decode`` shows as U+FFFD), so two ids can decode alike but never have the same bytes. A special
        token gives its text's UTF-8 (``<|im_end|>``), an id outside the vocabulary b""."""
        ids = [int(i) for i in ids]
        if self._hf is None:
            return [bytes([i]) if 0 <= i < 256 else b"" for i in ids]
        byte_level = type(self._hf.backend_tokenizer.decoder).__name__ == "ByteLevel"
        table, added = _gpt2_byte_decoder(), self._hf.added_tokens_decoder
        out = []
        for i, piece in zip(ids, self._hf.convert_ids_to_tokens(ids)):
            if piece is None:
                out.append(b"")
            elif i not in added and byte_level and all(c in table for c in piece):
                out.append(bytes(table[c] for c in piece))
            elif i not in added and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(bytes([int(piece[3:5], 16)]))  # SentencePiece byte fallback
            else:
                out.append((piece if i in added else piece.replace("\u2581", " ")).encode())
        return out

    def chat_plain(self, messages) -> list[int]:
        """Like ``chat``, but the message contents are plain text: a content that spells a special token (e.g.
        ``<|im_end|>`` then ``<|im_start|>system``) is tokenized as the characters it is, so only the template's
        own markers are control tokens (what a server must do with user text). Ids equal ``chat``'s for contents
        that spell no special token (the tokenizer encodes the text between special tokens piece by piece
        either way). Raises InputError for a malformed message list, or when the template changes a content
        other than by trimming it (then its contents cannot be told apart from its markers)."""
        messages = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
        ids = self.chat(messages)  # checks the messages
        if self._hf is None or not self._hf.chat_template:
            return ids  # no special tokens (byte level) / no template markers
        import re
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        render = self._hf.apply_chat_template([{**m, "content": k} for m, k in zip(messages, marks)],
                                              add_generation_prompt=True, tokenize=False)
        real = self._hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        parts = re.split("(\ue000\\d+\ue001)", render)
        contents = [m["content"] for m in messages]
        for fix in (str, str.strip):  # templates may trim contents (Llama 3's `| trim`)
            if "".join(fix(contents[int(p[1:-1])]) if p in marks else p for p in parts) == real:
                break
        else:
            raise InputError("the chat template rewrites message contents, so they cannot be kept as plain text")
        special = sorted((t.content for t in self._hf.added_tokens_decoder.values()), key=len, reverse=True)
        pattern = re.compile("(" + "|".join(map(re.escape, special)) + ")")
        pieces, text = [], ""  # (is_special, string), adjacent plain text merged
        for p in parts:
            for j, q in enumerate([fix(contents[int(p[1:-1])])] if p in marks else pattern.split(p)):
                if j % 2 and p not in marks:
                    pieces += [(False, text), (True, q)] if text else [(True, q)]
                    text = ""
                else:
                    text += q
        pieces += [(False, text)] if text else []
        out = []
        for is_special, q in pieces:
            out += ([self._hf.convert_tokens_to_ids(q)] if is_special
                    else self._hf.encode(q, add_special_tokens=False, split_special_tokens=True))
        return out

    def chat(self, messages) -> list[int]:
        """Prompt ids for a chat: `messages` is a plain string (one user message) or a list of
        {"role", "content"} dicts. Applies the checkpoint's chat template (jinja2, via transformers
        `apply_chat_template`) with the generation prompt; without a template, the contents joined by
        newlines are encoded. Raises InputError for a malformed message list."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m
                                                     for m in messages):
            raise InputError("chat() takes a string or a list of {'role': ..., 'content': ...} dicts")
        if self._hf is None:
            turns = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
            return self.encode(turns + "Assistant: ")
        if not self._hf.chat_template:
            return self.encode("\n".join(m["content"] for m in messages))
        text = self._hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self._hf.encode(text, add_special_tokens=False))
