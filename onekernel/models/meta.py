"""What the prompt checks need before the weights load: the model's context length and its tokenizer, read
from a GGUF file's header, an HF folder's config.json or a named config, without loading a tensor.

The CLI calls ``prompt_limits`` so that a prompt too long for the context is reported before ``load_model``
(27 s for the default model on the GPU host). ``load_model`` stays the one loader: this only reads, and returns
None for whatever it cannot read cheaply (the loader then reports the problem).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Callable

from onekernel.models.config import CONFIG_NAMES, get_config
from onekernel.models.tokenizer import Tokenizer

# GGUF metadata value types (ggml's gguf.h, GGUFValueType): scalars by struct code; 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
GGUF_DEFAULT_CONTEXT = 2048  # what config.config_from_gguf assumes when a file lacks {arch}.context_length


class _Header:
    """Sequential reads of one GGUF header in byte order ``order`` ("<" or ">")."""

    def __init__(self, f, order: str, size: int):
        self.f, self.order, self.size = f, order, size

    def scalar(self, code: str):
        n = struct.calcsize(code)
        return struct.unpack(self.order + code, self.f.read(n))[0]

    def string(self, skip: bool = False) -> str | None:
        n = self.scalar("Q")
        if n > self.size:
            raise ValueError("string longer than the file")
        if skip:
            self.f.seek(n, os.SEEK_CUR)
            return None
        return self.f.read(n).decode("utf-8")

    def skip_array(self) -> None:
        kind, count = self.scalar("I"), self.scalar("Q")
        if count > self.size:
            raise ValueError("array longer than the file")
        if kind in _SCALARS:
            self.f.seek(count * struct.calcsize(_SCALARS[kind]), os.SEEK_CUR)
            return
        for _ in range(count):
            self.value(kind, skip=True)

    def value(self, kind: int, skip: bool = False):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string(skip)
        if kind == _ARRAY:
            return self.skip_array()
        raise ValueError(f"unknown GGUF value type {kind}")


def gguf_header(path) -> dict | None:
    """The scalar and string metadata of the GGUF file ``path`` (arrays such as the vocabulary are skipped),
    from its header alone: milliseconds, where ``gguf.GGUFReader`` takes seconds on a 49k-token vocabulary.
    Returns None when the file is not a GGUF v2/v3 file it can parse (the loader reports why)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(4) != b"GGUF":
                return None
            order = "<" if struct.unpack("<I", f.read(4))[0] in (2, 3) else ">"
            h = _Header(f, order, size)
            f.seek(4)
            if h.scalar("I") not in (2, 3):
                return None
            h.scalar("Q")  # tensor count
            meta = {}
            for _ in range(h.scalar("Q")):
                key = h.string()
                v = h.value(h.scalar("I"))
                if v is not None:
                    meta[key] = v
            return meta
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None


def prompt_limits(model, random_weights: bool) -> tuple[int, Callable[[], Tokenizer]] | None:
    """(context length, a function that builds the tokenizer) of the model ``load_model(model,
    random_weights=random_weights)`` loads, read without its weights: a named config (with ``random_weights``),
    an HF folder (config.json) or a GGUF file holding its tokenizer (one file, or the first shard). The
    tokenizer is left to build on demand: from a GGUF file it takes seconds, and ``load_model`` builds its own.
    None for anything else (a path that does not exist, a GGUF it cannot parse, a later shard): load_model
    then reports the problem, and ``generate`` checks the prompts after loading. Raises what ``load_model``
    would for the same files (ModelFileError, UnsupportedModelError), e.g. when the default model is not
    installed."""
    from onekernel.models.hf_loader import read_hf_config
    from onekernel.models.load import default_model_path

    if model is None:
        path = default_model_path()
    elif isinstance(model, (str, os.PathLike)) and str(model).strip():
        path = Path(model)
    else:
        return None
    if path.is_dir():
        return read_hf_config(path).max_seq_len, lambda: Tokenizer.from_hf(path)
    if path.is_file():
        meta = gguf_header(path) if path.suffix.lower() == ".gguf" else None
        arch = meta.get("general.architecture") if meta else None
        if not isinstance(arch, str) or "tokenizer.ggml.model" not in meta or meta.get("split.no", 0) != 0:
            return None
        return int(meta.get(f"{arch}.context_length", GGUF_DEFAULT_CONTEXT)), lambda: Tokenizer.from_gguf(path)
    if random_weights and str(model).lower() in CONFIG_NAMES:
        return get_config(str(model)).max_seq_len, Tokenizer.byte_level
    return None
