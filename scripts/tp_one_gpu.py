"""The tensor-parallel megakernel's device code on ONE GPU: the N ranks as N threads of this process.

    python scripts/tp_one_gpu.py [--model llama-3.2-1b] [--batches 1,8] [--tp 2] [--steps 16]
        [--backend gluon|triton] [--mode megakernel|eager|graph|pdl] [--gemv fma|mma] [--opt key=value ...]
        [--out F.json] [--cpu]

Each rank is a thread with its own CUDA stream and ThreadGroup (``onekernel.dist.threads``); its persistent kernel
gets SMS / N workers (tiled for SMS / N SMs), so the N kernels are co-resident and run concurrently; a rank's peer
buffers are the other ranks' pool tensors on the same GPU (``PoolFactory``: one address space). Per model (random
bf16 weights, seed 0, drawn once; each rank's shard sliced from them) and batch: one random decode state
(``tp_check._state``: K/V ~ N(0, 1) at position context - 40; each rank's cache holds its KV heads of the same
numbers), then

1. TP=1: the same backend's megakernel on the whole GPU (SMS workers): one step's logits, ``--steps`` greedy tokens;
2. TP=N: the same from the same state (``group.step_runner("megakernel", ..., n_workers=n_sm=SMS // N,
   use_cuda_graph=False, check_every=0, pools=PoolFactory, **opts)``; ``--opt`` entries are passed as they are,
   values parsed as int / bool / None / str); record: ``rel_err`` (relative L2 error of the whole logits against
   TP=1), ``argmax_agree``, ``greedy_agree`` (tokens equal / all), ``first_diff`` (step, row, TP=1's top-2 margin
   there / logit range), ``reduced_bitwise_equal_across_ranks`` (every ``*.ar.out`` after the last step), ``sha256``
   of the first step's logits, the greedy tokens and the reduced buffers (pull and push runs compared), and
   ``ms_per_step``: median of ``--launches`` launches of every rank's kernel (each on its stream, synchronised and
   joined per step) after the steps: ONE GPU SHARED BY N RANKS, NOT A TP SPEED (``tp1_ms_per_step`` likewise);
3. once, at the first batch: a forced timeout: ``ONEKERNEL_TP_FAULT=1:skip:1`` (rank 1 skips its first launch; its
   collectives still run) on fresh runners with ``wait_ms`` 200 (gluon) or ``spin_limit`` 2**16 (triton): rank 0's
   ``check()`` must raise KernelTimeoutError naming "peer rank 1" (``timeout_ok``, ``message``).

``--mode eager|graph|pdl --opt allreduce=oneshot``: the separate-kernel modes with onekernel's one-shot all-reduce
kernels (dist/tp_oneshot.py) instead of a megakernel, graph and pdl without CUDA-graph capture (pdl still launches
every kernel with PDL); TP=1 is the same mode on the whole GPU.

One JSON record per line on stdout; the whole list rewritten to ``--out`` after each; a failed part gets "error".
``--cpu``: the same in the Triton interpreter (backend triton, one worker per rank, ``tiny``, fp32; defaults
``--batches 1,2 --steps 2 --context 24 --launches 1``; tiled for CPU_SMS SMs): a test of the harness itself.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# CUDA's lazy loading may synchronise the context to load a kernel on first use: a rank's first PyTorch kernel would
# then wait for the other rank's megakernel, which spins on this rank's (CUDA programming guide, "Lazy Loading",
# concurrent execution); load every kernel at start instead (before CUDA is initialised)
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
if "--cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import fast_interpreter  # the test suite's interpreter speed-up (same results)

    fast_interpreter.install()

TIMEOUT = {"gluon": {"wait_ms": 200}, "triton": {"spin_limit": 1 << 16}}
CPU_TIMEOUT = {"spin_limit": 2000}  # interpreted polls are slow (tests/test_tp_megakernel.py)
CPU_SMS = 4  # --cpu: the graphs tiled as for 4 SMs (TP=N: 4 / N), run by one worker: few interpreted tasks
NOTE = "one GPU shared by N ranks (SMS/N workers each, concurrent kernels), not a TP speed"


def _value(s: str):
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    try:
        return int(s, 0)
    except ValueError:
        return s


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="config name (random weights); default llama-3.2-1b (--cpu: tiny)")
    ap.add_argument("--batches", default=None)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="greedy steps compared (default 16; --cpu 2)")
    ap.add_argument("--context", type=int, default=None, help="KV positions (default 512; --cpu 24)")
    ap.add_argument("--backend", choices=("gluon", "triton"), default="gluon", help="the megakernel's")
    ap.add_argument("--mode", choices=("megakernel", "eager", "graph", "pdl"), default="megakernel",
                    help="a kernel mode needs --opt allreduce=oneshot (the all-reduces as kernels reading the peers); "
                         "graph and pdl run without CUDA-graph capture here")
    ap.add_argument("--gemv", choices=("fma", "mma"), default=None, help="GEMV path at TP=1 and TP=N")
    ap.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="extra TP=N runner option")
    ap.add_argument("--launches", type=int, default=None, help="timed launches (default 50; --cpu 1)")
    ap.add_argument("--out", default="tp_one_gpu.json")
    ap.add_argument("--cpu", action="store_true", help="the Triton interpreter on the CPU (tests the harness)")
    a = ap.parse_args()
    cpu = a.cpu
    a.model = a.model or ("tiny" if cpu else "llama-3.2-1b")
    try:
        a.batches = [int(x) for x in (a.batches or ("1,2" if cpu else "1,8")).split(",")]
    except ValueError:
        ap.error(f"--batches takes comma-separated integers, got {a.batches!r}")
    if a.tp < 2:
        ap.error(f"--tp must be >= 2 (TP=1 runs beside it anyway), got {a.tp}")
    a.steps = a.steps if a.steps is not None else (2 if cpu else 16)
    a.context = a.context or (24 if cpu else 512)
    a.launches = a.launches if a.launches is not None else (1 if cpu else 50)
    bad = [o for o in a.opt if "=" not in o]
    if bad:
        ap.error(f"--opt takes KEY=VALUE, got {bad}")
    a.opts = {k: _value(v) for k, v in (o.split("=", 1) for o in a.opt)}
    if cpu and a.mode != "megakernel":
        ap.error("--cpu runs the megakernel only: the interpreter runs one grid at a time per process, so the separate "
                 "kernels of concurrent thread ranks cannot run (tests/test_tp_megakernel.py runs them in processes)")
    if a.mode != "megakernel" and a.opts.get("allreduce") != "oneshot":
        ap.error("a kernel mode here needs --opt allreduce=oneshot (the all-reduce as kernels over the ranks' pools; "
                 "nccl and symm need one process per GPU)")
    if cpu:
        a.backend = "triton"
    import torch

    if not cpu and not torch.cuda.is_available():
        ap.error("no CUDA GPU here: run on a GPU, or pass --cpu (the Triton interpreter, the megakernel only)")
    if a.opts.get("push") and (cpu or a.backend != "gluon" or a.mode != "megakernel"):
        ap.error("--opt push=True is the streaming (Gluon) megakernel's: GPU, --backend gluon, --mode megakernel")
    return a


def _sha(*tensors) -> str:
    """sha256 (16 hex digits) of the tensors' bytes, in order: two runs' records tell bitwise-equal results apart."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _launcher(runner):
    """The runner's launch of one step without its host-side work: a megakernel's ``launch``, the separate-kernel
    executors' ``launch_all`` (every op's kernel, the host calls after ops included)."""
    return getattr(runner, "launch", None) or runner.launch_all


