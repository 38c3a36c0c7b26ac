"""Tensor parallel on the CPU (gloo): TP=2 prefill and decode equal the single-device reference, the CLI's --tp 2
equals --tp 1, a rank that dies or hangs makes the run exit with an error, and --tp is refused before anything
loads when it cannot run. Two processes per run (tests/tp_worker.py, or the CLI's own launcher)."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from onekernel.cli import main
from onekernel.dist.process import NO_MULTICAST, close_rank, init_rank
from onekernel.dist.sharding import ShardedModel, shard_config, shard_weights
from onekernel.dist.tp_reference import TPGroup
from onekernel.errors import DeviceError, InputError
from onekernel.models.config import get_config
from onekernel.models.load import LoadedModel, load_model
from onekernel.models.random_init import random_weights
from onekernel.models.tokenizer import Tokenizer
from onekernel.runtime.kv_cache import KVCache
from onekernel.runtime.reference import ReferenceRunner
from onekernel.runtime.runners import make_step_runner

# Tests that start TP ranks (2 to 8 processes; the megakernel's ranks spin on each other's events): README's
# command (pytest-xdist, --dist loadgroup) runs the TP files' tests (test_tp, test_tp_kernels, test_tp_many,
# test_tp_megakernel) in one worker, one at a time, so that two of them never share the 2 cores; xdist hands out
# groups, largest first, before the single tests, so this one starts early.
pytestmark = pytest.mark.xdist_group("tp-ranks")

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "tp_worker.py"
BOUND_S = 60  # a run with a failed rank must end within this (the bound); subprocess timeout, not timing


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tp: int, args: dict, env: dict | None = None, timeout: float = BOUND_S) -> None:
    """tests/tp_worker.py as ``tp`` gloo ranks (torchrun's variables, and ``env``); fails the test when a rank
    fails or the ranks take over ``timeout`` seconds."""
    env = {**os.environ, **(env or {}), "WORLD_SIZE": str(tp), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), json.dumps(args)], cwd=ROOT, stderr=subprocess.PIPE,
                              text=True, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(tp)]
    errs = [p.communicate(timeout=timeout)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(errs)


def _reference(cfg, seed, prompts, steps):
    """TP=1: prefill + greedy decode steps with runtime.reference -> (logits [steps+1, B, V], tokens, cache)."""
    model = LoadedModel(cfg, random_weights(cfg, torch.float32, "cpu", seed), Tokenizer.byte_level(), cfg.name)
    cache = KVCache(cfg, len(prompts), max(map(len, prompts)) + steps, torch.float32, "cpu")
    r = ReferenceRunner(model, cache)
    logits = [r.prefill(prompts)]
    tokens = [logits[0].argmax(-1).to(torch.int32)]
    for _ in range(steps):
        lg, nxt = r.step(tokens[-1])
        cache.seq_lens += 1
        logits.append(lg)
        tokens.append(nxt)
    return torch.stack(logits), torch.stack(tokens), cache


@pytest.mark.parametrize("name, vocab", [("tiny", None), ("tiny-qwen3", 253)])
def test_tp2_prefill_and_decode_equal_tp1(name, vocab, seed, tmp_path):
    """fp32: logits within rounding (the all-reduces add the ranks' partial sums: measured 2-3e-7 of the logits'
    range; scaling every all-reduce by 1 + 1e-4 gives 4e-6), greedy tokens
    (distributed argmax) equal wherever the top-2 margin is above that rounding, and rank 0's KV cache is the
    first half of the reference's KV heads."""
    import dataclasses

    cfg = get_config(name)
    cfg = dataclasses.replace(cfg, vocab_size=vocab) if vocab else cfg  # 253: uneven vocabulary ranges
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(cfg.vocab_size) for _ in range(n)] for n in (5, 3)]
    steps = 6
    out = tmp_path / "rank0.pt"
    _run_ranks(2, {"model": name, "vocab": vocab, "tp": 2, "seed": seed, "prompts": prompts, "steps": steps,
                   "out": str(out)})
    got = torch.load(out)
    want_logits, want_tokens, cache = _reference(cfg, seed, prompts, steps)
    assert got["logits"].shape == want_logits.shape == (steps + 1, 2, cfg.vocab_size)
    scale = want_logits.abs().max()
    err = (got["logits"] - want_logits).abs().max() / scale
    assert err < 2e-6, f"TP=2 logits differ from TP=1 by {err:.2e} of their range"
    top2 = want_logits.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 1e-4 * scale
    assert clear.float().mean() > 0.8  # the comparison below is about most positions, not a few
    assert torch.equal(got["tokens"][clear], want_tokens[clear])
    hkv = cfg.n_kv_heads // 2
    torch.testing.assert_close(got["k"], cache.k[:, :, :hkv], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got["v"], cache.v[:, :, :hkv], rtol=1e-6, atol=1e-6)


