"""PDL's prologue-split and trigger switches (trigger at entry, after the wait or after the body): with PROLOGUE_SPLIT off, the
per-op kernel waits on its predecessor before the prologue instead of after it. Checked by running each
generated kernel's Python body with recording stubs, PDL on (the interpreter compiles PDL away, so a pdl runner
under it would only re-run the eager launches); the runner refuses an unknown trigger."""
import types

import pytest
import torch

from onekernel.errors import InputError
from onekernel.exec.codegen import TRIGGERS, eager_kernel, eager_source
from onekernel.models.decode_graph import OP_KINDS
from onekernel.models.load import load_model
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.runners import make_step_runner

KINDS = {k.name: k for k in OP_KINDS}


def _call_order(kind_name: str, pdl: bool, split: bool, trigger: str = "end") -> list[str]:
    kind = KINDS[kind_name]
    fn = eager_kernel(kind).fn  # the generated Python function behind the Triton kernel
    calls = []

    def rec(name, ret=None):
        return lambda *a, **k: calls.append(name) or ret

    state = tuple(range(kind.n_state)) if kind.n_state > 1 else 0
    g = dict(fn.__globals__, tl=types.SimpleNamespace(program_id=lambda axis: 0),
             gdc_wait=rec("wait"), gdc_launch_dependents=rec("launch_dependents"),
             PROLOGUE=rec("prologue", state), BODY=rec("body"))
    f = types.FunctionType(fn.__code__, g)
    n = fn.__code__.co_argcount
    args = dict.fromkeys(fn.__code__.co_varnames[:n], None)
    args.update(PDL=pdl, PROFILE=False, PROLOGUE_SPLIT=split, TRIGGER=TRIGGERS.index(trigger))
    f(**args)
    return calls


@pytest.mark.parametrize("kind_name", sorted(KINDS))
def test_prologue_split_switch_orders_wait_and_prologue(kind_name):
    assert _call_order(kind_name, True, True) == ["prologue", "wait", "body", "launch_dependents"]
    assert _call_order(kind_name, True, False) == ["wait", "prologue", "body", "launch_dependents"]
    assert _call_order(kind_name, True, True, "wait") == ["prologue", "wait", "launch_dependents", "body"]
    assert _call_order(kind_name, True, False, "wait") == ["wait", "launch_dependents", "prologue", "body"]
    assert _call_order(kind_name, False, False) == ["prologue", "body"]
    assert _call_order(kind_name, True, True, "entry") == ["launch_dependents", "prologue", "wait", "body"]
    assert _call_order(kind_name, True, False, "entry") == ["launch_dependents", "wait", "prologue", "body"]
    for trigger in TRIGGERS:
        assert _call_order(kind_name, False, True, trigger) == ["prologue", "body"]
    src = eager_source(KINDS[kind_name])
    nosplit = src.index("if not PROLOGUE_SPLIT:")
    assert nosplit < src.index("gdc_wait()", nosplit) < src.index("= PROLOGUE(")


def test_unknown_trigger_is_refused():
    model = load_model("tiny", random_weights=True)
    cache = KVCache(model.config, 1, 16, torch.float32, "cpu")
    with pytest.raises(InputError, match="trigger"):
        make_step_runner("pdl", model, cache, interpret=True, trigger="late")
