"""Shutting ``onekernel serve`` down: uvicorn's server with signal handling of its own.

The first SIGINT or SIGTERM prints one line on stderr (whatever ``--log-level``) naming the requests still
running, and refuses new ones (uvicorn closes its socket, the engine answers 503); the running ones finish. A
second signal, or ``--shutdown-timeout`` seconds after the first, stops them: a stream ends with an error chunk
and ``data: [DONE]``, a plain request gets a 503. The process then exits 0, without a traceback. A third signal
quits at once (uvicorn's force exit). uvicorn's own handler, replaced here, waits in silence, cancels the
request tasks on a second Ctrl-C (``CancelledError`` tracebacks, streams cut without ``[DONE]``) and raises a
SIGTERM again once shut down (the process then dies of it).
"""
from __future__ import annotations

import threading
from typing import Callable

import uvicorn


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` over ``engine`` (an ``Engine``): ``say`` prints a line on stderr; ``timeout``: seconds
    the running requests get after the first signal. Call ``close()`` after ``run()``."""

    def __init__(self, config: uvicorn.Config, engine, timeout: float, say: Callable[[str], None]):
        super().__init__(config)
        self.engine, self.timeout, self.say = engine, timeout, say
        self.signals, self.timer = 0, None

    def handle_exit(self, sig: int, frame) -> None:
        """Called in the main thread on SIGINT / SIGTERM (not recorded: uvicorn would raise it again)."""
        self.signals += 1
        self.should_exit = True
        if self.signals == 1:
            n = self.engine.drain()
            if not n:
                self.say("onekernel serve: shutting down")
                return
            self.say(f"onekernel serve: shutting down: waiting for {n} running request{'s' * (n != 1)} (at most "
                     f"{self.timeout:g} s); press Ctrl-C again to stop now")
            self.timer = threading.Timer(self.timeout, self._stop, (f"{self.timeout:g} s passed",))
            self.timer.daemon = True
            self.timer.start()
        elif self.signals == 2:
            self._stop("second signal")
        else:
            self.force_exit = True

    def _stop(self, why: str) -> None:
        n = self.engine.abort()
        if n:
            self.say(f"onekernel serve: stopping {n} running request{'s' * (n != 1)} ({why})")

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
