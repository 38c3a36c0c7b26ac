"""Errors onekernel raises for bad input. Each message says what was wrong and what to do."""


class OneKernelError(Exception):
    """Base class: bad input or an unsupported request, reported before any state is changed."""


class ModelFileError(OneKernelError):
    """A model file or folder is missing, truncated or corrupt."""


class UnsupportedModelError(OneKernelError):
    """An architecture, tensor type, head size, hidden size or dtype onekernel does not support."""


class InputError(OneKernelError):
    """A prompt longer than the context, a batch over the limit, or a bad generation argument."""


class DeviceError(OneKernelError):
    """A GPU-only mode or feature was asked for on a machine without a GPU, or too many workers."""


class ScheduleError(OneKernelError):
    """A static schedule that could deadlock (a task waits on one placed later, or a cyclic wait-for graph)."""


class KernelTimeoutError(OneKernelError):
    """A bounded spin in the megakernel gave up: names the task, op, tile, event and counts."""


class RankError(OneKernelError):
    """A tensor-parallel peer rank died or did not answer a collective in time: names the rank and the step."""
