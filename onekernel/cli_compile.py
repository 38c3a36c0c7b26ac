"""Where compiled kernels live, and a watch on Triton's compiles that the CLI turns into progress lines.

Triton compiles a kernel on its first launch in a process and keeps the binary in its on-disk cache
(``TRITON_CACHE_DIR``, default ``~/.triton/cache``), keyed by the kernel's source and constants: a later process
(and ``onekernel warmup`` ahead of time) finds it there. The generated wrappers (the per-op kernels and the
megakernel's ``run_task``) are content-addressed source files in ``exec.codegen.cache_dir()``, so their keys
are the same in every process (tests/test_compile_cli.py checks it).
"""
from __future__ import annotations

import os
import threading
import time

SLOW_S = 2.0  # a kernel load that takes longer is a compile, not a cache hit


def cache_dirs() -> tuple[str, str]:
    """(Triton's kernel cache folder, onekernel's generated-source folder)."""
    from triton import knobs

    from onekernel.exec.codegen import cache_dir

    return os.path.abspath(knobs.cache.dir), str(cache_dir())


def compile_note(what: str = "the kernels") -> str:
    """The one line the CLI prints on stderr while a first run compiles: what compiles and where it is kept."""
    triton_dir, gen_dir = cache_dirs()
    return (f"note: compiling the Triton kernels for {what} (a first run of this model, mode, batch size and context); "
            f"later runs reuse them from the Triton cache in {triton_dir} (generated sources in {gen_dir}); "
            f"`onekernel warmup` compiles ahead of time")


class CompileWatch:
    """Context manager that times every kernel load of Triton's JIT while it is active: it wraps
    ``JITFunction._do_compile`` (what a launch calls when the kernel is not yet in the process: a compile, or a
    load from the on-disk cache) and puts the original back on exit. Not Triton's ``jit_cache_hook``: Triton
    JSON-serialises every constexpr before calling that hook, and the megakernel's ``RUN_TASK`` constexpr is a
    JITFunction, so a hook made its launch raise TypeError (H200, session 6).

    ``count``: kernels loaded or compiled so far; ``seconds``: the time with at least one of them in flight (loads on
    several threads at once count once). ``on_slow(name)`` is called
    once (from a timer thread) when one load has run longer than ``slow_s``: a real compile, not a cache hit.
    Nested watches each see every load."""

    def __init__(self, on_slow=None, slow_s: float = SLOW_S):
        self.on_slow, self.slow_s = on_slow, slow_s
        self.count, self.seconds, self.slow = 0, 0.0, False
        # loads in flight, per thread (the streaming pdl compiles its three kernels at once): thread id -> timer;
        # seconds counts the wall time with at least one load in flight, from _t0
        self._live, self._t0, self._lock = {}, None, threading.Lock()

    def __enter__(self) -> "CompileWatch":
        from triton.runtime.jit import JITFunction

        self._orig = orig = JITFunction.__dict__.get("_do_compile")
        if orig is None:  # a Triton without this private method: no note, never a failed run
            return self

        def do_compile(fn, *args, **kw):
            self.started(getattr(getattr(fn, "fn", None), "__name__", "a kernel"))
            try:
                return orig(fn, *args, **kw)
            finally:
                self.finished()

        JITFunction._do_compile = do_compile
        return self

    def __exit__(self, *exc) -> None:
        from triton.runtime.jit import JITFunction

        if self._orig is not None:
            JITFunction._do_compile = self._orig
        self.finished(everything=True)

    def started(self, name: str) -> None:
        """A kernel load begins on this thread (called by the wrapped ``_do_compile``; tests call it directly)."""
        with self._lock:
            if not self._live:
                self._t0 = time.perf_counter()
            timer = None
            if self.on_slow is not None and not self.slow:
                timer = threading.Timer(self.slow_s, self._fire, (name,))
                timer.daemon = True
                timer.start()
            self._live[threading.get_ident()] = timer

    def finished(self, everything: bool = False) -> None:
        """This thread's load is done (idempotent); ``everything``: every load in flight (on exit)."""
        with self._lock:
            ids = list(self._live) if everything else [threading.get_ident()]
            for i in ids:
                if i not in self._live:
                    continue
                timer = self._live.pop(i)
                if timer is not None:
                    timer.cancel()
                self.count += 1
            if not self._live and self._t0 is not None:
                self.seconds += time.perf_counter() - self._t0
                self._t0 = None

    def _fire(self, name: str) -> None:
        with self._lock:
            if not self._live or self.slow:
                return
            self.slow = True
        self.on_slow(name)


def note_when_slow(what: str) -> CompileWatch:
    """A CompileWatch that prints ``compile_note`` for ``what`` (and the kernel) on stderr once a kernel load
    turns out to be a compile."""
    from onekernel.cli_output import say

    return CompileWatch(on_slow=lambda kernel: say(compile_note(f"{what} ({kernel})")))
