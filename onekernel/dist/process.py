"""Tensor-parallel processes, through ``torch.distributed`` only: one process per rank (per GPU on CUDA), started
by ``torchrun`` or by ``launch`` (the CLI's ``--tp N``), each joining one process group (NCCL on CUDA, gloo on
the CPU) from torchrun's environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

Faults: every collective of the group gives up after ``timeout_s()`` seconds (ONEKERNEL_TP_TIMEOUT, default
30; NCCL's watchdog aborts the process on it), and a dead peer breaks the others' collectives at once, so a rank
that dies or hangs makes the others exit with an error within 60 s; ``launch`` stops the remaining ranks a few
seconds after one fails, and says which one failed and how.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from onekernel.errors import DeviceError, InputError, RankError

# NVLink multicast (NVLS) stays off in every process: on the shared GPU hosts a program using it can put the
# GPUs out of service (docs/DESIGN.md "Tensor parallel"; the device README).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TIMEOUT_S = 30.0  # default collective timeout
GRACE_S = 3.0  # launch: how long the other ranks get to report their own error after one rank fails
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def timeout_s() -> float:
    """The collective timeout in seconds: ONEKERNEL_TP_TIMEOUT (1..50, so a failure is reported within 60 s),
    default 30. Raises InputError for another value."""
    raw = os.environ.get("ONEKERNEL_TP_TIMEOUT", str(TIMEOUT_S))
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not 1 <= t <= 50:
        raise InputError(f"ONEKERNEL_TP_TIMEOUT must be a number of seconds in [1, 50], got {raw!r}")
    return t


def in_rank() -> bool:
    """True in a process started by torchrun or ``launch`` (WORLD_SIZE is set)."""
    return "WORLD_SIZE" in os.environ


@dataclass(frozen=True)
class RankInfo:
    """This process's ``rank`` of ``world`` and its ``device`` (cuda:LOCAL_RANK, or cpu)."""

    rank: int
    world: int
    device: torch.device


def init_rank(tp: int, device: str) -> RankInfo:
    """Join the process group of ``tp`` ranks described by torchrun's environment variables: NCCL on "cuda"
    (this process's GPU is LOCAL_RANK), gloo on "cpu"; collectives time out after ``timeout_s()``. Sets the
    NO_MULTICAST variables first. Raises InputError when WORLD_SIZE is not ``tp`` or a variable is missing,
    DeviceError when LOCAL_RANK names a GPU that is not there."""
    import torch.distributed as dist

    os.environ.update(NO_MULTICAST)
    missing = [v for v in RANK_VARS if v not in os.environ]
    if missing:
        raise InputError(f"--tp {tp}: the process variables {', '.join(missing)} are not set; start the ranks with "
                         f"`torchrun --nproc-per-node {tp} -m onekernel ...` or let onekernel start them")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world != tp:
        raise InputError(f"{world} processes were started (WORLD_SIZE={world}) for --tp {tp}; start {tp} "
                         f"(torchrun --nproc-per-node {tp})")
    dev = torch.device("cpu")
    if device == "cuda":
        local = int(os.environ["LOCAL_RANK"])
        if local >= torch.cuda.device_count():
            raise DeviceError(f"rank {rank} runs on GPU {local} (LOCAL_RANK), but {torch.cuda.device_count()} GPUs "
                              f"are visible; start at most that many ranks per host")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s()),
                                **({"device_id": dev} if dev.type == "cuda" else {}))
    return RankInfo(rank, world, dev)


def close_rank() -> None:
    """Leave the process group (if this process joined one)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def fault_action(rank: int, step: int) -> str | None:
    """The action of ONEKERNEL_TP_FAULT="RANK:ACTION:STEP" when it names this rank and decode step, else None."""
    spec = os.environ.get("ONEKERNEL_TP_FAULT")
    if not spec:
        return None
    r, action, s = spec.split(":")
    return action if int(r) == rank and int(s) == step else None


def fault_point(rank: int, step: int) -> None:
    """Fault injection for the tests: ONEKERNEL_TP_FAULT="RANK:kill|hang:STEP" makes that rank SIGKILL itself or
    sleep for good at that decode step ("RANK:skip:STEP": the megakernel runner skips its launch there, so its
    peers' remote waits give up, while its collectives still run: dist/tp_megakernel.py)."""
    action = fault_action(rank, step)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while action == "hang":
        time.sleep(3600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _how(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def _last_line(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


def launch(tp: int, argv: list[str]) -> int:
    """Run ``python -m onekernel ARGV`` as ``tp`` ranks on this host (torchrun's variables, a free port on
    127.0.0.1, NO_MULTICAST, OMP_NUM_THREADS=1 unless set), wait for them and return rank 0's exit code. Rank 0
    keeps this process's stdout and stderr (its own error, if any, is printed there); the others' stdout is
    dropped and their stderr kept in a file. When a rank fails, the others get GRACE_S seconds to finish, then
    are killed. Raises RankError naming a rank that failed on its own (killed by a signal, or a rank other than
    0 with an error: its last stderr line)."""
    env = {"OMP_NUM_THREADS": "1", **os.environ, **NO_MULTICAST, "WORLD_SIZE": str(tp),  # torchrun's OMP default
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs, logs, stopped = [], [], set()
    with tempfile.TemporaryDirectory(prefix="onekernel_tp_") as tmp:
        for r in range(tp):
            logs.append(os.path.join(tmp, f"rank{r}.err"))
            with open(logs[-1], "w") as err:
                quiet = {} if r == 0 else {"stdout": subprocess.DEVNULL, "stderr": err}
                procs.append(subprocess.Popen([sys.executable, "-m", "onekernel", *argv],
                                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, **quiet))
        deadline, failed = None, []  # failed: ranks in the order their failure was seen
        while any(p.poll() is None for p in procs):
            failed += [r for r, p in enumerate(procs) if p.returncode not in (None, 0) and r not in failed]
            if deadline is None and failed:
                deadline = time.monotonic() + GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                for r, p in enumerate(procs):
                    if p.poll() is None:
                        p.kill()
                        stopped.add(r)
            time.sleep(0.05)
        codes = [p.wait() for p in procs]
        failed += [r for r in range(tp) if codes[r] != 0 and r not in failed and r not in stopped]
        # a rank that failed on its own and has not said why on our stderr: killed by a signal, or not rank 0
        culprits = [r for r in failed if codes[r] < 0 or r != 0]
        if culprits:
            r = culprits[0]
            why = "" if codes[r] < 0 else f": {_last_line(logs[r])}"
            raise RankError(f"tensor-parallel rank {r} of {tp} {_how(codes[r])}{why}; every rank has stopped")
        return codes[0]
