"""Real-model checks of scripts/gpu_suite.py (needs the default GGUF on the machine), and the batch-invariance
check it shares with the random-weight run."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from onekernel.runtime.runners import make_step_runner
from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner, prefill

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain in one sentence what a GPU is."]
MODES = ["eager", "graph", "pdl", "megakernel"]
OUT = Path(os.environ.get("OUT", "/tmp/out"))


def batch_invariance_check(model, mode, batch=8, context=200, steps=2, **opts):
    """Logits of row r at batch B must be bitwise equal to a batch-1 run of row r alone (opts: runner options)."""
    cfg = model.config
    big = KVCache(cfg, batch, context + steps, torch.bfloat16, "cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    big.k.normal_(generator=g); big.v.normal_(generator=g)
    big.seq_lens.copy_(torch.randint(0, context, (batch,), device="cuda", generator=g, dtype=torch.int32))
    toks = torch.randint(0, cfg.vocab_size, (steps, batch), device="cuda", generator=g, dtype=torch.int32)
    snap = (big.k.clone(), big.v.clone(), big.seq_lens.clone())
    rb = make_step_runner(mode, model, big, **opts)
    want = []
    for s in range(steps):
        want.append(rb.step(toks[s])[0].clone())
        big.seq_lens += 1
    one = KVCache(cfg, 1, context + steps, torch.bfloat16, "cuda")
    r1 = make_step_runner(mode, model, one, **opts)
    equal = []
    for row in range(batch):
        one.k.copy_(snap[0][:, row:row + 1]); one.v.copy_(snap[1][:, row:row + 1])
        one.seq_lens.copy_(snap[2][row:row + 1])
        ok = True
        for s in range(steps):
            ok &= torch.equal(r1.step(toks[s, row:row + 1])[0][0], want[s][row])
            one.seq_lens += 1
        equal.append(bool(ok))
    return {"rows_bitwise_equal": f"{sum(equal)}/{batch}"}


def ref_margins(model, ids, n):
    """Top-1 minus top-2 logit of the reference at each of the first n generated positions (greedy)."""
    cache = KVCache(model.config, 1, len(ids) + n + 1, torch.bfloat16, "cuda")
    logits = prefill(model, cache, [ids])
    r = ReferenceRunner(model, cache)
    out = []
    for _ in range(n):
        top = logits[0].topk(2).values
        out.append((top[0] - top[1]).item())
        logits, nxt = r.step(logits.argmax(-1).to(torch.int32))
        cache.seq_lens += 1
    return out


def teacher_forced(model, mode, ids, n=32):
    """Feed the reference's greedy tokens to both the reference and ``mode`` for n steps (same KV contents:
    each runner has its own cache filled by the same prefill). Returns the steps where the argmaxes differ,
    with the reference's top-2 margin there: a difference at a margin of 0 or one bf16 ulp of the logit is a
    tie that any other summation order may break differently; a larger margin would be a bug."""
    w = model.weights["tok_embeddings"]
    caches = [KVCache(model.config, 1, len(ids) + n + 1, w.dtype, w.device) for _ in range(2)]
    lg = [prefill(model, c, [ids]) for c in caches]
    ref = ReferenceRunner(model, caches[0])
    other = make_step_runner(mode, model, caches[1], interpret=not w.is_cuda)
    diffs = []
    tok = lg[0].argmax(-1).to(torch.int32)
    for step in range(n):
        a, na = ref.step(tok)
        b, nb = other.step(tok)
        if not torch.equal(na, nb):
            top = a[0].topk(2).values
            diffs.append({"step": step, "margin": (top[0] - top[1]).item(), "ref_logit": top[0].item()})
        tok = na
        for c in caches:
            c.seq_lens += 1
    return diffs


def recapture_check(model):
    """Graph mode on a batch-2 cache: capture A, replay A, move the cache (new addresses, new contents from
    position 60), replay: must re-capture and equal eager on the new cache bitwise."""
    cache = KVCache(model.config, 2, 128, torch.bfloat16, "cuda")
    cache.k.normal_(); cache.v.normal_(); cache.seq_lens.copy_(torch.tensor([50, 90]))
    r = make_step_runner("graph", model, cache)
    tok = torch.tensor([7, 99], dtype=torch.int32, device="cuda")
    a = r.step(tok)[0].clone()
    a2 = r.step(tok)[0].clone()
    k, v, s = cache.k.clone(), cache.v.clone(), cache.seq_lens.clone()
    old_ptr = cache.k.data_ptr()
    cache.reallocate()
    cache.k.copy_(k); cache.v.copy_(v); cache.seq_lens.copy_(s)
    cache.k[:, :, :, 60:].normal_()  # new contents the old graph could not have seen: row 1 changes
    b = r.step(tok)[0].clone()
    e = make_step_runner("eager", model, cache).step(tok)[0].clone()
    return {"captures": r.captures, "moved": cache.k.data_ptr() != old_ptr, "A==A'": torch.equal(a, a2),
            "B == eager on the new cache (bitwise)": torch.equal(b, e), "row0 B==A": torch.equal(a[0], b[0]),
            "row1 B!=A (new contents seen)": not torch.equal(a[1], b[1])}


def run_full(gguf: str, section, R):
    model = load_model(gguf, dtype=torch.bfloat16, device="cuda")

    @section("real: every mode's greedy tokens vs reference (3 chat prompts, 32 tokens, batch 1 and 3)")
    def modes_check():
        out = {}
        ref = [generate(model, [p], max_new_tokens=32, mode="reference", chat=True, ignore_eos=True)
               for p in PROMPTS]
        ref_ids = [r.sequences[0].generated_ids for r in ref]
        margins = [ref_margins(model, r.sequences[0].prompt_ids, 32) for r in ref]
        out["reference"] = {"ms_per_step": [r.timings.decode_ms_per_step for r in ref],
                            "text": [r.sequences[0].text for r in ref]}
        for mode in MODES:
            got = [generate(model, [p], max_new_tokens=32, mode=mode, chat=True, ignore_eos=True) for p in PROMPTS]
            batch = generate(model, PROMPTS, max_new_tokens=32, mode=mode, chat=True, ignore_eos=True)
            rec = {"equal_b1": [], "equal_b3": [], "ms_per_step": [g.timings.decode_ms_per_step for g in got]}
            for i, (g, b, r) in enumerate(zip(got, batch.sequences, ref_ids)):
                for key, ids in (("equal_b1", g.sequences[0].generated_ids), ("equal_b3", b.generated_ids)):
                    d = next((j for j, (x, y) in enumerate(zip(ids, r)) if x != y), None)
                    rec[key].append(True if d is None else
                                    f"differs at token {d}: reference top-2 margin there {margins[i][d]:.4f}")
            out[mode] = rec
        return out

    @section("real: teacher-forced argmax agreement with the reference (3 chat prompts x 32 steps)")
    def forced():
        out = {}
        for mode in MODES:
            out[mode] = [teacher_forced(model, mode, model.tokenizer.chat(p)) for p in PROMPTS]
        return out

    @section("real: 1000 replays give bitwise identical logits")
    def replays():
        out = {}
        for mode in ["graph", "pdl", "megakernel"]:
            cache = KVCache(model.config, 1, 256, torch.bfloat16, "cuda")
            cache.k.normal_(); cache.v.normal_(); cache.seq_lens.fill_(200)
            r = make_step_runner(mode, model, cache)
            tok = torch.tensor([42], dtype=torch.int32, device="cuda")
            first = r.step(tok)[0].clone()
            out[mode] = f"{sum(int(torch.equal(r.step(tok)[0], first)) for _ in range(1000))}/1000"
        return out

    @section("real: KV cache moved -> re-capture (capture A, replay A, swap to B, replay B)")
    def recapture():
        return recapture_check(model)

    @section("real: batch 8 vs eight batch-1 runs (bitwise logits, 2 steps)")
    def batch8():
        return {mode: batch_invariance_check(model, mode) for mode in ("megakernel", "graph")}

    forced(); modes_check(); replays(); batch8(); recapture()
    from gpu_bench import run_real_bench
    run_real_bench(model, section, R)
