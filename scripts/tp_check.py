"""Tensor parallel on N GPUs (issues 13, 16): TP=N logits and greedy tokens against TP=1, every TP mode.

    python scripts/tp_check.py [--tp 2] [--out F] [--models llama-3.2-1b,llama-3.1-8b] [--batches 1,8]
                               [--steps 32] [--modes reference,megakernel,...] [--no-tp1] [--gemv fma|mma]

Starts itself under torchrun (``--tp`` processes, one per GPU, default 2) unless already in a rank. Per model
(random bf16 weights, seed 0: every rank draws the same full tensors one at a time and keeps its shard,
``sharding.load_shard``; rank 0 also draws the full model for TP=1 unless ``--no-tp1``) and batch: one random
decode state (K/V ~ N(0, 1), every sequence at position ``context - 40``, seeded tokens from the whole
vocabulary; each rank's cache holds its KV heads of the same numbers), then

1. TP=1 on GPU 0 (the other ranks wait at a gloo barrier with a 15-minute timeout, not in an NCCL collective):
   one step and ``--steps`` greedy steps in reference, eager, graph, pdl, megakernel (the Triton megakernel:
   backend "triton", the kernel the TP megakernel extends) and megakernel-gluon (the streaming Gluon kernel:
   backend "gluon"). ``--no-tp1`` skips it (a model that does not fit one GPU: Llama-3.1-70B); every TP mode is
   then compared with the TP=N reference mode instead (records say ``compared_with``);
2. TP=N on N GPUs: the same in reference ("torch"), torch+graph, eager, graph, pdl with each all-reduce
   (nccl, symm, oneshot: dist/tp_oneshot.py), megakernel (its all-reduces are tile tasks: ``dist.tp_megakernel``; backend "triton") and
   megakernel-gluon (the same tasks in the streaming Gluon kernel, backend "gluon") and megakernel-push (the
   streaming kernel with the push all-reduce, ``push=True``, compared with megakernel-gluon at TP=1); rank 0 compares with
   TP=1: ``rel_err`` (relative L2 error of the whole logits) against the same
   mode at TP=1 (torch and torch+graph: the reference) and ``rel_err_vs_reference``; ``argmax_agree`` (rows);
   greedy: ``greedy_agree`` (tokens equal / all), ``first_diff`` (step, row) and the TP=1 top-2 margin there
   (relative to the logit range: a small margin means rounding, not a bug, decided the token);
3. last, once per model at the first batch size (a failed collective there cannot upset the checks), a forced
   timeout of the TP megakernel: rank 1 skips its first launch (``ONEKERNEL_TP_FAULT=1:skip:1``; its
   collectives still run), every rank with ``spin_limit`` 2**16 polls: rank 0's ``step``/``check`` must raise
   KernelTimeoutError naming the all-reduce task, its op, the event and "peer rank 1" first (record
   ``mode: megakernel-timeout``, ``timeout_ok``; ``local_consequence``: a local wait gave up too, reported after
   it: the remote failure has its own error slot, ``exec.mk_device.ERR_RSLOT``); then (still rank 0's first record) the ranks go on.
   The same for megakernel-gluon and megakernel-push (``wait_ms`` TIMEOUT_MS; records ``megakernel-gluon-timeout``,
   ``megakernel-push-timeout``: the push kernel's remote wait polls this rank's receive counter; its remote slot
   is the same: ``stream_base.ERR_RSLOT``).

``--gemv``: the GEMV path of every onekernel mode at TP=1 and TP=N (default: the model's, the same at every TP
size: tensor cores for bf16 Llama models); each record of those modes names the path its runner took (``gemv``).

Rank 0 prints one JSON line per record and rewrites ``--out`` after each, so a step that fails or runs out of
time keeps the earlier ones; a mode that fails gets {"error": ...}. NVLink multicast stays off
(``dist.process.NO_MULTICAST``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--cpu" in sys.argv:  # before onekernel is imported (Triton reads it when the kernels are defined); the ranks inherit it
    os.environ["TRITON_INTERPRET"] = "1"

TP1_MODES = ("reference", "eager", "graph", "pdl", "megakernel", "megakernel-gluon")
TP2_MODES = (("reference", None), ("torch+graph", None), ("eager", "nccl"), ("graph", "nccl"), ("pdl", "nccl"),
             ("eager", "symm"), ("graph", "symm"), ("pdl", "symm"), ("eager", "oneshot"), ("graph", "oneshot"),
             ("pdl", "oneshot"), ("megakernel", None), ("megakernel-gluon", None),
             ("megakernel-push", None))
TIMEOUT_SPINS = 1 << 16  # the forced timeout's spin limit: ~0.1 s of ld.acquire.sys polls
TIMEOUT_MS = 200  # the streaming kernel's: its waits are bounded in time (%globaltimer)
MK_BACKEND = {"megakernel": "triton", "megakernel-gluon": "gluon", "megakernel-push": "gluon"}
MK_PUSH = {"megakernel-push": True}  # the push all-reduce (compared with megakernel-gluon at TP=1)


def _args():
    from onekernel.runtime.args import add_gemv_argument

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)  # --cpu is read before parsing
    ap.add_argument("--tp", type=int, default=2, help="ranks (GPUs), 2..8")
    ap.add_argument("--no-tp1", action="store_true", help="skip TP=1 (a model too large for one GPU); compare "
                    "every TP mode with the TP=N reference mode")
    ap.add_argument("--out", default="tp_check.json")
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=32, help="greedy steps compared")
    ap.add_argument("--modes", default=None, help="only these modes (names of TP1_MODES / TP2_MODES; reference always "
                    "runs: every comparison needs it); default all")
    ap.add_argument("--context", type=int, default=512,
                    help="KV-cache positions, the state starting at context-40 (512: the bench's kernels)")
    add_gemv_argument(ap)  # the onekernel modes' at TP=1 and TP=N
    ap.add_argument("--cpu", action="store_true", help="a dry run of this script on the CPU: gloo, fp32, the Triton "
                    "interpreter (use --models tiny --steps 2 --context 48); symm and torch+graph fail there")
    return ap.parse_args()


def _state(cfg, shard, batch, context, dev, dtype):
    """(the full cache (None on rank 1), the rank's cache, tokens int32 [B]) of one seeded random state."""
    import torch

    from onekernel.runtime.kv_cache import KVCache

    full = KVCache(cfg, batch, context, dtype, dev)
    g = torch.Generator(device=dev).manual_seed(1)
    full.k.normal_(generator=g)
    full.v.normal_(generator=g)
    full.seq_lens.fill_(max(0, context - 40))
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device=dev, dtype=torch.int32, generator=g)
    local = KVCache(shard.config, batch, context, dtype, dev)
    h = shard.config.n_kv_heads
    local.k.copy_(full.k[:, :, shard.rank * h:(shard.rank + 1) * h])
    local.v.copy_(full.v[:, :, shard.rank * h:(shard.rank + 1) * h])
    local.seq_lens.copy_(full.seq_lens)
    return (full if shard.rank == 0 else None), local, tokens


