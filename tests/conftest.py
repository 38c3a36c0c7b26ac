"""CPU test setup: the Triton interpreter and a private cache folder for generated kernels.

Both must be set (unless already in the environment) before triton is imported (triton reads TRITON_INTERPRET at import time).
"""
import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")  # a GPU run may pass TRITON_INTERPRET=0
os.environ.setdefault("ONEKERNEL_CACHE", tempfile.mkdtemp(prefix="onekernel_gen_"))