def _timed(launch, n, sync, barrier=lambda: None) -> float | None:
    """Median ms of ``n`` calls of ``launch`` (after 3 untimed), each between ``barrier()`` calls, synchronised."""
    times = []
    for i in range(n + 3):
        barrier()
        t0 = time.perf_counter()
        launch()
        sync()
        barrier()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times) if times else None


def main() -> int:
    a = _args()
    import torch

    from onekernel.bench.modes import runner_gemv
    from onekernel.dist.sharding import ShardedModel, shard_config, shard_weights
    from onekernel.dist.threads import PoolFactory, run_ranks, thread_groups, warm_allocator
    from onekernel.errors import KernelTimeoutError, OneKernelError
    from onekernel.exec import sm_count
    from onekernel.models.load import open_model
    from onekernel.runtime.runners import make_step_runner
    from tp_check import _copy, _state, greedy_margins

    n, cpu = a.tp, a.cpu
    dev = torch.device("cpu" if cpu else "cuda")
    dtype = torch.float32 if cpu else torch.bfloat16
    sms = CPU_SMS if cpu else sm_count(dev)
    w1, wn = (1, 1) if cpu else (sms, sms // n)
    mk = a.mode == "megakernel"
    common = {**({"backend": a.backend} if mk else {}), **({"use_cuda_graph": False} if a.mode != "eager" else {}),
              **({"interpret": True} if cpu else {}), **({"gemv": a.gemv} if a.gemv else {})}
    sync = (lambda: torch.cuda.current_stream().synchronize()) if not cpu else (lambda: None)
    out, records = Path(a.out), []
    out.parent.mkdir(parents=True, exist_ok=True)

    def emit(rec):
        records.append(rec)
        print(json.dumps(rec), flush=True)
        out.write_text(json.dumps(records, indent=1))

    try:  # an unknown model or a TP size that does not divide its heads: one line, before anything loads
        files = open_model(a.model, random_weights=True)
        cfg = files.config
        shards = [shard_config(cfg, n, r) for r in range(n)]
    except OneKernelError as e:
        print(f"tp_one_gpu: {e}", file=sys.stderr)
        return 2
    full = files.load(random_weights=True, dtype=dtype, device=dev, seed=0)
    models = [ShardedModel(s.config, shard_weights(s, full.weights), files.tokenizer, a.model, s) for s in shards]
    base = {"commit": os.environ.get("ONEKERNEL_COMMIT") or None, "model": a.model, "tp": n, "mode": a.mode, "backend": a.backend if mk else None,
            "workers_per_rank": wn, "tp1_workers": w1,
            "device": "cpu (interpreter)" if cpu else torch.cuda.get_device_name(dev), "opts": a.opts}

    def rank_runner(r, groups, cache, pools, **extra):
        kw = {**({"n_workers": wn, "check_every": 0} if mk else {}), "n_sm": sms // n, **common, **a.opts,
              **extra}  # later keys win
        return groups[r].step_runner(a.mode, models[r], cache, pools=pools, **kw)

    for b in a.batches:
        rec = {**base, "batch": b}
        try:
            states = [_state(cfg, s, b, a.context, dev, dtype) for s in shards]
            full_cache, tokens = states[0][0], states[0][2]
            c1 = _copy(full_cache)  # 1. TP=1 on the whole device
            r1 = make_step_runner(a.mode, full, c1, n_sm=sms, **({"n_workers": w1} if mk else {}), **common)
            rec["tp1_gemv"], rec["tp1_backend"] = runner_gemv(r1), type(r1).__name__
            want = greedy_margins(r1, c1, tokens, a.steps)
            rec["tp1_ms_per_step"] = _timed(_launcher(r1), a.launches, sync)
            r1.check()
            del r1, c1
            gc.collect()
            groups, pools = thread_groups(shards), PoolFactory(n)

            def rank(r):  # 2. TP=N: this rank's thread
                c = _copy(states[r][1])
                runner = rank_runner(r, groups, c, pools)
                warm_allocator(dev)
                groups[r].barrier("warm-up")  # no rank's kernel runs while another allocates
                got = greedy_margins(runner, c, tokens, a.steps)
                ms = _timed(_launcher(runner.runner), a.launches, sync, lambda: groups[r].barrier("timing"))
                runner.check()
                t = runner.bound.tensors
                red = {k: t[k].cpu().clone() for k in t if k.endswith(".ar.out")}
                return got, red, ms, runner_gemv(runner), getattr(runner, "backend", runner.mode)
            res = run_ranks(n, rank, groups, dev)
            (lg, toks, _), red0, ms, rec["gemv"], rec["tp_backend"] = res[0]
            wl, wt, wm = want
            rec["rel_err"] = float((lg - wl).norm() / wl.norm())
            rec["argmax_agree"] = f"{int((lg.argmax(-1) == wl.argmax(-1)).sum())}/{lg.shape[0]}"
            same = toks == wt
            rec["greedy_agree"] = f"{int(same.sum())}/{same.numel()}"
            if not same.all():
                s, row = (int(i) for i in (~same).nonzero()[0])
                rec["first_diff"] = {"step": s, "row": row, "tp1_top2_margin": float(wm[s, row])}
            rec["ranks_agree"] = all(torch.equal(x[0][0], lg) and torch.equal(x[0][1], toks) for x in res)
            rec["reduced_buffers"] = len(red0)
            rec["reduced_bitwise_equal_across_ranks"] = bool(red0) and all(
                set(x[1]) == set(red0) and all(torch.equal(x[1][k], red0[k]) for k in red0) for x in res)
            rec["reduced_finite"] = all(bool(torch.isfinite(v.float()).all()) for v in red0.values())
            rec["sha256"] = {"logits": _sha(lg), "tokens": _sha(toks),  # pull and push runs: the same bits?
                             "reduced": _sha(*(red0[k] for k in sorted(red0)))}
            rec["ms_per_step"], rec["ms_note"] = ms, NOTE
        except Exception as e:  # noqa: BLE001 - the other batches still run
            rec["error"] = f"{type(e).__name__}: {e}"[:1000]
            traceback.print_exc()
        emit(rec)
        states = res = None
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()

    # 3. the forced timeout, at the first batch
    rec = {**base, "batch": a.batches[0], "mode": "timeout"}
    limit = CPU_TIMEOUT if cpu else TIMEOUT[a.backend if mk else "triton"]
    rec["limit"] = limit
    os.environ["ONEKERNEL_TP_FAULT"] = "1:skip:1"
    try:
        states = [_state(cfg, s, a.batches[0], a.context, dev, dtype) for s in shards]
        groups, pools = thread_groups(shards), PoolFactory(n)

        def faulty(r):
            runner = rank_runner(r, groups, _copy(states[r][1]), pools, **limit)
            warm_allocator(dev)
            groups[r].barrier("warm-up")
            runner.step(states[r][2])
            try:
                runner.check()
            except KernelTimeoutError as e:
                return str(e)
            return ""
        msgs = run_ranks(n, faulty, groups, dev)
        head = msgs[0].split(". A local wait gave up too")[0]
        rec["message"] = msgs[0][:600]
        rec["local_consequence"] = head != msgs[0]
        rec["timeout_ok"] = "peer rank 1" in head and ("op kind allreduce" in head if mk else "all-reduce" in head)
        rec["other_ranks_messages"] = [m[:200] for m in msgs[1:]]
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:1000]
        traceback.print_exc()
    finally:
        del os.environ["ONEKERNEL_TP_FAULT"]
    emit(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
