"""XID and other critical GPU events through an NVML event set, in a thread of its own.

The thread waits at most ``wait_ms`` (≤ 500 ms) per call so that closing the source never hangs;
``NVMLError_Timeout`` is the normal "nothing happened" answer of ``nvmlEventSetWait_v2`` and is not counted.
Events become ``gpu_event`` readings stamped when they arrive, queued for the next collect().
NVML keeps no history from before registration, so a source re-registers after a driver re-init.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpulse.sources.base import Reading
from gpulse.sources.nvml import errors as E

log = logging.getLogger(__name__)

#: (pynvml constant name, fallback bit, event kind)
EVENT_TYPES: tuple[tuple[str, int, str], ...] = (
    ("nvmlEventTypeXidCriticalError", 0x8, "xid"),
    ("nvmlEventTypeDoubleBitEccError", 0x2, "ecc_double_bit"),
    ("nvmlEventTypeSingleBitEccError", 0x1, "ecc_single_bit"),
    ("nvmlEventTypeSingleBitEccErrorStorm", 0x200, "ecc_single_bit_storm"),
    ("nvmlEventTypeDramRetirementEvent", 0x400, "dram_retirement"),
    ("nvmlEventTypeDramRetirementFailure", 0x800, "dram_retirement_failure"),
    ("nvmlEventTypeNonFatalPoisonError", 0x1000, "poison_nonfatal"),
    ("nvmlEventTypeFatalPoisonError", 0x2000, "poison_fatal"),
    ("nvmlEventTypeGpuUnavailableError", 0x4000, "gpu_unavailable"),
    ("nvmlEventTypeGpuRecoveryAction", 0x8000, "recovery_action"),
)

#: A few XIDs that matter for training (docs.nvidia.com/deploy/xid-errors); others get a generic text.
XID_TEXT: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault (MMU fault)",
    43: "GPU stopped processing (reset channel)",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    154: "GPU recovery action changed",
}

RECOVERY_TEXT: dict[int, str] = {
    0: "none",
    1: "GPU reset required",
    2: "node reboot required",
    3: "drain peer-to-peer traffic",
    4: "drain and reset",
    5: "recover IMEX domain",
    6: "bus reset required",
    7: "system reboot required",
}


def handle_key(handle: Any) -> int:
    """A stable integer for a device handle (NVML hands back the same pointer in event data)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def describe(kind: str, data: int) -> str:
    if kind == "xid":
        return f"XID {data}: {XID_TEXT.get(data, 'see docs.nvidia.com/deploy/xid-errors')}"
    if kind == "recovery_action":
        return f"recovery action: {RECOVERY_TEXT.get(data, str(data))}"
    return kind.replace("_", " ")


class EventWatcher:
    """Registers the supported critical event types of each GPU and turns events into readings."""

    def __init__(
        self,
        nvml: Any,
        gpus: list[tuple[int, Any]],
        emit: Callable[[Reading], None],
        count_error: Callable[[int], None],
        wait_ms: int = 500,
    ) -> None:
        self.nvml = nvml
        self.emit = emit
        self.count_error = count_error
        self.wait_ms = min(max(1, wait_ms), 500)
        self.types = [(getattr(nvml, name, bit), kind) for name, bit, kind in EVENT_TYPES]
        self.wanted = 0
        for bit, _ in self.types:
            self.wanted |= bit
        self._by_key = {handle_key(h): idx for idx, h in gpus}
        self._gpus = gpus
        self._set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: GPU index -> registered event mask
        self.registered: dict[int, int] = {}

    def start(self) -> bool:
        """Create the set and register; False when no GPU supports any wanted event."""
        nv = self.nvml
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self.count_error(E.code_of(e))
            return False
        for idx, h in self._gpus:
            mask = self._register(h)
            if mask:
                self.registered[idx] = mask
        if not self.registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="gpulse-nvml-events", daemon=True)
        self._thread.start()
        return True

    def _register(self, handle: Any) -> int:
        nv = self.nvml
        try:
            mask = nv.nvmlDeviceGetSupportedEventTypes(handle) & self.wanted
        except nv.NVMLError as e:
            if E.code_of(e) not in E.UNSUPPORTED:
                self.count_error(E.code_of(e))
            return 0
        if not mask:
            return 0
        try:
            nv.nvmlDeviceRegisterEvents(handle, mask, self._set)
            return mask
        except nv.NVMLError:
            pass
        done = 0  # some drivers refuse the whole mask but take the types one by one
        for bit, _ in self.types:
            if mask & bit:
                try:
                    nv.nvmlDeviceRegisterEvents(handle, bit, self._set)
                    done |= bit
                except nv.NVMLError as e:
                    if E.code_of(e) not in E.UNSUPPORTED:
                        self.count_error(E.code_of(e))
        return done

    def _run(self) -> None:
        nv = self.nvml
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        while not self._stop.is_set():
            try:
                data = wait(self._set, self.wait_ms)
            except nv.NVMLError as e:
                code = E.code_of(e)
                if code == E.TIMEOUT:
                    continue
                self.count_error(code)
                if code in E.DRIVER_GONE:
                    log.warning("NVML event thread stops: %s (restarted after re-init)", e)
                    return
                self._stop.wait(self.wait_ms / 1000)  # a GPU-level error: keep listening, don't spin
                continue
            except Exception:
                log.exception("NVML event wait failed")
                self._stop.wait(self.wait_ms / 1000)
                continue
            self._deliver(data)

    def _deliver(self, data: Any) -> None:
        idx = self._by_key.get(handle_key(data.device))
        if idx is None:
            return
        etype = int(data.eventType)
        value = int(data.eventData)
        ts = time.time_ns()
        for bit, kind in self.types:
            if etype & bit:
                xid = value if kind == "xid" else 0
                fields = {"kind": kind, "xid": xid, "data": value, "text": describe(kind, value)}
                self.emit(Reading("gpu_event", idx, fields, ts))
                ts += 1  # one point per kind, none overwriting another

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 2.0)
            self._thread = None
        self._free()

    def _free(self) -> None:
        if self._set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._set)
            except Exception:
                pass
            self._set = None
