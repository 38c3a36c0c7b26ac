"""Every public entry point answers an argument of the wrong kind with an InputError naming the argument
(README: "InputError for an argument of the wrong kind"), not an AttributeError or TypeError from deep inside."""
import pytest
import torch

from onekernel.errors import InputError
from onekernel.models.config import get_config
from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", random_weights=True)


@pytest.mark.parametrize("model", [None, "tiny", 5, {"config": 1}])
def test_generate_needs_a_loaded_model(model):
    with pytest.raises(InputError, match="model must be a LoadedModel.*load_model"):
        generate(model, ["hi"], max_new_tokens=1)


@pytest.mark.parametrize("kw,msg", [({"chat": "yes"}, "chat must be True or False"),
                                    ({"interpret": 1}, "interpret must be True or False"),
                                    ({"ignore_eos": None}, "ignore_eos must be True or False"),
                                    ({"mode": ["reference"]}, "unknown mode"),
                                    ({"prompts": [b"hi"]}, "prompt 0 must be a string or a list of token ids"),
                                    ({"sampling": {"temperature": 1}}, "SamplingParams")])
def test_generate_argument_kinds(tiny, kw, msg):
    kw = {"prompts": ["hi"], "max_new_tokens": 1, **kw}
    with pytest.raises(InputError, match=msg):
        generate(tiny, **kw)


@pytest.mark.parametrize("kw,msg", [({"cfg": None}, "cfg must be a ModelConfig"),
                                    ({"cfg": "tiny"}, "cfg must be a ModelConfig"),
                                    ({"batch": "2"}, "batch must be an integer"),
                                    ({"batch": True}, "batch must be an integer"),
                                    ({"max_seq_len": 8.0}, "max_seq_len must be an integer"),
                                    ({"batch": 0}, "batch >= 1"),
                                    ({"dtype": "float32"}, "dtype must be a torch.dtype"),
                                    ({"dtype": torch.int8}, "dtype must be"),
                                    ({"device": "tpu"}, "device 'tpu'"),
                                    ({"device": 3.5}, "device 3.5")])
def test_kv_cache_argument_kinds(kw, msg):
    kw = {"cfg": get_config("tiny"), "batch": 1, "max_seq_len": 8, **kw}
    with pytest.raises(InputError, match=msg):
        KVCache(**kw)


def test_make_step_runner_argument_kinds(tiny):
    cache = KVCache(tiny.config, 1, 8)
    with pytest.raises(InputError, match="unknown mode"):
        make_step_runner("fast", tiny, cache)
    with pytest.raises(InputError, match="unknown mode"):
        make_step_runner(None, tiny, cache)
    for model in (None, "tiny"):
        with pytest.raises(InputError, match="model must be a LoadedModel"):
            make_step_runner("reference", model, cache)
    for bad in (None, "cache", tiny):
        with pytest.raises(InputError, match="cache must be a KVCache"):
            make_step_runner("reference", tiny, bad)
    with pytest.raises(InputError, match="cache is for"):
        make_step_runner("reference", tiny, KVCache(get_config("smollm2-135m"), 1, 8))
    with pytest.raises(InputError, match="dtype"):
        make_step_runner("reference", tiny, KVCache(tiny.config, 1, 8, torch.bfloat16))
    r = make_step_runner("reference", tiny, cache)  # the good call still works: logits [B, V]
    assert r.step(torch.zeros(1, dtype=torch.int32))[0].shape == (1, tiny.config.vocab_size)


@pytest.mark.parametrize("kw", [{"model": 5}, {"device": "tpu"}, {"device": 3}, {"seed": 1.5}, {"seed": "1"},
                                {"random_weights": "yes"}, {"dtype": "int8"}, {"dtype": 3}])
def test_load_model_argument_kinds(kw):
    kw = {"model": "tiny", "random_weights": True, **kw}
    with pytest.raises(InputError):
        load_model(**kw)
