"""Everything that needs the H200, in one script: checks first, then timings. Writes $OUT/results.json.

    python scripts/gpu_suite.py random       # every mode vs reference, batch invariance (random weights)
    python scripts/gpu_suite.py ops          # per-op GEMV bandwidth (random weights)
    python scripts/gpu_suite.py real GGUF    # real-model checks (needs the default GGUF), profile, latency

Each section is independent: a failure is recorded (with its traceback) and the next section runs.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from onekernel.bench.timing import copy_bandwidth_gbs  # noqa
from onekernel.runtime.runners import make_step_runner  # noqa
from onekernel.models.load import load_model  # noqa
from onekernel.runtime.kv_cache import KVCache  # noqa
from onekernel.runtime.reference import ReferenceRunner  # noqa

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
R: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "sections": {}}
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain in one sentence what a GPU is."]
MODES = ["eager", "graph", "pdl", "megakernel"]


def section(name):
    def deco(fn):
        def run(*a, **k):
            t0 = time.time()
            print(f"\n=== {name}", flush=True)
            try:
                res = fn(*a, **k)
                R["sections"][name] = {"ok": True, "s": round(time.time() - t0, 1), "result": res}
                print(f"=== {name}: ok ({time.time() - t0:.0f}s) {json.dumps(res, default=str)[:1500]}", flush=True)
            except Exception as e:  # noqa: BLE001 - record and go on
                tb = traceback.format_exc()
                R["sections"][name] = {"ok": False, "s": round(time.time() - t0, 1), "error": tb[-4000:]}
                print(f"=== {name}: FAILED {e!r}\n{tb[-3000:]}", flush=True)
            save()
        return run
    return deco


def save():
    (OUT / "results.json").write_text(json.dumps(R, indent=1, default=str))


@section("env")
def env():
    p = torch.cuda.get_device_properties(0)
    import triton
    from onekernel.bench.report import commit_id

    commit = commit_id()
    R.update(gpu=p.name, torch=torch.__version__, triton=triton.__version__, commit=commit)
    bw = copy_bandwidth_gbs()
    R["copy_gbs"] = bw
    return {"gpu": p.name, "sms": p.multi_processor_count, "copy_gbs": bw, "triton": triton.__version__}


def random_model(name, dtype=torch.bfloat16):
    return load_model(name, random_weights=True, dtype=dtype, device="cuda", seed=0)


def fill_cache(cache, context, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    lens = context - 1 - torch.arange(cache.batch, device="cuda", dtype=torch.int32) * 7
    cache.seq_lens.copy_(lens.clamp(min=0))  # different positions per row


def step_all(model, batch, context, modes, steps=3, **opts):
    """Run `steps` decode steps in every mode on the same random cache; compare with the reference mode."""
    out = {}
    toks = torch.randint(0, model.config.vocab_size, (steps, batch), device="cuda", dtype=torch.int32)
    ref_logits = []
    cache = KVCache(model.config, batch, context + steps, torch.bfloat16, "cuda")
    fill_cache(cache, context)
    snap = (cache.k.clone(), cache.v.clone(), cache.seq_lens.clone())
    ref = ReferenceRunner(model, cache)
    for s in range(steps):
        lg, nt = ref.step(toks[s])
        ref_logits.append((lg.clone(), nt.clone()))
        cache.seq_lens += 1
    for mode in modes:
        cache.k.copy_(snap[0]); cache.v.copy_(snap[1]); cache.seq_lens.copy_(snap[2])
        errs, agree = [], 0
        try:
            r = make_step_runner(mode, model, cache, **opts.get(mode, {}))
        except Exception as e:  # noqa: BLE001
            out[mode] = {"error": repr(e)[:1500]}
            traceback.print_exc()
            continue
        mine = []
        for s in range(steps):
            r.tensors[r.bound.logits].fill_(float("nan"))
            lg, nt = r.step(toks[s])
            mine.append(lg.clone())
            rl, rn = ref_logits[s]
            errs.append(((lg - rl).norm() / rl.norm()).item())
            agree += int((nt == rn).sum().item())
            cache.seq_lens += 1
        out[mode] = {"max_rel_err": max(errs), "argmax_agree": f"{agree}/{steps * batch}"}
        if mode == modes[0]:
            first = mine
        else:
            out[mode][f"bitwise_equal_to_{modes[0]}"] = all(torch.equal(a, b) for a, b in zip(mine, first))
    return out


@section("smoke: every mode vs reference, random weights")
def smoke():
    res = {}
    for name, batch, ctx in [("smollm2-135m", 1, 300), ("llama-3.2-1b", 3, 512), ("qwen3-0.6b", 1, 200)]:
        m = random_model(name)
        res[f"{name} B={batch} ctx={ctx}"] = step_all(m, batch, ctx, MODES)
        del m
    return res


@section("batch invariance: B=8 vs each row alone at B=1 (bitwise logits), random SmolLM2-135M")
def batch_invariance(m):
    from gpu_full import batch_invariance_check
    return {mode: batch_invariance_check(m, mode) for mode in ("megakernel", "graph", "eager")}


@section("KV cache moved -> re-capture (capture A, replay A, swap to B, replay B), random SmolLM2-135M")
def recapture(m):
    from gpu_full import recapture_check
    return recapture_check(m)


def main():
    what = sys.argv[1]
    env()
    if what == "random":  # what needs no real weights: profile, batch invariance, re-capture, then the smoke
        from gpu_bench import run_real_bench
        m = random_model("smollm2-135m")
        run_real_bench(m, section, R)
        batch_invariance(m)
        recapture(m)
        smoke()
    if what == "ops":  # per-op GEMV bandwidth: needs no model file
        from gpu_bench import run_random_bench
        run_random_bench(section, R)
    if what == "real":
        from gpu_full import run_full
        run_full(sys.argv[2], section, R)
    save()
    print("\n=== SUMMARY")
    for k, v in R["sections"].items():
        print(f"{'ok ' if v['ok'] else 'FAIL'} {v['s']:>6}s  {k}")


if __name__ == "__main__":
    main()
