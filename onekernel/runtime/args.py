"""Argument kind checks shared by the runtime's public entry points (``generate``, ``make_step_runner``,
``KVCache``): each raises an InputError naming the argument, what it got and what it takes; and the ``--gemv``
option every command that builds a decode step offers (``add_gemv_argument``)."""
from __future__ import annotations

from onekernel.errors import InputError


def check_model(model) -> None:
    """InputError unless ``model`` is a ``models.load.LoadedModel`` (what ``load_model`` returns)."""
    from onekernel.models.load import LoadedModel
    if not isinstance(model, LoadedModel):
        raise InputError(f"model must be a LoadedModel, got {type(model).__name__} {model!r:.40}; load it first "
                         f"with onekernel.models.load.load_model (e.g. load_model() for the default model, "
                         f"load_model(path), or load_model('tiny', random_weights=True))")


def check_flag(name: str, value) -> None:
    """InputError unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise InputError(f"{name} must be True or False, got {value!r:.40}")


def check_int(name: str, value) -> int:
    """``value`` if it is an int (not a bool), else InputError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{name} must be an integer, got {value!r:.40}")
    return value


GEMV_HELP = ("GEMV path of the Triton modes: fma (CUDA cores) or mma (tensor cores, the batch padded to 16); default: "
             "the model's (mma for bf16/fp16 models with a hidden size >= 1024, else fma: "
             "models.decode_graph.default_gemv)")


def add_gemv_argument(p) -> None:
    """``--gemv fma|mma`` (default None: the model's path) on an argparse parser."""
    from onekernel.ops.tiling import GEMV_PATHS

    p.add_argument("--gemv", choices=GEMV_PATHS, default=None, help=GEMV_HELP)


def gemv_options(gemv, mode: str) -> dict:
    """The runner options of a ``gemv`` choice (None: the model's default path, ``runtime.runners.megakernel_step``
    for the single-GPU megakernel): {} or {"gemv": gemv}, the same at every tensor-parallel size (the ranks take the
    unsharded model's path: ``dist.tp_kernels.rank_gemv``). Raises
    InputError for a path that is not "fma" or "mma" and for the reference mode (PyTorch, no GEMV kernels)."""
    if gemv is None:
        return {}
    from onekernel.ops.tiling import GEMV_PATHS

    if gemv not in GEMV_PATHS:
        raise InputError(f"gemv (--gemv) must be one of {', '.join(GEMV_PATHS)}, got {gemv!r:.40}")
    if mode == "reference":
        raise InputError("--gemv selects the GEMV kernels of the Triton modes; the reference mode (the default on a "
                         "machine without a GPU) runs PyTorch: drop --gemv, or pick a Triton mode (--mode eager, "
                         "graph, pdl or megakernel; on the CPU with --interpret)")
    return {"gemv": gemv}
