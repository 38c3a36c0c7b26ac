"""Model files that used to load silently wrong (issue 15): split GGUFs, big-endian GGUFs, and safetensors whose
data section is not 16-byte aligned. Each test compares against the plain file's weights, bitwise (CPU, < 30 s)."""
import dataclasses
import json
import shutil
import struct
from argparse import Namespace

import numpy as np
import pytest
import torch
from test_loaders import _hf_model, write_gguf

from onekernel.errors import ModelFileError
from onekernel.models import hf_loader, load
from onekernel.models.config import get_config
from onekernel.models.gguf_loader import load_gguf, read_gguf_config
from onekernel.models.load import default_model_path, load_model
from onekernel.models.random_init import random_weights
from onekernel.models.tokenizer import Tokenizer


def assert_same(got, want):
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v), k


# ---- split GGUF (llama.cpp gguf-split: model-00001-of-00002.gguf, ...) ------------------------------------

def test_split_gguf_loads_every_shard(tmp_path, monkeypatch):
    import gguf
    cfg = get_config("tiny")  # untied: output.weight is a tensor of its own
    ref = random_weights(cfg, seed=11)
    ref = {k: v for k, v in ref.items() if k != "lm_head"} | {"lm_head": ref["lm_head"]}  # output.weight last
    want_cfg, want = load_gguf(write_gguf(tmp_path / "one.gguf", cfg, ref))
    write_gguf(tmp_path / "m.gguf", cfg, ref, split_max_tensors=len(ref) - 1)
    shards = [tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"]
    assert [t.name for t in gguf.GGUFReader(shards[1]).tensors] == ["output.weight"]
    for given in shards:  # any shard names the whole model
        got_cfg, got = load_gguf(given)
        assert got_cfg == want_cfg and not got_cfg.tie_embeddings and read_gguf_config(given) == want_cfg
        assert_same(got, want)
        assert got["lm_head"] is not got["tok_embeddings"]
        assert torch.equal(got["lm_head"], ref["lm_head"].half().float())
    # load_model builds the tokenizer from the first shard, which holds the metadata
    seen = []
    monkeypatch.setattr(load.Tokenizer, "from_gguf", lambda path: seen.append(path) or Tokenizer.byte_level())
    assert_same(load_model(shards[1]).weights, want)
    assert seen == [shards[0]]


def test_split_gguf_missing_or_foreign_shard(tmp_path):
    cfg = get_config("tiny")
    write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg, seed=12), split_max_tensors=8)  # 3 shards
    first, second, third = (tmp_path / f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    third.rename(tmp_path / "elsewhere.gguf")
    for call in (lambda: load_gguf(first), lambda: read_gguf_config(second), lambda: load_model(first)):
        with pytest.raises(ModelFileError, match="missing shard m-00003-of-00003.gguf") as e:
            call()
        assert "\n" not in str(e.value)
    shutil.copy(second, third)  # a shard in the wrong place: its split.no says 2 of 3
    with pytest.raises(ModelFileError, match="m-00003-of-00003.gguf is not shard 3 of 3"):
        load_gguf(first)
    lone = tmp_path / "renamed.gguf"
    shutil.copy(first, lone)
    with pytest.raises(ModelFileError, match="renamed.gguf is shard 1 of 3 .* -00001-of-00003.gguf"):
        load_gguf(lone)


# ---- big-endian GGUF ---------------------------------------------------------------------------------------

def _cfg256():
    """Rows of 256 so that Q4_K and Q6_K (256-value blocks) fit."""
    return dataclasses.replace(get_config("tiny"), dim=256, ffn_dim=256, head_dim=64)


def _bf16(w):
    import gguf
    return gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.BF16).view(np.uint16)


def test_big_endian_gguf_from_writer(tmp_path):
    """GGUFWriter(endianess=BIG) byte-swaps element types (F32, F16, BF16 as uint16) itself."""
    import gguf
    cfg = get_config("tiny")
    ref = random_weights(cfg, seed=13)
    raw = {"layers.1.w_down": (_bf16(ref["layers.1.w_down"]), gguf.GGMLQuantizationType.BF16)}
    want_cfg, want = load_gguf(write_gguf(tmp_path / "le.gguf", cfg, ref, raw=raw))
    be = write_gguf(tmp_path / "be.gguf", cfg, ref, raw=raw, endianess=gguf.GGUFEndian.BIG)
    assert gguf.GGUFReader(be).endianess == gguf.GGUFEndian.BIG
    got_cfg, got = load_gguf(be)
    assert got_cfg == want_cfg
    assert_same(got, want)
    assert torch.equal(got["layers.0.w_up"], ref["layers.0.w_up"])  # F32, exact