def _copy(cache):
    c = type(cache)(cache.cfg, cache.batch, cache.max_seq_len, cache.k.dtype, cache.k.device)
    for d, s in ((c.k, cache.k), (c.v, cache.v), (c.seq_lens, cache.seq_lens)):
        d.copy_(s)
    return c


def greedy_margins(runner, cache, tokens, steps):
    """One step of ``runner`` on ``tokens``, then ``steps`` greedy steps (``cache``'s positions advance):
    (logits float32 [B, V], tokens int32 [steps, B], per-step top-2 margins / logit range [steps, B]); the runner's
    ``check()`` after the last step (KernelTimeoutError from a gave-up wait). Also scripts/tp_one_gpu.py's."""
    import torch

    lg, nt = runner.step(tokens)
    first = lg.float().clone()
    toks, margins, tok = [], [], nt.clone()
    for _ in range(steps):
        cache.seq_lens += 1
        lg, nt = runner.step(tok)
        lf = lg.float()
        top2 = lf.topk(2, dim=-1).values
        margins.append((top2[:, 0] - top2[:, 1]) / (lf.amax(-1) - lf.amin(-1)))
        tok = nt.clone()
        toks.append(tok)
    if lg.is_cuda:
        torch.cuda.current_stream().synchronize()
    runner.check()
    return first, torch.stack(toks), torch.stack(margins)


def _run(make, cache, tokens, steps):
    """``greedy_margins`` on a runner ``make`` builds over a copy of ``cache``, plus the runner's GEMV path or None."""
    from onekernel.bench.modes import runner_gemv

    c = _copy(cache)
    r = make(c)
    gemv = runner_gemv(r)
    got = greedy_margins(r, c, tokens, steps)
    del r
    gc.collect()  # a kernel runner and its host calls form a cycle: free its weights copy and graphs now
    return (*got, gemv)


