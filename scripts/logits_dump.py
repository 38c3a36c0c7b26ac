"""One megakernel step's logits and KV rows on a fixed random state, saved for a bitwise A/B of kernel variants run
in separate processes (environment switches or trees):

    python scripts/logits_dump.py OUT.pt [--model llama-3.2-1b] [--batch 8] [--seed 3] [--context 448]
    python scripts/logits_dump.py --compare A.pt B.pt    # exit 1 unless logits, tokens and KV rows are equal

Random weights (bf16, seeded), a random KV cache of ``--context`` positions with random positions below 400
(``bench.modes.random_decode_state``),
one ``megakernel`` step (auto backend) whose device error word is checked. Saves the logits [B, V] fp32, the
next tokens [B] and the K/V rows the step wrote [layers * B * Hkv * 2, hd].
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--context", type=int, default=448, help="KV cache positions (the sequences sit below 400)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    a = ap.parse_args()
    if not a.compare and a.context < 401:
        ap.error(f"--context must be at least 401 (the sequences sit at positions below 400), got {a.context}")
    if a.compare:
        x, y = (torch.load(p) for p in a.compare)
        same = {k: torch.equal(x[k], y[k]) for k in x}
        print({"compare": a.compare, **same})
        raise SystemExit(0 if all(same.values()) else 1)
    from onekernel.bench.modes import random_decode_state, step_on_copy
    from onekernel.models.load import load_model
    model = load_model(a.model, random_weights=True, dtype=torch.bfloat16, device="cuda", seed=a.seed)
    lens = torch.randint(1, 400, (a.batch,), generator=torch.Generator().manual_seed(a.seed)).tolist()
    cache, tokens = random_decode_state(model, a.batch, a.context, lens, a.seed)
    logits, nxt, c, r = step_on_copy(model, "megakernel", cache, tokens)
    b = torch.arange(a.batch, device="cuda")
    pos = cache.seq_lens.long()  # the positions this step wrote
    kv = torch.cat([c.k[:, b, :, pos], c.v[:, b, :, pos]]).reshape(-1, c.k.shape[-1])
    torch.save({"logits": logits.float().cpu(), "tokens": nxt.cpu(), "kv": kv.cpu()}, a.out)
    print({"out": a.out, "runner": type(r).__name__, "consts": {k: v for k, v in getattr(r, "consts", {}).items() if k in ("MMA", "B", "SLOTS")}})


if __name__ == "__main__":
    main()
