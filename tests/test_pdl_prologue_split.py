"""PDL's prologue-split and trigger switches (trigger at entry or after the body): with PROLOGUE_SPLIT off, the per-op kernel waits on its predecessor before the
prologue instead of after it (checked by running the generated kernel's Python body with recording stubs,
PDL on); the interpreter compiles PDL away, and a pdl runner with the switch off computes the reference."""
import types

import pytest
import torch

import onekernel.models.decode_graph  # noqa: F401 - registers the op kinds
import onekernel.ops.attention  # noqa: F401 - registers the attention op kinds
from onekernel.exec import make_runner
from onekernel.exec.codegen import eager_kernel, eager_source
from onekernel.models.load import load_model
from onekernel.ops.base import OP_KINDS
from onekernel.runtime.reference import decode_step


def _call_order(kind_name: str, pdl: bool, split: bool, trigger_end: bool = False) -> list[str]:
    fn = eager_kernel(kind_name).fn  # the generated Python function behind the Triton kernel
    kind = OP_KINDS[kind_name]
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
    args.update(PDL=pdl, PROFILE=False, PROLOGUE_SPLIT=split, TRIGGER_END=trigger_end)
    f(**args)
    return calls


@pytest.mark.parametrize("kind_name", sorted(OP_KINDS))
def test_prologue_split_switch_orders_wait_and_prologue(kind_name):
    assert _call_order(kind_name, True, True) == ["launch_dependents", "prologue", "wait", "body"]
    assert _call_order(kind_name, True, False) == ["launch_dependents", "wait", "prologue", "body"]
    assert _call_order(kind_name, False, False) == ["prologue", "body"]
    assert _call_order(kind_name, True, True, True) == ["prologue", "wait", "body", "launch_dependents"]
    assert _call_order(kind_name, False, True, True) == ["prologue", "body"]
    src = eager_source(OP_KINDS[kind_name])
    nosplit = src.index("if not PROLOGUE_SPLIT:")
    assert nosplit < src.index("gdc_wait()", nosplit) < src.index("= PROLOGUE(")


def test_pdl_runner_without_prologue_split_matches_reference(twin_caches):
    seed = int(torch.randint(0, 10_000, ()))
    model = load_model("tiny", random_weights=True, seed=seed)
    caches, g = twin_caches(model, 2, 32, [3, 29], seed)
    tokens = torch.randint(0, model.config.vocab_size, (2,), generator=g, dtype=torch.int32)
    want = decode_step(model, caches[0], tokens)
    r = make_runner("pdl", model, caches[1], 2, interpret=True, prologue_split=False)
    assert r.prologue_split is False
    with pytest.raises(ValueError, match="trigger"):
        make_runner("pdl", model, caches[1], 2, interpret=True, trigger="late")
    logits, nxt = r.step(tokens)
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(nxt, want.argmax(-1).to(torch.int32))
