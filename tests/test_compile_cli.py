"""Compile once, reuse everywhere (issue 12): ``onekernel warmup``, the compiling note, stable cache keys.

The CPU has no GPU to compile for at run time, so warmup runs its steps in the Triton interpreter here; the
cache-key test compiles nothing either: it asks two fresh processes for the megakernel's key in Triton's
on-disk cache (scripts/compile_sizes.py --key), which is what a second process looks the binary up by.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from onekernel.cli import main
from onekernel.cli_compile import CompileWatch, compile_note
from onekernel.runtime.generate import CACHE_LEN_MIN, default_cache_len

ROOT = Path(__file__).resolve().parents[1]


def test_warmup_runs_every_requested_case_with_a_progress_line(capsys):
    code = main(["warmup", "--model", "tiny", "--random-weights", "--batch", "1,3", "--mode", "eager,megakernel",
                 "--interpret"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for i, case in enumerate(("batch 1, eager", "batch 1, megakernel", "batch 3, eager", "batch 3, megakernel"), 1):
        assert f"[{i}/4] {case}: running one step in the Triton interpreter...\n" in err  # --interpret compiles nothing
        assert re.search(rf"\[{i}/4\] {case}: [\d.]+ s, \d+ kernel\(s\) compiled or loaded", err), err
    assert "warmed up tiny: 4 case(s)" in out and "Triton cache: " in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_warmup_without_a_gpu_is_one_error_line(capsys):
    assert main(["warmup", "--model", "tiny", "--random-weights"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA GPU" in err and "--interpret" in err


@pytest.mark.parametrize("flags, word", [(["--batch", "0,2"], "--batch"), (["--batch", "x"], "--batch"),
                                         (["--mode", "reference"], "--mode"), (["--mode", ""], "--mode"),
                                         (["--max-seq-len", "1"], "--max-seq-len")])
def test_warmup_bad_arguments_name_the_flag(capsys, flags, word):
    assert main(["warmup", "--model", "tiny", "--random-weights", "--interpret", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and word in err, err


def test_warmup_default_cache_length_is_generates_for_short_prompts():
    """warmup compiles for the cache length that generate picks on a GPU, so generate finds the kernels."""
    assert default_cache_len(1, 131072, True) == CACHE_LEN_MIN == default_cache_len(CACHE_LEN_MIN, 131072, True)
    assert [default_cache_len(n, 4096, True) for n in (37, 513, 3000, 5000)] == [512, 1024, 4096, 4096]
    assert default_cache_len(37, 256, True) == 256  # never past the model's context
    assert default_cache_len(37, 4096, False) == 37  # reference / interpreter: exactly what is needed


def test_compile_watch_notes_a_slow_load_once():
    seen = []
    with CompileWatch(on_slow=seen.append, slow_s=0.05) as w:
        w.started("fast")
        w.finished()
        time.sleep(0.15)
        assert seen == []
        w.started("slow_kernel")
        time.sleep(0.3)
        w.finished()
        w.started("second_slow")
        time.sleep(0.3)
        w.finished()
    assert seen == ["slow_kernel"] and w.count == 3 and w.seconds >= 0.6


def test_compile_watch_times_jit_loads_without_tritons_hooks(monkeypatch):
    """The watch wraps JITFunction._do_compile (every load of a kernel not yet in the process) and never sets
    Triton's JIT hooks: Triton JSON-serialises a kernel's constexprs for them, which raised TypeError for the
    megakernel's RUN_TASK (a JITFunction) on the H200."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    def slow_compile(fn, *args, **kw):
        time.sleep(0.2)
        return ("kernel", args, kw)

    monkeypatch.setattr(JITFunction, "_do_compile", slow_compile)
    seen = []
    with CompileWatch(on_slow=seen.append, slow_s=0.05) as w:
        assert knobs.runtime.jit_cache_hook is None and knobs.runtime.jit_post_compile_hook is None
        fn = SimpleNamespace(fn=SimpleNamespace(__name__="megakernel"))
        assert JITFunction._do_compile(fn, 1, warmup=True) == ("kernel", (1,), {"warmup": True})
    assert seen == ["megakernel"] and w.count == 1 and w.seconds >= 0.2
    assert JITFunction._do_compile is slow_compile


