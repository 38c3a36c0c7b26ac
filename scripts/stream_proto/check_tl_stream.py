"""CPU checks of tl_stream.py's kernels in the Triton interpreter (fp32: the interpreter's bf16 casts truncate).

    TRITON_INTERPRET=1 python scripts/stream_proto/check_tl_stream.py

The interpreter runs a grid's programs one after another, so a worker that waits on another worker's later
program would time out: chains with waits run with W = 1; W > 1 runs either a single stage (``--layers 0``:
no waits) or ``nodeps`` launched once per stage without re-poisoning (after launch k, stages 0..k are right),
which covers the packed stream, empty tiles (dummy chunks) and task switches for many workers. Every case runs
with and without --defer (in fp32, --defer's column blocks are 128 wide: 8 KB chunks have two).
"""
from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, os.path.dirname(__file__))
import tl_stream as T  # noqa: E402


def run(prob, cfg: T.Config, W: int, launches: int = 1) -> float:
    """Max relative error over stages after ``launches`` launches of one step (outputs poisoned once)."""
    split = T.build_split(prob, W, cfg.chunk_kb, cfg.variant != "pertask")
    sync = T.new_sync(len(prob.stages), "cpu")
    err, flag = T.check(prob, T.make_launch(cfg, prob, split, sync), sync, launches)
    assert flag[0] == 0, flag
    return err


def main() -> None:
    chain = T.build_problem("tiny", 1, "cpu", torch.float32)  # 5 stages: K 256/512, N 256..1024
    head = T.build_problem("tiny", 0, "cpu", torch.float32)  # the LM head alone: 128 row groups
    cases = []
    for defer in (False, True):
        cases += [(chain, T.Config("pertask", kb, defer=defer), 1, 1) for kb in (1, 4, 8)]
        cases += [(chain, T.Config("flat", kb, stages=3, xahead=xa, defer=defer), 1, 1)
                  for kb, xa in ((1, 2), (4, 1), (8, 3), (8, 5))]
        cases += [(head, T.Config(v, 8, stages=3, defer=defer), W, 1)
                  for v in ("pertask", "flat") for W in (3, 130)]  # 130 > 128: empty tiles
        cases += [(chain, T.Config("nodeps", kb, stages=3, defer=defer), W, len(chain.stages))
                  for W, kb in ((5, 4), (40, 8))]  # 40 > 32 groups of O/down
    bad = 0
    head_out = {}  # the LM head's output must not depend on the split (W) or on pertask vs flat
    for prob, cfg, W, launches in cases:
        err = run(prob, cfg, W, launches)
        ok = err < 1e-5
        if prob is head:
            ref = head_out.setdefault(cfg.defer, prob.outs[0].clone())
            ok = ok and torch.equal(ref, prob.outs[0])
        bad += not ok
        print(f"{cfg.name:30s} stages {len(prob.stages)} W={W:3d} launches {launches}: max rel err {err:.1e} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
