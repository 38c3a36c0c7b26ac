"""Argument kind checks shared by the runtime's public entry points (``generate``, ``make_step_runner``,
``KVCache``): each raises an InputError naming the argument, what it got and what it takes."""
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