def test_compile_note_says_where_the_kernels_are_kept(monkeypatch, tmp_path):
    from triton import knobs

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "tc"))
    note = compile_note("llama-3.2-1b")
    assert note.startswith("note: compiling the Triton kernels for llama-3.2-1b")
    assert str(tmp_path / "tc") in note and os.environ["ONEKERNEL_CACHE"] in note and "onekernel warmup" in note


def test_megakernel_cache_key_is_the_same_in_two_processes(tmp_path):
    """A second process finds the megakernel in Triton's cache only if its key is the same: the generated
    ``run_task`` is written to a different folder in each process here (ONEKERNEL_CACHE), as on two machines."""
    keys = []
    for i in range(2):
        env = {**os.environ, "TRITON_INTERPRET": "0", "ONEKERNEL_CACHE": str(tmp_path / f"gen{i}")}
        p = subprocess.run([sys.executable, "compile_sizes.py", "--key", "tiny", "2", "megakernel"], env=env,
                           cwd=ROOT / "scripts", capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        keys.append(p.stdout.split()[-1])
        assert list((tmp_path / f"gen{i}").glob("onekernel_gen_megakernel_*.py"))
    assert keys[0] == keys[1] and len(keys[0]) == 64


def test_per_op_kernels_specialise_once_per_kind(monkeypatch):
    """Triton compiles a kernel once per specialisation of its int arguments (== 1, % 16 == 0, other): the
    per-op launches must not pass anything op-dependent there, or a kind compiles up to 3 times."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from onekernel.exec import codegen
    from onekernel.models.decode_graph import build_decode_step
    from onekernel.models.load import load_model
    from onekernel.runtime.kv_cache import KVCache

    seen = {}

    class Fake:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kw):
                ints = tuple(native_specialize_impl(BaseBackend, a, False, True, True) for a in args
                             if isinstance(a, int))
                seen.setdefault(self.name, set()).add(ints)
            return launch

    monkeypatch.setattr(codegen, "eager_kernel", lambda kind: Fake(kind.name))
    m = load_model("smollm2-135m", random_weights=True, dtype=torch.float32)
    step = build_decode_step(m.config, m.weights, KVCache(m.config, 1, 512))
    for op in step.graph.ops:
        codegen.launch_op(step.graph, op, step.tensors, prof_base=op.task_ids[0])
    assert len(seen) == len({op.kind.name for op in step.graph.ops}) and all(len(v) == 1 for v in seen.values())


def test_generate_progress_notes_a_compile_before_the_first_step_once():
    """The megakernel compiles while its runner is built, before any token: the watch catches that."""
    from io import StringIO

    from rich.console import Console
    from triton.runtime.jit import JITFunction

    from onekernel.cli_progress import GenerateProgress

    before = JITFunction._do_compile
    buf = StringIO()
    with GenerateProgress(["a"], 4, compile_note=True, delay_s=0.05, console=Console(file=buf)) as p:
        assert JITFunction._do_compile is not before
        p.watch.started("megakernel")
        time.sleep(0.3)
        p.watch.finished()
        p.token(0, False)
        p.token(0, False)  # the first decode step: no second note
        time.sleep(0.2)
    text = buf.getvalue()
    assert text.count("note: compiling the Triton kernels") == 1 and "for megakernel" in text, text
    assert JITFunction._do_compile is before
    with GenerateProgress(["a"], 4, compile_note=False, delay_s=0.05, console=Console(file=StringIO())) as p:
        assert p.watch is None and JITFunction._do_compile is before


def test_compile_watch_counts_loads_on_several_threads():
    """Three loads in flight at once on three threads (the streaming pdl's three kernels): three counted, their
    overlapping time once, and no timer left running."""
    import threading
    import time as _t

    from onekernel.cli_compile import CompileWatch

    w = CompileWatch(on_slow=lambda name: None, slow_s=60)
    go = threading.Barrier(3)

    def load():
        w.started("k")
        go.wait()
        _t.sleep(0.2)
        w.finished()
    ts = [threading.Thread(target=load) for _ in range(3)]
    t0 = _t.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = _t.perf_counter() - t0
    assert w.count == 3 and 0.19 < w.seconds <= wall + 0.01, (w.count, w.seconds, wall)
    timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
    for t in timers:  # a cancelled timer's thread ends as soon as its wait wakes
        t.join(1.0)
    assert not w._live and not any(t.is_alive() for t in timers)
