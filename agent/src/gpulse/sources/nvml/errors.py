"""NVML error codes → what the agent does about them and how it counts them.

pynvml raises ``NVMLError_<Name>`` subclasses whose ``.value`` is the NVML return code; the same
codes come back per entry of ``nvmlDeviceGetFieldValues`` and per GPM metric, so everything here
works on the integer code.
"""

from __future__ import annotations

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


def code_of(exc: BaseException) -> int:
    """The NVML return code of a pynvml exception; -1 (counted as "other") for anything else."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else -1


def kind_of(code: int) -> str:
    return KIND_BY_CODE.get(code, "other")