def _compare(rec, got, want, ref):
    lg, toks = got[:2]
    wl, wt, wm = want[:3]
    rec["rel_err"] = float((lg - wl).norm() / wl.norm())
    rec["rel_err_vs_reference"] = float((lg - ref[0]).norm() / ref[0].norm())
    rec["argmax_agree"] = f"{int((lg.argmax(-1) == wl.argmax(-1)).sum())}/{lg.shape[0]}"
    same = toks == wt
    rec["greedy_agree"] = f"{int(same.sum())}/{same.numel()}"
    if not same.all():
        s, b = (int(i) for i in (~same).nonzero()[0])
        rec["first_diff"] = {"step": s, "row": b, "tp1_top2_margin": float(wm[s, b])}


def _forced_timeout(name, b, group, model, cache, tokens, rank, kw, mode="megakernel") -> dict:
    """Section 3 of the module doc: rank 1 never launches its first step; rank 0's remote wait must give up and
    name the task, op, event and peer rank 1 (the other peers launch, so only the waits on rank 1 can fail)."""
    from onekernel.errors import KernelTimeoutError

    rec = {"model": name, "batch": b, "tp": group.shard.tp, "mode": f"{mode}-timeout", "allreduce": None}
    limit = {"wait_ms": TIMEOUT_MS} if MK_BACKEND[mode] == "gluon" else {"spin_limit": TIMEOUT_SPINS}
    limit.update({"push": True} if mode in MK_PUSH else {})
    os.environ["ONEKERNEL_TP_FAULT"] = "1:skip:1"
    try:
        r = group.step_runner("megakernel", model, _copy(cache), backend=MK_BACKEND[mode], **limit, **kw)
        msg = ""
        try:
            r.step(tokens)
            r.check()
        except KernelTimeoutError as e:
            msg = str(e)
        rec["message"] = msg[:600]
        head = msg.split(". A local wait gave up too")[0]  # the remote failure comes first (its own error slot)
        rec["local_consequence"] = head != msg
        rec["timeout_ok"] = (rank != 0) or ("peer rank 1" in head and "op kind allreduce" in head
                                           and "waited on event" in head)
        del r
        gc.collect()
    except Exception as e:  # noqa: BLE001 - the other records still count
        rec["error"] = f"{type(e).__name__}: {e}"[:1000]
        traceback.print_exc()
    finally:
        del os.environ["ONEKERNEL_TP_FAULT"]
    return rec


