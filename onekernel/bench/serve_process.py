"""A real ``onekernel serve`` process (the serving benchmark's and the serve tests'): started on a free port,
ready once /health answers."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def metric(text: str, name: str) -> float:
    """The value of one sample in a /metrics text (``name`` with its labels, e.g. 'x_total{outcome="stop"}'),
    0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


class Server:
    """``onekernel serve ARGS`` in a subprocess; ``url`` (http://127.0.0.1:PORT), ``log()`` its stderr.
    ``wait=False``: return at once; call ``wait()`` before the first request."""

    def __init__(self, *args: str, timeout: float = 300.0, wait: bool = True, python: str = sys.executable):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([python, "-m", "onekernel.cli", "serve", "--port", str(port), *args],
                                     stdout=subprocess.DEVNULL, stderr=self._err, env=dict(os.environ))
        self.deadline = time.monotonic() + timeout
        if wait:
            self.wait()

    def wait(self) -> None:
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > self.deadline:
                self.close()
                raise RuntimeError(f"the server was not ready in time:\n{self.log()}")
            time.sleep(0.2)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def metric(self, name: str) -> float:
        return metric(httpx.get(self.url + "/metrics").text, name)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