def test_big_endian_gguf_load_model(tmp_path):
    """transformers, which builds the tokenizer, reads only little-endian GGUFs: a big-endian file still gives
    the same tokenizer (from its metadata) and weights as its little-endian twin."""
    import gguf
    cfg = get_config("tiny")
    ref, src = random_weights(cfg, seed=15), default_model_path()
    le = load_model(write_gguf(tmp_path / "le.gguf", cfg, ref, tokenizer_from=src))
    be = load_model(write_gguf(tmp_path / "be.gguf", cfg, ref, tokenizer_from=src, endianess=gguf.GGUFEndian.BIG))
    assert_same(be.weights, le.weights)
    want = Tokenizer.from_gguf(src)
    text = "The quick brown fox, Ünïcödé 3.14!"
    for tok in (le.tokenizer, be.tokenizer):
        assert tok.encode(text) == want.encode(text) and tok.decode(want.encode(text)) == text
        assert tok.chat("Hi") == want.chat("Hi") and tok.eos_token_ids == want.eos_token_ids
        assert (tok.bos_token_id, tok.vocab_size) == (want.bos_token_id, want.vocab_size)


def _k_blocks(rows, cols, qtype, rng):
    """Random Q4_K / Q6_K blocks (gguf cannot quantize these) with finite f16 scales where ggml puts them:
    block_q4_K {half d, dmin; u8 scales[12], qs[128]}, block_q6_K {u8 ql[128], qh[64]; i8 scales[16]; half d}."""
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    at, n = (0, 2) if qtype == gguf.GGMLQuantizationType.Q4_K else (208, 1)
    b[..., at:at + 2 * n] = rng.uniform(1e-3, 1e-2, (rows, cols // block, n)).astype("<f2").view(np.uint8)
    return b.reshape(rows, -1)


def test_big_endian_gguf_every_type(tmp_path, monkeypatch):
    """A little-endian file with every supported tensor type, turned big-endian by llama.cpp's own
    gguf_convert_endian.py (which swaps the f16 fields inside quantized blocks; its table lacks Q4_1, whose
    block_q4_1 {half d, m; u8 qs[16]} is added here), loads to the same weights."""
    import gguf
    from gguf.scripts import gguf_convert_endian
    T = gguf.GGMLQuantizationType
    cfg, rng = _cfg256(), np.random.default_rng(14)
    ref = random_weights(cfg, seed=14)
    raw = {f"layers.0.{n}": (gguf.quants.quantize(ref[f"layers.0.{n}"].numpy(), q), q)
           for n, q in (("wq", T.Q8_0), ("wk", T.Q4_0), ("wv", T.Q4_1))}
    raw["layers.0.wo"] = (_k_blocks(256, 256, T.Q4_K, rng), T.Q4_K)
    raw["layers.0.w_gate"] = (_k_blocks(256, 256, T.Q6_K, rng), T.Q6_K)
    raw["layers.1.w_down"] = (_bf16(ref["layers.1.w_down"]), T.BF16)
    le = write_gguf(tmp_path / "le.gguf", cfg, ref, raw=raw)
    want_cfg, want = load_gguf(le)
    be = shutil.copy(le, tmp_path / "be.gguf")

    def swap_q4_1(tensor, offs):
        tensor.data[offs:offs + 4].view(np.uint16).byteswap(inplace=True)
    monkeypatch.setitem(gguf_convert_endian.byteswap_tensors, T.Q4_1, swap_q4_1)
    monkeypatch.setattr("builtins.input", lambda prompt="": "YES")
    reader = gguf.GGUFReader(be, "r+")
    gguf_convert_endian.convert_byteorder(reader, Namespace(order="big", dry_run=False))
    reader.data.flush()
    del reader
    assert gguf.GGUFReader(be).endianess == gguf.GGUFEndian.BIG
    got_cfg, got = load_gguf(be)
    assert got_cfg == want_cfg
    assert_same(got, want)


# ---- safetensors whose data section is not 16-byte aligned ------------------------------------------------

def test_unaligned_safetensors_weights_are_aligned(tmp_path):
    """The header length is arbitrary, so tensor data can start anywhere; the loader hands out 16-byte-aligned
    weights (the megakernel's vector loads need them) with the same values."""
    from safetensors.torch import load_file
    _hf_model("llama", False).save_pretrained(tmp_path)
    Tokenizer.from_gguf(default_model_path())._hf.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    tensors = {k: t.clone() for k, t in load_file(f).items()}  # not views of the file rewritten below
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for k, t in tensors.items():
        assert t.dtype == torch.float32
        blobs.append(t.contiguous().numpy().tobytes())
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(blobs[-1])]}
        at += len(blobs[-1])
    h = json.dumps(header).encode()
    h += b" " * ((4 - 8 - len(h)) % 16)  # the format allows trailing spaces in the header
    assert (8 + len(h)) % 16 == 4  # data section starts 4 bytes past a 16-byte boundary
    f.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    m = load_model(tmp_path)
    assert len(m.weights) == len(tensors)
    for k, t in tensors.items():
        w = m.weights[hf_loader.canonical_name(k)]
        assert torch.equal(w, t) and w.data_ptr() % 16 == 0, k