def main() -> int:
    a = _args()
    import torch
    import torch.distributed as dist

    from onekernel.dist.process import NO_MULTICAST, close_rank, init_rank
    from onekernel.dist.sharding import ShardedModel, load_shard, shard_config, shard_part, shard_weights
    from onekernel.dist.tp_reference import TPGroup
    from onekernel.models.load import open_model
    from onekernel.runtime.runners import make_step_runner

    os.environ.update(NO_MULTICAST)
    n = a.tp
    info = init_rank(n, "cpu" if a.cpu else "cuda")
    dtype = torch.float32 if a.cpu else torch.bfloat16
    kw = {"interpret": True} if a.cpu else {}
    kw.update({"gemv": a.gemv} if a.gemv else {})  # the onekernel modes' options (TP=1 and TP=N)
    slow = dist.new_group(backend="gloo", timeout=timedelta(minutes=15))  # ranks > 0 wait here for TP=1's work
    dev, rank = info.device, info.rank
    out, records = Path(a.out), []

    def emit(rec):
        if rank == 0:
            records.append(rec)
            print(json.dumps(rec), flush=True)
            out.write_text(json.dumps(records, indent=1))

    want = None if a.modes is None else set(a.modes.split(",")) | {"reference"}
    tp1_modes = [m for m in TP1_MODES if want is None or m in want
                 or (m == "megakernel-gluon" and "megakernel-push" in want)]  # push is compared with it
    tp2_modes = [(m, ar) for m, ar in TP2_MODES if want is None or m in want]
    if a.no_tp1:
        tp1_modes = []
    for name in a.models.split(","):
        files = open_model(name, random_weights=True)
        cfg = files.config
        shard = shard_config(cfg, n, rank)
        full = None
        if rank == 0 and not a.no_tp1:  # rank 0 keeps the full model for TP=1 and takes its shard from it
            full = files.load(random_weights=True, dtype=dtype, device=dev, seed=0)
            model = ShardedModel(shard.config, shard_weights(shard, full.weights), files.tokenizer, name, shard)
        else:  # the others (and every rank with --no-tp1) draw only their shard: never the whole model
            model = load_shard(files, shard, random_weights=True, dtype=dtype, device=dev, seed=0)
        # every rank's shard is the slice of the same full weights: replicated norms equal, sliced sums as TP=1's
        keys = ("norm", "tok_embeddings", "layers.0.wq", "layers.0.w_down")
        sums = torch.stack([model.weights[k].float().sum() for k in keys])
        every = [torch.empty_like(sums) for _ in range(n)]
        dist.all_gather(every, sums)
        rec = {"model": name, "tp": n, "norms_equal_across_ranks": all(bool(e[0] == every[0][0]) for e in every)}
        if full is not None:
            want = [torch.stack([shard_part(shard_config(cfg, n, r))(k, full.weights[k]).float().sum() for k in keys])
                    for r in range(n)]
            rec["shards_equal_tp1_slices"] = all(bool(torch.allclose(e, w, rtol=1e-5, atol=1e-3))
                                                 for e, w in zip(every, want))
        emit(rec)
        torch.cuda.empty_cache()
        group = TPGroup(shard)
        for b in (int(x) for x in a.batches.split(",")):
            full_cache, local, tokens = _state(cfg, shard, b, a.context, dev, dtype)
            tp1, tpref = {}, None
            if rank == 0:  # 1. TP=1 on GPU 0
                for mode in tp1_modes:
                    try:
                        opts = {} if mode == "reference" else {**kw, **({"backend": MK_BACKEND[mode]}
                                                                         if mode in MK_BACKEND else {})}
                        make1 = (lambda c, m=mode, o=opts: make_step_runner(
                            "megakernel" if m in MK_BACKEND else m, full, c, **o))
                        tp1[mode] = _run(make1, full_cache, tokens, a.steps)
                    except Exception as e:  # noqa: BLE001 - the other modes still run
                        emit({"model": name, "batch": b, "tp": 1, "mode": mode,
                              "error": f"{type(e).__name__}: {e}"[:1000]})
                    torch.cuda.empty_cache()
            dist.barrier(group=slow)
            for mode, ar in tp2_modes:  # 2. TP=N
                rec = {"model": name, "batch": b, "tp": n, "mode": mode, "allreduce": ar}
                try:
                    if mode == "torch+graph":
                        from onekernel.bench.tp_graph import TPTorchGraphRunner

                        def make(c):
                            return TPTorchGraphRunner(model, c, group)
                    elif mode == "reference":
                        def make(c):
                            return group.step_runner("reference", model, c)
                    elif mode in MK_BACKEND:
                        def make(c, m=mode):
                            return group.step_runner("megakernel", model, c, backend=MK_BACKEND[m],
                                                     **({"push": True} if m in MK_PUSH else {}), **kw)
                    else:
                        def make(c, m=mode, ar=ar):
                            return group.step_runner(m, model, c, allreduce=ar, **kw)
                    got = _run(make, local, tokens, a.steps)
                    rec["gemv"] = got[3]
                    same = ("reference" if mode in ("reference", "torch+graph") else
                            "megakernel-gluon" if mode in MK_PUSH else mode)
                    if rank == 0 and same in tp1 and "reference" in tp1:
                        _compare(rec, got, tp1[same], tp1["reference"])
                    elif rank == 0 and a.no_tp1:  # the TP=N reference mode runs first: compare with it
                        if mode == "reference":
                            tpref = got
                        elif tpref is not None:
                            rec["compared_with"] = "tp reference"
                            _compare(rec, got, tpref, tpref)
                except Exception as e:  # noqa: BLE001 - the other modes still run
                    rec["error"] = f"{type(e).__name__}: {e}"[:1000]
                    traceback.print_exc()
                emit(rec)
                torch.cuda.empty_cache()
            del full_cache, local, tp1, tpref
        # 3. the forced timeouts last, at the first batch size: a rank that gives up a collective there (run 9: a
        # rendezvous past its store timeout while rank 0 compiled) leaves the ranks' later collectives out of step
        b = int(a.batches.split(",")[0])
        _, local, tokens = _state(cfg, shard, b, a.context, dev, dtype)
        dist.barrier(group=slow)
        for mk in MK_BACKEND:
            if (want is None or mk in want) and not (a.cpu and MK_BACKEND[mk] == "gluon"):
                emit(_forced_timeout(name, b, group, model, local, tokens, rank, kw, mk))
        del local
        full = model = None
        torch.cuda.empty_cache()
    close_rank()
    return 0


if __name__ == "__main__":
    if "WORLD_SIZE" not in os.environ:  # start the --tp ranks (torchrun), each running this file
        from onekernel.dist.process import NO_MULTICAST

        os.environ.update(NO_MULTICAST)
        os.environ.setdefault("ONEKERNEL_TP_TIMEOUT", "50")
        import socket

        with socket.socket() as sock:  # a free port: two checks may run at once
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        nproc = _args().tp
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                                  "--master-addr", "127.0.0.1", "--master-port", str(port), __file__, *sys.argv[1:]])
    sys.exit(main())
