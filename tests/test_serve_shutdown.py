"""Shutting `onekernel serve` down with requests in flight (SmolLM2-135M's shape with random weights on the CPU:
a 500-token stream takes some 25 s; a real process): the first SIGTERM/SIGINT prints one line and refuses new
requests; the second, or --shutdown-timeout later, stops the running ones (a stream ends with an error chunk and
[DONE], a plain request gets 503) and the process exits 0 without a traceback."""
import concurrent.futures
import json
import signal
import time

import httpx

from onekernel.bench.serve_process import Server

LONG = {"prompt": "hi", "max_tokens": 500, "ignore_eos": True, "stream": True, "logprobs": 0}  # a chunk per token


def start(*flags: str) -> Server:
    return Server("--model", "smollm2-135m", "--random-weights", "--mode", "reference", "--max-batch", "2",
                  "--max-seq-len", "512", *flags)


def wait_for(server: Server, words: str) -> None:
    deadline = time.monotonic() + 10
    while words not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)


def refused(server: Server) -> bool:
    """A new request after the first signal: the socket is closed, or the engine answers 503."""
    try:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    except httpx.TransportError:
        return True
    return r.status_code == 503 and "shutting down" in r.json()["error"]["message"]


def check_exit(server: Server, t_signal: float, within: float) -> None:
    rc = server.proc.wait(timeout=within + 10)
    log = server.log()
    assert rc == 0 and time.monotonic() - t_signal < within, (rc, log)
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert log.count("onekernel serve: shutting down: waiting for") == 1, log


def end_of_stream(lines) -> list[str]:
    rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and "shutting down" in json.loads(rest[-2][6:])["error"]["message"], rest[-3:]
    return rest


def test_first_sigterm_says_so_and_the_grace_period_ends_the_stream():
    with start("--shutdown-timeout", "1") as server:
        with httpx.stream("POST", server.url + "/v1/completions", json=LONG, timeout=60) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # the stream is running
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            wait_for(server, "shutting down: waiting for 1 running request (at most 1 s); press Ctrl-C again")
            assert refused(server)
            assert len(end_of_stream(lines)) < 400  # stopped, not finished
        check_exit(server, t0, within=6)
        assert "stopping 1 running request (1 s passed)" in server.log()


def test_second_sigint_stops_streamed_and_plain_requests_at_once():
    with start() as server, concurrent.futures.ThreadPoolExecutor(1) as pool:  # --shutdown-timeout 30
        plain = pool.submit(httpx.post, server.url + "/v1/completions", timeout=60,
                            json={"prompt": "hi", "max_tokens": 500, "ignore_eos": True})
        with httpx.stream("POST", server.url + "/v1/completions", json=LONG, timeout=60) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            while server.metric("onekernel_running_requests") < 2:
                time.sleep(0.05)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGINT)
            wait_for(server, "shutting down: waiting for 2 running requests (at most 30 s)")
            server.proc.send_signal(signal.SIGINT)
            end_of_stream(lines)
        r = plain.result()
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
        check_exit(server, t0, within=5)
        assert "stopping 2 running requests (second signal)" in server.log()
