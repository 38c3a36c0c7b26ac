"""The real-model checks and the benchmarks of scripts/gpu_suite.py (needs the default GGUF on the machine)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from onekernel.bench.timing import floor_ms, graph_median_ms, median_ms, step_bytes
from onekernel.exec import make_runner
from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner, decode_step

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain in one sentence what a GPU is."]
MORE = ["Name three primary colours.", "What is 12 times 12?", "Give me a synonym for happy.",
        "Who wrote Hamlet?", "Translate 'good morning' to Spanish."]
MODES = ["eager", "graph", "pdl", "megakernel"]
OUT = Path(os.environ.get("OUT", "/tmp/out"))


def run_full(gguf: str, section, R):
    model = load_model(gguf, dtype=torch.bfloat16, device="cuda")

    @section("real: reference bf16 == HF greedy")
    def hf_check():
        from transformers import AutoModelForCausalLM
        p = Path(gguf)
        hf = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.bfloat16).cuda()
        out = {}
        for prompt in PROMPTS:
            ids = model.tokenizer.chat(prompt)
            h = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=32, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
            g = generate(model, [ids], max_new_tokens=32, mode="reference", ignore_eos=True)
            ours = g.sequences[0].generated_ids
            n = next((i for i, (a, b) in enumerate(zip(h, ours)) if a != b), len(h))
            out[prompt] = {"equal": h == ours, "first_diff": n, "ms_per_step": g.timings.decode_ms_per_step,
                           "text": g.sequences[0].text}
        del hf
        return out

    @section("real: every mode's greedy tokens == reference (3 prompts, 32 tokens, batch 1 and batch 3)")
    def modes_check():
        out = {}
        ref = [generate(model, [p], max_new_tokens=32, mode="reference", chat=True, ignore_eos=True)
               for p in PROMPTS]
        ref_ids = [r.sequences[0].generated_ids for r in ref]
        out["reference"] = {"ms_per_step": [r.timings.decode_ms_per_step for r in ref]}
        for mode in MODES:
            got = [generate(model, [p], max_new_tokens=32, mode=mode, chat=True, ignore_eos=True) for p in PROMPTS]
            batch = generate(model, PROMPTS, max_new_tokens=32, mode=mode, chat=True, ignore_eos=True)
            out[mode] = {"equal_b1": [g.sequences[0].generated_ids == r for g, r in zip(got, ref_ids)],
                         "equal_b3": [s.generated_ids == r for s, r in zip(batch.sequences, ref_ids)],
                         "ms_per_step": [g.timings.decode_ms_per_step for g in got],
                         "text0": got[0].sequences[0].text}
        return out

    @section("real: 1000 replays give bitwise identical logits")
    def replays():
        out = {}
        for mode in ["graph", "pdl", "megakernel"]:
            cache = KVCache(model.config, 1, 256, torch.bfloat16, "cuda")
            cache.k.normal_(); cache.v.normal_(); cache.seq_lens.fill_(200)
            r = make_runner(mode, model, cache, 1)
            tok = torch.tensor([42], dtype=torch.int32, device="cuda")
            first = r.step(tok)[0].clone()
            same = 0
            for _ in range(1000):
                same += int(torch.equal(r.step(tok)[0], first))
            out[mode] = f"{same}/1000"
        return out

    @section("real: KV cache moved -> re-capture (capture A, replay A, swap to B, replay B)")
    def recapture():
        cache = KVCache(model.config, 2, 128, torch.bfloat16, "cuda")
        cache.k.normal_(); cache.v.normal_(); cache.seq_lens.copy_(torch.tensor([50, 90]))
        r = make_runner("graph", model, cache, 2)
        tok = torch.tensor([7, 99], dtype=torch.int32, device="cuda")
        a = r.step(tok)[0].clone()
        a2 = r.step(tok)[0].clone()
        k, v, s = cache.k.clone(), cache.v.clone(), cache.seq_lens.clone()
        cache.reallocate()
        cache.k.copy_(k); cache.v.copy_(v); cache.seq_lens.copy_(s)
        b = r.step(tok)[0].clone()
        ref = decode_step(model, cache, tok)
        return {"captures": r.captures, "A==A'": torch.equal(a, a2), "B==A": torch.equal(a, b),
                "B vs reference rel err": ((b - ref).norm() / ref.norm()).item()}

    @section("real: megakernel batch 8 == eight batch-1 runs")
    def batch8():
        prompts = PROMPTS + MORE
        b8 = generate(model, prompts, max_new_tokens=24, mode="megakernel", chat=True, ignore_eos=True)
        ones = [generate(model, [p], max_new_tokens=24, mode="megakernel", chat=True, ignore_eos=True)
                for p in prompts]
        return {"equal": [a.generated_ids == o.sequences[0].generated_ids for a, o in zip(b8.sequences, ones)]}

    hf_check(); modes_check(); replays(); recapture(); batch8()
    from gpu_bench import run_bench
    run_bench(model, section, R)
