"""What the generation loop adds to a decode step (issue 11: at most 3%): per model and mode, the runner's
step time as ``onekernel bench`` measures it (median of CUDA-event-timed steps, cache at position 511) and
the generation loop's median time per token (``generate``, 128 new tokens after a 448-token prompt, so the
positions straddle 512), random weights, batch 1. Prints a table and writes JSON to argv[1].

    python scripts/generate_overhead.py OUT.json
"""
import json
import sys

import torch

from onekernel.bench.modes import random_decode_state
from onekernel.bench.timing import median_ms
from onekernel.models.load import load_model
from onekernel.runtime.generate import generate
from onekernel.runtime.runners import make_step_runner

rows = []
for name in ("smollm2-135m", "llama-3.2-1b"):
    model = load_model(name, random_weights=True, dtype=torch.bfloat16, device="cuda")
    prompt = torch.randint(0, model.config.vocab_size, (448,), generator=torch.Generator().manual_seed(0)).tolist()
    for mode in ("megakernel", "graph", "pdl"):
        cache, tokens = random_decode_state(model, 1, 512)
        r = make_step_runner(mode, model, cache)
        step = median_ms(lambda: r.step(tokens), steps=200, warmup=20)["median_ms"]
        r.check()
        del r, cache
        generate(model, [prompt], mode=mode, max_new_tokens=8, ignore_eos=True)  # compile + capture outside
        gen = generate(model, [prompt], mode=mode, max_new_tokens=128, ignore_eos=True).timings.decode_ms_per_step
        rows.append({"model": name, "mode": mode, "step_ms": step, "generate_ms_per_token": gen,
                     "overhead_pct": 100 * (gen / step - 1)})
        print(f"{name:14s} {mode:11s} step {step:.3f} ms  generate {gen:.3f} ms/token  "
              f"overhead {100 * (gen / step - 1):+.1f}%", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(rows, f, indent=1)
