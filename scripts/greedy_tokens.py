"""Greedy tokens of the real default model in every mode, through the public API only (``load_model`` and
``generate``), so the same script runs against two source trees and their tokens can be compared.

    PYTHONPATH=TREE python scripts/greedy_tokens.py GGUF|CONFIG OUT.json [MODES]

Three prompts x 32 new tokens, each prompt alone (batch 1) and all three together (batch 3), bf16 on the
GPU: chat prompts for a GGUF, plain text with the config's random weights (seed 0) for a config name;
MODES defaults to reference,eager,graph,pdl,megakernel. Writes {mode: {"b1": [[ids]...], "b3": [[ids]...],
"ms_per_step": ...}} and prints one line per mode.
"""
from __future__ import annotations

import json
import sys

import torch

from onekernel.models.load import load_model
from onekernel.runtime.generate import generate

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain in one sentence what a GPU is."]


def main(model_arg: str, out: str, modes: str = "reference,eager,graph,pdl,megakernel") -> None:
    chat = model_arg.endswith(".gguf")
    model = load_model(model_arg, random_weights=not chat, dtype=torch.bfloat16, device="cuda")
    res = {}
    for mode in modes.split(","):
        b1 = [generate(model, [p], chat=chat, max_new_tokens=32, mode=mode, ignore_eos=True).sequences[0]
              .generated_ids for p in PROMPTS]
        r3 = generate(model, PROMPTS, chat=chat, max_new_tokens=32, mode=mode, ignore_eos=True)
        res[mode] = {"b1": b1, "b3": [s.generated_ids for s in r3.sequences],
                     "ms_per_step": r3.timings.decode_ms_per_step}
        print(mode, "b1 == b3:", b1 == res[mode]["b3"], "first tokens:", [s[:6] for s in b1], flush=True)
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
