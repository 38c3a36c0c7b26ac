"""One rank of the tensor-parallel megakernel tests (tests/test_tp_megakernel.py starts ``tp`` of
them with torch.multiprocessing's spawn, handing them all the same shared-memory pools: ``dist.tp_megakernel.shared_pools``).

``run(rank, a, pools)``: joins a gloo group of ``a["tp"]`` ranks on ``a["port"]``, builds the rank's shard of the
``a["model"]`` config (default ``tiny``; random fp32 weights of ``a["seed"]``, vocabulary ``a["vocab"]``) and its
TPMegakernelRunner in the Triton interpreter (one worker; GEMV path ``a["gemv"]``, default the model's), then prefill
and ``a["steps"]`` greedy steps (``a["mode"]``: that kernel mode with ``allreduce="oneshot"`` instead,
``dist.tp_oneshot``). Saves to ``a["out"]``.rank{r}.pt the gathered logits and tokens, its KV cache, every
reduced buffer (``*.ar.out``) after the last step and the GEMV path its graph took; with
``a["fault"]`` (ONEKERNEL_TP_FAULT) rank 0 saves the KernelTimeoutError's message of its first step instead.
"""
import os

import torch


def run(rank: int, a: dict, pools: list) -> None:
    os.environ.update({"WORLD_SIZE": str(a["tp"]), "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(a["port"]), "OMP_NUM_THREADS": "1"})
    if a.get("fault"):
        os.environ["ONEKERNEL_TP_FAULT"] = a["fault"]
    torch.set_num_threads(1)
    from tp_worker import greedy, rank_state

    from onekernel.dist.process import close_rank
    from onekernel.dist.tp_megakernel import TPMegakernelRunner
    from onekernel.errors import KernelTimeoutError

    info, model, group, cache = rank_state(a)
    prompts = a["prompts"]
    limit = {"spin_limit": a["spin_limit"]} if a.get("spin_limit") else {}
    if a.get("mode"):  # a kernel mode with the one-shot all-reduce kernels (dist/tp_oneshot.py)
        runner = group.step_runner(a["mode"], model, cache, interpret=True, pools=pools, gemv=a.get("gemv"),
                                   allreduce="oneshot", **limit)
    else:
        runner = TPMegakernelRunner(model, cache, group, interpret=True, pools=pools, gemv=a.get("gemv"), **limit)
    out = f"{a['out']}.rank{info.rank}.pt"
    reset = None
    if a.get("mode"):  # the constructor's load_kernels put every run count, flag and the error word back to 0
        t = runner.bound.tensors
        # the kernel reads its rank from pdelta's last entry (one compiled kernel for every rank): fail at once here,
        # not by the peers' poll limit (minutes in the interpreter)
        assert int(t["oneshot.pdelta"][-1]) == info.rank, (t["oneshot.pdelta"].tolist(), info.rank)
        reset = bool(runner.err.eq(0).all()) and all(
            bool(t[f"{op}.flags"].eq(0).all()) and bool(t[f"{op}.mine"][:-1].eq(0).all()) for op in runner._ar)
    if a.get("fault"):
        runner.step(runner.prefill(prompts).argmax(-1).to(torch.int32))
        msg = ""
        try:
            runner.check()
        except KernelTimeoutError as e:
            msg = str(e)
        torch.save({"error": msg}, out)
        close_rank()
        return
    logits, tokens = greedy(runner, cache, prompts, a["steps"], check=True)
    t = runner.bound.tensors
    reduced = {n: t[n].clone() for n in t if n.endswith(".ar.out")}
    torch.save({"logits": logits, "tokens": tokens, "k": cache.k, "v": cache.v,
                "reduced": reduced, "gemv": runner.bound.graph.meta["gemv"], "reset": reset}, out)
    close_rank()
