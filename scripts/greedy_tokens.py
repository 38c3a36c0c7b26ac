"""Greedy tokens of the real default model in every mode, through the public API only (``load_model`` and
``generate``): each prompt alone (batch 1) against all five together (batch 5, which runs in the batch-8
bucket), bf16 on the GPU (issue 12: "a batch of 5 prompts of different lengths gives each prompt the same
tokens as alone, in every mode").

    PYTHONPATH=TREE python scripts/greedy_tokens.py GGUF|CONFIG OUT.json [--modes M,M]

Five prompts of different lengths x 32 new tokens: chat prompts for a GGUF, plain text with the config's random
weights (seed 0) for a config name; ``--modes`` defaults to reference,eager,graph,pdl,megakernel. Writes
{mode: {"b1": [[ids]...], "b5": [[ids]...], "equal": bool, "vs_reference": [bool per prompt],
"ms_per_step": ..., "error": ...}} and prints one line per mode; exits 1 when a mode's batch-5 tokens differ
from its batch-1 tokens (or the mode failed).
"""
from __future__ import annotations

import argparse
import json

import torch

from onekernel.models.load import load_model
from onekernel.runtime.generate import generate

PROMPTS = ["Hi.", "What is the capital of France?", "Write a haiku about the sea, the wind and the long night.",
           "Explain in one sentence what a GPU is, and why it is faster than a CPU for matrix multiplication.",
           "List three rivers of Europe, then say which one is the longest, which country it starts in, and which "
           "sea it flows into. Answer in one short paragraph, without bullet points, for a ten-year-old reader."]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--modes", default="reference,eager,graph,pdl,megakernel")
    a = ap.parse_args()
    chat = a.model.endswith(".gguf")
    model = load_model(a.model, random_weights=not chat, dtype=torch.bfloat16, device="cuda")
    res, bad = {}, 0
    for mode in a.modes.split(","):
        try:
            b1 = [generate(model, [p], chat=chat, max_new_tokens=32, mode=mode, ignore_eos=True)
                  .sequences[0].generated_ids for p in PROMPTS]
            r5 = generate(model, PROMPTS, chat=chat, max_new_tokens=32, mode=mode, ignore_eos=True)
            b5 = [s.generated_ids for s in r5.sequences]
            res[mode] = {"b1": b1, "b5": b5, "equal": b1 == b5, "ms_per_step": r5.timings.decode_ms_per_step}
        except Exception as e:  # noqa: BLE001 - one failing mode must not hide the others
            res[mode] = {"error": f"{type(e).__name__}: {e}"[:2000], "equal": False}
        if "reference" in res and "b1" in res[mode]:
            res[mode]["vs_reference"] = [x == y for x, y in zip(res[mode]["b1"], res["reference"]["b1"])]
        bad += not res[mode]["equal"]
        print(mode, {k: v for k, v in res[mode].items() if k not in ("b1", "b5")},
              "first tokens:", [s[:5] for s in res[mode].get("b1", [])], flush=True)
        with open(a.out, "w") as f:
            json.dump({"prompts": PROMPTS, "modes": res}, f)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
