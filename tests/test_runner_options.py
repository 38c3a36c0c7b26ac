"""Runner options and misuse of a built runner: each gives one clear InputError (or a KernelTimeoutError that
says to rebuild), never a raw TypeError, a silent default or a wrong answer."""
import os
import subprocess
import sys

import pytest
import torch

from onekernel.errors import InputError, KernelTimeoutError
from onekernel.exec import make_runner
from onekernel.models.config import get_config
from onekernel.models.decode_graph import OP_KINDS, build_decode_step, decode_graph
from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", random_weights=True)


def _cache(model):
    return KVCache(model.config, 2, 16, torch.float32, "cpu")


@pytest.mark.parametrize("mode,opts,match", [
    ("eager", {"policy": "round_robin"}, "mode 'eager' has no option policy; its options are after, profile "
                                          r"\(make_step_runner also takes gemv, tiles"),
    ("eager", {"trigger": "entry"}, "mode 'eager' has no option trigger"),   # pdl's own
    ("eager", {"kwargs": 1}, "mode 'eager' has no option kwargs"), ("graph", {"pdl": True}, "no option pdl"),
    ("eager", {"after": 1}, "after= must be a dict of op name -> callable"),
    ("megakernel", {"rank": 1}, "mode 'megakernel' has no option rank"),
    ("graph", {"events": "op"}, "mode 'graph' has no option events"),
    ("megakernel", {"trigger": "end"}, "mode 'megakernel' has no option trigger; its options are .*check_every"),
    ("megakernel", {"check_every": True}, "check_every"), ("megakernel", {"check_every": -1}, "check_every"),
    ("megakernel", {"spin_limit": -1}, "spin_limit"), ("megakernel", {"num_warps": 3}, "num_warps"),
    ("megakernel", {"n_sm": 0}, "n_sm"), ("eager", {"tiles": "huge"}, "tiling"),
    ("eager", {"profile": True}, "CUDA device"), ("megakernel", {"profile": True}, "CUDA device"),
    ("reference", {"tiles": "fit"}, "reference mode takes no runner options, got tiles"),
    ("reference", {"policy": "x"}, "reference mode takes no runner options, got policy"),
])
def test_bad_options_are_one_input_error(tiny, mode, opts, match):
    with pytest.raises(InputError, match=match):
        make_step_runner(mode, tiny, _cache(tiny), interpret=mode != "reference", **opts)


def test_graph_and_pdl_options_are_accepted_under_the_interpreter(tiny):
    """The interpreter runs graph and pdl as eager launches; their own options are still valid there."""
    for mode, opts in (("graph", {"use_cuda_graph": False}), ("pdl", {"use_cuda_graph": True, "trigger": "end"})):
        assert make_step_runner(mode, tiny, _cache(tiny), interpret=True, **opts).mode == "eager"


def test_lower_layer_arguments(tiny):
    cache = _cache(tiny)
    with pytest.raises(InputError, match="Tiling"):
        build_decode_step(tiny.config, tiny.weights, cache, tiling="fit")
    step = build_decode_step(tiny.config, tiny.weights, cache)
    with pytest.raises(InputError, match="not a Triton mode.*make_step_runner"):
        make_runner("reference", step, interpret=True)
    with pytest.raises(InputError, match="BoundStep"):
        make_runner("eager", tiny, interpret=True)


def test_a_cache_replaced_by_another_shape_or_dtype_is_refused(tiny):
    """repoint() rebinds moved cache views, but refuses (binding nothing) a tensor the step was not built for."""
    cache = _cache(tiny)
    r = make_step_runner("eager", tiny, cache, interpret=True)
    tok = torch.tensor([3, 4], dtype=torch.int32)
    r.step(tok)
    old = r.tensors["layers.0.k_cache"]
    cache.k = cache.k.to(torch.bfloat16)
    with pytest.raises(InputError, match="layers.0.k_cache.*torch.bfloat16.*build a new runner"):
        r.step(tok)
    assert r.tensors["layers.0.k_cache"] is old


def test_a_runner_refuses_to_step_after_a_timeout(tiny):
    r = make_step_runner("megakernel", tiny, KVCache(tiny.config, 1, 16, torch.float32, "cpu"), interpret=True,
                         spin_limit=50)
    t = next(i for i, w in enumerate(r.events.waits) if w)
    r.events.expected[r.events.waits[t][0]] = 1_000_000
    r.write_tables()
    tok = torch.tensor([1], dtype=torch.int32)
    r.step(tok)
    with pytest.raises(KernelTimeoutError, match=f"task {t} "):
        r.poll()
    r.events.expected[r.events.waits[t][0]] = 1
    r.write_tables()
    with pytest.raises(KernelTimeoutError, match="build a new runner"):
        r.step(tok)


def test_interpret_without_the_environment_variable_is_one_error():
    """generate(..., interpret=True) in a process where TRITON_INTERPRET was not set before onekernel was
    imported: a DeviceError that says what to set, not a crash inside Triton."""
    code = ("from onekernel.models.load import load_model\nfrom onekernel.runtime.generate import generate\n"
            "try:\n    generate(load_model('tiny', random_weights=True), ['hi'], mode='eager', interpret=True,"
            " max_new_tokens=2)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.startswith("DeviceError") and "TRITON_INTERPRET=1" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
@pytest.mark.parametrize("fuse", [False, True])
def test_op_kinds_lists_every_kind_the_step_uses(name, fuse):
    g, _, _ = decode_graph(get_config(name), 1, 16, torch.float32, fuse_merge=fuse)
    assert {op.kind.name for op in g.ops} <= {k.name for k in OP_KINDS}
    assert len({k.name for k in OP_KINDS}) == len(OP_KINDS)
