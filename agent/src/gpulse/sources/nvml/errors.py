"""NVML error codes → what the agent does about them and how it counts them.

pynvml raises ``NVMLError_<Name>`` subclasses whose ``.value`` is the NVML return code; the same
codes come back per entry of ``nvmlDeviceGetFieldValues`` and per GPM metric, so everything here
works on the integer code. One pynvml error is not an ``NVMLError``: the unversioned wrappers
marked ``@throwOnVersionMismatch`` (the process lists) turn a missing ``_v3`` symbol into
``NVMLLibraryMismatchError``; :func:`code_of` reads the ``FunctionNotFound`` it was raised from.
"""

from __future__ import annotations

import enum
from typing import Any

from gpulse import schema

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
GPU_NOT_FOUND = 28
UNKNOWN = 999

#: return code -> ``schema.NVML_ERROR_KINDS`` entry (everything else is "other")
KIND_BY_CODE: dict[int, str] = {
    GPU_IS_LOST: "gpu_is_lost",
    GPU_NOT_FOUND: "gpu_is_lost",
    TIMEOUT: "timeout",
    UNKNOWN: "unknown",
    NO_PERMISSION: "no_permission",
    NOT_FOUND: "not_found",
    DRIVER_NOT_LOADED: "driver_not_loaded",
    UNINITIALIZED: "driver_not_loaded",
    LIB_RM_VERSION_MISMATCH: "lib_rm_version_mismatch",
    FUNCTION_NOT_FOUND: "function_not_found",
    ARGUMENT_VERSION_MISMATCH: "argument_version_mismatch",
    INSUFFICIENT_SIZE: "insufficient_size",
}
assert set(KIND_BY_CODE.values()) <= set(schema.NVML_ERROR_KINDS)

#: The library or driver went away: every GPU fails until NVML is initialised again.
DRIVER_GONE = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH})
#: This GPU is gone (fell off the bus); the others keep going.
LOST = frozenset({GPU_IS_LOST, GPU_NOT_FOUND})
#: The metric does not exist on this GPU/driver: absent from the line, never 0.
UNSUPPORTED = frozenset(
    {NOT_SUPPORTED, FUNCTION_NOT_FOUND, INVALID_ARGUMENT, ARGUMENT_VERSION_MISMATCH, NO_PERMISSION, NOT_FOUND}
)


class ReadOutcome(enum.Enum):
    """What one read of a GPU means for the rest of the cycle."""

    OK = "ok"  # go on (failed metrics were counted)
    GPU_LOST = "gpu_lost"  # this GPU fell off the bus; the others go on
    DRIVER_GONE = "driver_gone"  # every GPU will fail until NVML is initialised again


def nvml_errors(nvml: Any) -> tuple[type[BaseException], ...]:
    """The exception classes a pynvml call raises for an NVML failure (both families)."""
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    return (nvml.NVMLError, mismatch) if mismatch is not None else (nvml.NVMLError,)


def code_of(exc: BaseException) -> int:
    """The NVML return code of a pynvml exception; -1 (counted as "other") for anything else.

    ``NVMLLibraryMismatchError`` carries no code: it is raised while handling the
    ``NVMLError_FunctionNotFound`` of the missing versioned symbol (``exc.__context__``).
    """
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return value
    context = exc.__context__
    return code_of(context) if context is not None and context is not exc else -1


def kind_of(code: int) -> str:
    return KIND_BY_CODE.get(code, "other")


def outcome_of(code: int) -> ReadOutcome:
    if code in LOST:
        return ReadOutcome.GPU_LOST
    if code in DRIVER_GONE:
        return ReadOutcome.DRIVER_GONE
    return ReadOutcome.OK
