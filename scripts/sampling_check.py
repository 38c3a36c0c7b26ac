"""Per-sequence sampling on the GPU: with temperature 1 and seed 7, a prompt's tokens are the same alone,
beside another prompt, and twice in one batch, in every mode (random SmolLM2-135M weights, bf16). Prints one
line per mode and exits 1 if any differ.

    python scripts/sampling_check.py
"""
import sys

import torch

from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.sampling import SamplingParams

model = load_model("smollm2-135m", random_weights=True, dtype=torch.bfloat16, device="cuda")
s = SamplingParams(temperature=1.0, top_p=0.95, seed=7)
ok = True
for mode in ("reference", "eager", "graph", "pdl", "megakernel"):
    def run(*prompts):
        return [q.generated_ids for q in generate(model, list(prompts), mode=mode, sampling=s, max_new_tokens=24,
                                                   ignore_eos=True).sequences]
    alone = run("The cat sat")[0]
    pair, twice = run("The cat sat", "Hello there"), run("The cat sat", "The cat sat")
    same = pair[0] == alone and twice == [alone, alone]
    ok &= same
    print(f"{mode:11s} alone == in a batch == twice in a batch: {same}  first tokens {alone[:6]}", flush=True)
sys.exit(0 if ok else 1)
