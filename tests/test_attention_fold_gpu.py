"""``fold_merge=True`` (ops/attention_fold.py) on the GPU in graph mode (CUDA-graph replay), bf16, the
Llama-3.2-1B-shaped random model (skipped without CUDA; run with ``TRITON_INTERPRET=0``).

Against ``fold_merge=False`` at batch 1, 3 and 16: logits within bf16 rounding (the partials are the same tile
functions; the merge runs in a 4-warp CTA instead of attn_merge's 2, so its fp32 sums may be ordered differently)
and the same greedy tokens. The fold alone: each row bitwise its batch-1 run (whichever split merges, the merge's
operands and order are the same), and 20 replays of the captured graph bitwise the same logits (the counters
come back to 0 after every step).
"""
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and TRITON_INTERPRET=0")]

from onekernel.bench.modes import random_decode_state, step_on_copy  # noqa: E402
from onekernel.models.load import load_model  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return load_model("llama-3.2-1b", random_weights=True, dtype=torch.bfloat16, device="cuda", seed=11)


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_graph_fold_matches_unfolded_and_is_batch_invariant(model, batch, seed):
    lens = torch.randint(1, 400, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()
    lens[0] = 1  # a sequence at position 0: every split but the first empty
    ctx = max(lens) + 32
    cache, tokens = random_decode_state(model, batch, ctx, lens, seed)
    plain = step_on_copy(model, "graph", cache, tokens)
    fold = step_on_copy(model, "graph-fold", cache, tokens)
    assert any(op.kind.name == "attn_partial_fold" for op in fold[3].graph.ops)
    err = ((fold[0] - plain[0]).norm(dim=-1) / plain[0].norm(dim=-1)).max().item()
    assert err < 0.05, err  # bf16 rounding of the merged rows, carried through the layers
    assert torch.equal(fold[1], plain[1])
    assert torch.equal(fold[1], fold[0].argmax(-1).to(torch.int32))
    for i, n in enumerate(lens):  # each sequence alone, at batch 1 (the same cache length: the same splits)
        one, _ = random_decode_state(model, 1, ctx, [n], seed)
        one.k.copy_(cache.k[:, i:i + 1])
        one.v.copy_(cache.v[:, i:i + 1])
        alone = step_on_copy(model, "graph-fold", one, tokens[i:i + 1])[0]
        assert torch.equal(alone[0], fold[0][i]), f"row {i} differs from its batch-1 run"
    runner = fold[3]
    first = runner.step(tokens)[0].clone()
    for k in range(20):  # the captured graph replayed: the counters start from 0 every time
        assert torch.equal(runner.step(tokens)[0], first), f"replay {k}"
    assert torch.equal(first, fold[0])
    counters = [n for n, b in runner.graph.buffers.items() if b.kind == "counter"]
    assert counters and all(not runner.tensors[n].any() for n in counters)
