"""``python -m onekernel``: the command line (what ``torchrun -m onekernel`` and ``--tp N`` run in each rank)."""
import os
import sys

from onekernel.cli import main

code = main()
if code and "torch.distributed" in sys.modules and sys.modules["torch.distributed"].is_initialized():
    # a rank that failed (its error is printed): leave without tearing down the process group, whose threads
    # abort the interpreter's shutdown after a peer died (gloo: "terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
