"""A model whose weights do not fit the device's free memory is refused before anything is allocated, with the
sizes and what to do (models.memory); the byte count matches the tensors the loader builds."""
import pytest
import torch

from onekernel.errors import DeviceError
from onekernel.models import memory
from onekernel.models.config import get_config
from onekernel.models.load import load_model


@pytest.mark.parametrize("name,dtype", [("tiny", torch.float32), ("tiny", torch.bfloat16), ("tiny-tp8", torch.float16)])
def test_weight_bytes_equal_the_loaded_tensors(name, dtype):
    """weight_bytes counts every distinct tensor random weights hold (a tied LM head once)."""
    m = load_model(name, random_weights=True, dtype=dtype)
    seen = {id(t): t for t in m.weights.values()}
    assert memory.weight_bytes(m.config, dtype) == sum(t.numel() * t.element_size() for t in seen.values())


def test_a_model_larger_than_the_free_memory_is_one_device_error(monkeypatch):
    """Llama-3.1-70B in fp32 against 20 GB free: DeviceError with both sizes and the ways out; nothing loaded."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: 20 * 10**9)
    need = memory.weight_bytes(get_config("llama-3.1-70b"), torch.float32)
    assert 270e9 < need < 290e9
    with pytest.raises(DeviceError, match=r"llama-3.1-70b needs about 28\d\.\d GB for its weights in float32 on cpu, "
                                          r"and cpu has 20\.0 GB free.*--dtype bfloat16.*--tp N"):
        load_model("llama-3.1-70b", random_weights=True)


def test_unknown_free_memory_checks_nothing(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)
    assert load_model("tiny", random_weights=True).config.name == "tiny"
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**15)
    assert load_model("tiny", random_weights=True).config.name == "tiny"
