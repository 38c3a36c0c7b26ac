"""Progress of ``onekernel generate`` on stderr (``rich``), so that a long run never looks hung.

Nothing shows for a run shorter than ``DELAY_S``. After that: on a terminal, a live display (the phase and
the elapsed time, then one bar per sequence: tokens so far of max_new_tokens, "done" once it stopped), cleared
at the end; elsewhere (a pipe, a log file), a status line every ``INTERVAL_S`` seconds and one at the end. In a
Triton mode, a kernel that compiles (``cli_compile.CompileWatch``: its load takes longer than 2 s, as the
megakernel's does while its runner is built) or a first decode step longer than ``DELAY_S`` gets one line
saying the kernels are compiling (on a first run of a model, mode and batch size) and where they are kept
(``cli_compile.compile_note``). Never writes to stdout.
"""
from __future__ import annotations

import threading
import time

DELAY_S = 3.0  # a run shorter than this shows nothing
INTERVAL_S = 15.0  # between status lines when stderr is not a terminal


class GenerateProgress:
    """Context manager around a generate run. ``prompts``: the batch (labels the rows); ``compile_note``: the
    run's mode compiles Triton kernels on its first decode step; ``enabled`` False (``--quiet``, or no stderr)
    turns every method into a no-op; ``console``: a rich Console (default: stderr). Calls, from the main
    thread: ``phase(text)``, ``token(seq_index, done)`` for every generated token, ``note(line)`` for a line
    above the display, ``release_terminal()`` when text starts streaming to stdout on a terminal (the text then
    shows the progress: the display stops for good; the compile note still comes). A watcher thread keeps the
    display going during a long wait."""

    def __init__(self, prompts: list[str], max_new_tokens: int, *, compile_note: bool, enabled: bool = True,
                 delay_s: float | None = None, console=None):
        self.enabled = enabled
        if not enabled:
            return
        from rich.console import Console
        from rich.markup import escape
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = console or Console(stderr=True)
        self.delay = DELAY_S if delay_s is None else delay_s
        self.n, self.max_new = len(prompts), max_new_tokens
        self.counts, self.done = [0] * self.n, [False] * self.n
        self.compile_note, self.compiling_since, self.noted = compile_note, None, False
        self.text, self.t0, self.last_line = "starting", time.perf_counter(), None
        self.shown = self.released = False
        self.lock, self.stop = threading.RLock(), threading.Event()
        self.live = None
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(),
                             TextColumn("{task.completed:.0f}/{task.total:.0f}{task.fields[state]}"),
                             console=self.console)
        self.rows = [self.bars.add_task(f"[{i}] {escape(repr(p)[:40])}", total=max_new_tokens, state="")
                     for i, p in enumerate(prompts)]
        self.watcher = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "GenerateProgress":
        self.watch = None
        if self.enabled:
            if self.compile_note:  # a kernel load that turns out to be a compile (even before the first step)
                from onekernel.cli_compile import SLOW_S, CompileWatch
                self.watch = CompileWatch(on_slow=self.compiling, slow_s=min(SLOW_S, self.delay)).__enter__()
            self.watcher.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self.enabled:
            return
        if self.watch is not None:
            self.watch.__exit__(None, None, None)
        self.stop.set()
        self.watcher.join()
        with self.lock:
            self._check_compile()
            if self.live is not None:
                self.live.stop()
            elif self.shown and not self.released and exc_type is None:  # a last status line (off a terminal)
                self.console.print(self._status(), markup=False, highlight=False, soft_wrap=True)

    def phase(self, text: str) -> None:
        if self.enabled:
            with self.lock:
                self.text = text
                self._tick()

    def token(self, i: int, done: bool) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.counts[i] += 1
            self.done[i] = done
            self.bars.update(self.rows[i], completed=self.counts[i], state=" done" if done else "")
            self._check_compile()
            prefill = sum(self.counts) - self.n  # < 0 until every sequence has its first (prefill) token
            if prefill == 0 and not all(self.done):
                self.compiling_since = time.perf_counter()
                self.text = "first decode step" + (" (compiling the kernels on a first run)" * self.compile_note)
            elif prefill > 0:
                self.compiling_since, self.text = None, "decoding"
            self._tick()

    def note(self, line: str) -> None:
        if self.enabled:
            with self.lock:
                console = self.live.console if self.live is not None else self.console
                console.print(line, markup=False, highlight=False, soft_wrap=True)

    def compiling(self, kernel: str) -> None:
        """A kernel has been compiling for a while (called from the CompileWatch's timer thread): say so once,
        with where the compiled kernels are kept."""
        with self.lock:
            self.text = "compiling the Triton kernels (a first run)"
            self._note_compile(kernel)
            self._tick()

    def release_terminal(self) -> None:
        if self.enabled:
            with self.lock:
                self.released = True
                if self.live is not None:
                    self.live.stop()
                    self.live = None

    # ---- internals (called with the lock held, or from the watcher thread) ----

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text
        return Group(Text(self._headline()), self.bars)

    def _headline(self) -> str:
        return f"onekernel generate: {self.text}, {time.perf_counter() - self.t0:.0f} s"

    def _status(self) -> str:
        seqs = " ".join(f"[{i}] {c}/{self.max_new}{' done' * d}" for i, (c, d) in enumerate(zip(self.counts,
                                                                                               self.done)))
        return f"{self._headline()}; tokens per sequence: {seqs}"

    def _check_compile(self) -> None:
        """The compile note, once, when the first decode step of a Triton mode has run longer than the delay."""
        if (self.compile_note and not self.noted and self.compiling_since is not None
                and time.perf_counter() - self.compiling_since >= self.delay):
            self._note_compile("the first decode step")

    def _note_compile(self, what: str) -> None:
        if not self.noted:
            self.noted = True
            from onekernel.cli_compile import compile_note
            self.note(compile_note(what))

    def _tick(self) -> None:
        """Show the display once the run is older than the delay; off a terminal, a status line per interval."""
        now = time.perf_counter()
        if not self.shown and now - self.t0 >= self.delay:
            self.shown = True
            if self.console.is_terminal and not self.released:
                from rich.live import Live
                self.live = Live(self, console=self.console, transient=True, redirect_stdout=False,
                                 redirect_stderr=False, refresh_per_second=4)
                self.live.start()
        if (self.shown and not self.released and not self.console.is_terminal
                and (self.last_line is None or now - self.last_line >= INTERVAL_S)):
            self.last_line = now
            self.console.print(self._status(), markup=False, highlight=False, soft_wrap=True)

    def _watch(self) -> None:
        """Keeps the display going while the main thread waits (loading, a long step): every 0.5 s."""
        while not self.stop.wait(min(0.5, self.delay) or 0.05):
            with self.lock:
                self._check_compile()
                self._tick()
