"""The CLI's own stdout and stderr: a stdout whose write failures ``cli.main`` reports in one line, and lines
on a stderr that may be closed."""
from __future__ import annotations

import os
import sys


class OutputError(Exception):
    """Standard output cannot be written: closed, or its disk is full (a closed pipe is BrokenPipeError)."""


class CheckedStdout:
    """``sys.stdout`` during a command: a write or flush that fails (a full disk, a closed descriptor) raises
    OutputError, so ``cli.main`` reports it in one line; a closed pipe stays BrokenPipeError."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            raise OutputError(getattr(e, "strerror", None) or str(e)) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            raise OutputError(getattr(e, "strerror", None) or str(e)) from None

    def __getattr__(self, name):
        return getattr(self.stream, name)


def say(line: str) -> None:
    """``line`` on stderr, if there is one that can be written (``2>&-`` leaves none: then nothing)."""
    if sys.stderr is not None:
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


def drop_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's flush at exit does not fail again
    (Python docs, "Note on SIGPIPE")."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