def _cli(*args, env=None, timeout=BOUND_S):
    """``python -m onekernel`` in a subprocess -> (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "onekernel", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **(env or {})})
    return p.returncode, p.stdout, p.stderr


GENERATE = ("generate", "--model", "tiny", "--random-weights", "--prompt", "hello", "--prompt", "a longer prompt",
            "--max-new-tokens", "6", "--json", "--quiet")


def test_cli_generate_tp2_equals_tp1(seed):
    rc, out, err = _cli(*GENERATE, "--seed", str(seed), "--tp", "2")
    assert rc == 0, err
    assert len(out.splitlines()) == 1  # rank 0 prints the one record; rank 1 stays quiet
    got = json.loads(out)
    rc, out, err = _cli(*GENERATE, "--seed", str(seed))
    assert rc == 0, err
    want = json.loads(out)
    assert [s["generated_ids"] for s in got["sequences"]] == [s["generated_ids"] for s in want["sequences"]]
    assert all(len(s["generated_ids"]) == 6 for s in got["sequences"])


def test_torchrun_sampled_equals_tp1(seed):
    """torchrun starts the ranks (the CLI joins its group); sampled tokens (every rank samples the same gathered
    logits with the same generator) equal --tp 1's."""
    sampled = (*GENERATE, "--seed", str(seed), "--temperature", "0.9", "--top-k", "50")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "onekernel",
                        *sampled, "--tp", "2"], cwd=ROOT, capture_output=True, text=True, timeout=BOUND_S)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    rc, out, err = _cli(*sampled)
    assert rc == 0, err
    assert [s["generated_ids"] for s in got["sequences"]] == [s["generated_ids"] for s in json.loads(out)["sequences"]]


@pytest.mark.parametrize("fault, env, says", [
    ("kill", {}, ["rank 0 of 2: all_reduce at decode step 2 failed: another rank died",
                  "tensor-parallel rank 1 of 2 was killed by SIGKILL"]),
    ("hang", {"ONEKERNEL_TP_TIMEOUT": "3"}, ["rank 0 of 2: ", " at decode step 2 failed: another rank died or did "
                                            "not answer within 3 s"]),
])
def test_a_failed_rank_ends_the_run_with_an_error(fault, env, says):
    """Rank 1 SIGKILLs itself (or sleeps for good) at decode step 2: rank 0's collective fails (at once, or after
    the timeout), it exits with an error, the launcher stops rank 1 and exits 2 within the bound."""
    rc, out, err = _cli(*GENERATE, "--tp", "2", env={"ONEKERNEL_TP_FAULT": f"1:{fault}:2", **env})
    assert rc == 2 and out == ""
    for s in says:
        assert s in err, err
    assert "Traceback" not in err


def test_cli_refuses_before_anything_loads(capsys, monkeypatch):
    monkeypatch.setattr("onekernel.dist.process.launch", lambda *a: pytest.fail("ranks were started"))
    monkeypatch.setattr("onekernel.cli_tp.launch", lambda *a: pytest.fail("ranks were started"))
    for extra, msg in [(("--tp", "3"), "tensor-parallel size 3 does not divide n_heads=4, n_kv_heads=2"),
                       (("--tp", "0"), "--tp must be >= 1, got 0"),
                       (("--tp", "2", "--max-new-tokens", "300"), "over the context of 256"),
                       (("--tp", "2", "--mode", "megakernel", "--interpret"),
                        "--mode megakernel at --tp > 1 runs on GPUs"),
                       (("--tp", "2", "--mode", "eager", "--interpret", "--allreduce", "symm"),
                        "--allreduce symm needs CUDA GPUs"),
                       (("--tp", "2", "--mode", "pdl", "--interpret", "--allreduce", "oneshot"),
                        "--allreduce oneshot needs CUDA GPUs"),
                       (("--tp", "2", "--allreduce", "symm"), "--allreduce applies to the kernel modes")]:
        assert main([*GENERATE, *extra]) == 2
        assert msg in capsys.readouterr().err


