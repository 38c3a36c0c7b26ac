"""Whether a model's weights fit in the memory of the device they load to, checked before anything is read or
allocated: a model too large for the machine gets one clear error, not an out-of-memory kill minutes later."""
from __future__ import annotations

import math
import os

import torch

from onekernel.errors import DeviceError
from onekernel.models.config import ModelConfig, expected_shapes

GB = 1e9


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of ``cfg``'s weights (``config.expected_shapes``: every tensor the loaders return; a tied LM head is
    the embedding tensor itself) in ``dtype``."""
    elem = torch.empty((), dtype=dtype).element_size()
    shapes = expected_shapes(cfg)
    if cfg.tie_embeddings:
        shapes.pop("lm_head")
    return sum(math.prod(shape) for shape in shapes.values()) * elem


def available_bytes(device: torch.device) -> int | None:
    """Free bytes on ``device``: the CUDA device's free memory (``torch.cuda.mem_get_info``), or the host's
    MemAvailable (/proc/meminfo) for "cpu"; None where it cannot be read (then nothing is checked)."""
    if device.type == "cuda":
        try:
            return torch.cuda.mem_get_info(device)[0]
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg: ModelConfig, dtype: torch.dtype, device, name: str) -> None:
    """Raise DeviceError when ``name``'s weights in ``dtype`` (weight_bytes) need more than the free memory of
    ``device`` (available_bytes), with what to do instead; nothing when the free memory cannot be read."""
    device = torch.device(device)
    need = weight_bytes(cfg, dtype)
    free = available_bytes(device)
    if free is None or need <= free:
        return
    half = ", --dtype bfloat16 (half the bytes)" if dtype == torch.float32 else ""
    raise DeviceError(f"{name} needs about {need / GB:.1f} GB for its weights in {str(dtype).replace('torch.', '')} "
                      f"on {device}, and {device} has {free / GB:.1f} GB free; use a smaller model{half}, a device "
                      f"with more memory, or tensor parallel over several GPUs (--tp N)")