def test_bench_tp_refusals(capsys):
    bench = ("bench", "--model", "tiny", "--random-weights", "--tp", "2")
    assert main([*bench, "--modes", "megakernel,torch+compile"]) == 2
    assert "--tp 2 times torch, torch+graph, eager, graph, pdl, megakernel, megakernel-triton, megakernel-push (not torch+compile)" in capsys.readouterr().err
    assert main([*bench, "--study"]) == 2
    assert "--study runs at --tp 1 only" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(list(bench)) == 2
        assert "bench --tp times GPU ranks and needs CUDA GPUs" in capsys.readouterr().err
        assert main([*bench, "--modes", "megakernel-push,pdl"]) == 2  # a TP-only mode passes the mode check
        assert "bench --tp times GPU ranks and needs CUDA GPUs" in capsys.readouterr().err


def test_rank_variables_are_checked(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(InputError, match="the process variables RANK, WORLD_SIZE"):
        init_rank(2, "cpu")
    monkeypatch.setenv("WORLD_SIZE", "4")
    for v in ("RANK", "LOCAL_RANK"):
        monkeypatch.setenv(v, "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(InputError, match=r"4 processes were started \(WORLD_SIZE=4\) for --tp 2"):
        init_rank(2, "cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match=r"rank 0 runs on GPU 1 \(LOCAL_RANK\), but 1 GPUs are visible"):
        init_rank(2, "cuda")


@pytest.fixture
def one_rank(monkeypatch, seed):
    """A gloo group of one in this process (torchrun's variables, NVLink-multicast switches unset before):
    (the full ``tiny`` model, its one-rank shard as a ShardedModel, the Shard); the group is closed after."""
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    for k in NO_MULTICAST:
        monkeypatch.delenv(k, raising=False)
    init_rank(1, "cpu")
    try:
        full = load_model("tiny", random_weights=True, seed=seed)
        shard = shard_config(full.config, 1, 0)
        yield full, ShardedModel(shard.config, shard_weights(shard, full.weights), full.tokenizer, full.source,
                                 shard), shard
    finally:
        close_rank()


def _fake_bench_timing(monkeypatch):
    """bench --tp's loop on the CPU: a CPU cache and one untimed step in place of the CUDA-event timing."""
    import onekernel.bench.tp as bench_tp
    monkeypatch.setattr(bench_tp, "median_ms", lambda fn, **k: (fn(), {"median_ms": 2.0, "p10_ms": 1.0,
                                                                        "p90_ms": 3.0, "steps": 1})[1])
    monkeypatch.setattr(bench_tp, "copy_bandwidth_gbs", lambda: 1.0)
    monkeypatch.setattr(bench_tp, "random_decode_state",
                        lambda m, b, c: (KVCache(m.config, b, c, torch.float32, "cpu"), None))
    return bench_tp


def test_one_rank_group_is_the_reference_and_sets_the_environment(monkeypatch, one_rank):
    """A group of one (in this process): the TP runner equals the reference bitwise, the NVLink-multicast
    switches are set, and a shard refuses the single-device runners."""
    full, model, shard = one_rank
    assert {k: os.environ[k] for k in NO_MULTICAST} == NO_MULTICAST
    caches = [KVCache(full.config, 2, 16, torch.float32, "cpu") for _ in range(2)]
    tokens = torch.tensor([3, 200], dtype=torch.int32)
    prompts = [[1, 2, 3], [4]]
    ref, tp = ReferenceRunner(full, caches[0]), TPGroup(shard).step_runner("reference", model, caches[1])
    assert torch.equal(ref.prefill(prompts), tp.prefill(prompts))
    for a, b in zip(ref.step(tokens), tp.step(tokens)):
        assert torch.equal(a, b)
    with pytest.raises(InputError, match="one rank's tensor-parallel shard"):
        make_step_runner("reference", model, caches[1])
    # bench --tp's loop; "eager" (no GPU, no interpreter) fails on every rank and is recorded as an error
    bench_tp = _fake_bench_timing(monkeypatch)
    recs = bench_tp.bench_tp(model, TPGroup(shard), [1, 2], 8, modes=("torch", "eager"), steps=1)
    assert [(r["batch"], r["tp"], r["mode"], r["allreduce"], r["ms_per_step"], r["tokens_per_s"])
            for r in recs] == [(1, 1, "torch", None, 2.0, 500.0), (1, 1, "eager", "nccl", None, None),
                               (2, 1, "torch", None, 2.0, 1000.0), (2, 1, "eager", "nccl", None, None)]
    assert recs[0]["rel_err_vs_torch"] == 0.0 and recs[0]["argmax_agree"] == "1/1"
    assert "DeviceError: mode 'eager' runs Triton kernels on a CUDA GPU" in recs[1]["error"]
    table = bench_tp.tp_table(recs)
    assert "| tiny | 1 | 2 | torch | - | 2.000 | 1,000 |" in table
    assert "| eager | nccl | error: DeviceError" in table


def test_gemv_reaches_the_tp_ranks(monkeypatch, one_rank):
    """``gemv`` at TP > 1: generate(parallel=..., gemv="mma") builds the rank's step on the tensor-core path (its
    greedy tokens the reference's: fp32 products either way; without it a rank takes the unsharded model's path:
    test_tp_kernels.py); bench --tp records each onekernel mode's path (``gemv``; None for torch) and names it in
    the table; an unknown path is refused."""
    from onekernel.runtime.generate import generate

    full, model, shard = one_rank

    class Interpreted(TPGroup):  # the kernel modes in the Triton interpreter; records the path each step took
        paths: list = []

        def step_runner(self, mode, m, cache, **kw):
            r = super().step_runner(mode, m, cache, **({"interpret": True} if mode != "reference" else {}) | kw)
            self.paths.append(getattr(getattr(r, "bound", None), "graph", None) and r.bound.graph.meta["gemv"])
            return r

    group = Interpreted(shard)
    ids = [[3, 17, 41, 5]]
    want = generate(full, ids, max_new_tokens=2).sequences[0].generated_ids
    got = generate(model, ids, max_new_tokens=2, mode="eager", interpret=True, parallel=group, gemv="mma")
    assert group.paths == ["mma"] and got.sequences[0].generated_ids == want
    bench_tp = _fake_bench_timing(monkeypatch)
    recs = bench_tp.bench_tp(model, group, [1], 8, modes=("torch", "eager"), steps=1, gemv="mma")
    assert [(r["mode"], r["gemv"], r.get("error")) for r in recs] == [("torch", None, None), ("eager", "mma", None)]
    assert "| tiny | 1 | 1 | eager (mma) | nccl |" in bench_tp.tp_table(recs)
    with pytest.raises(InputError, match="unknown gemv path 'tensor'"):
        group.step_runner("eager", model, KVCache(shard.config, 1, 8, torch.float32, "cpu"), gemv="tensor")


def test_cli_takes_gemv_at_tp2(capsys, monkeypatch):
    """`generate --tp 2 --gemv mma` passes the checks and starts the ranks with it (they build the step on that
    path: test_gemv_reaches_the_tp_ranks); `bench --tp 2 --gemv mma` gets past --gemv to its GPU check; a path
    that is not fma or mma is refused by the parser."""
    launched = []
    monkeypatch.setattr("onekernel.cli_tp.launch", lambda n, argv: launched.append((n, argv)) or 0)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main([*GENERATE, "--tp", "2", "--mode", "eager", "--interpret", "--gemv", "mma"]) == 0
    (n, argv), = launched
    assert n == 2 and argv[argv.index("--gemv") + 1] == "mma"
    if not torch.cuda.is_available():
        assert main(["bench", "--model", "tiny", "--random-weights", "--tp", "2", "--gemv", "mma"]) == 2
        assert "bench --tp times GPU ranks and needs CUDA GPUs" in capsys.readouterr().err
    for cmd in (GENERATE, ("bench", "--model", "tiny", "--random-weights")):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--tp", "2", "--gemv", "tensor"])
        assert e.value.code == 2 and "invalid choice: 'tensor'" in capsys.readouterr().err
