"""Calls with a built-in wait, run on a thread of their own so the sampling cycle never waits.

``nvmlDeviceGetPcieThroughput`` "is querying a byte counter over a 20ms interval" (NVML
reference): two of them per GPU cost 40 ms of waiting, 320 ms on an 8-GPU node, a third of a 1 s
cycle. It is the only documented wait among the calls gpulse makes (``nvmlEventSetWait`` waits by
design and has its own thread). Where the PCIe byte counters exist as field values (197/198) the
cycle uses those and this reader is not started; otherwise it reads the 20 ms windows of those
GPUs every ``interval_s`` and the cycle picks up whatever is fresh, like a ~10 s tier. ctypes
releases the GIL while the driver waits, so the wait costs the agent no CPU.

Unit: the reference says "throughput in KB/s"; whether K is 1000 or 1024 is not stated anywhere
public (nvidia-smi prints "KB/s"; nvitop multiplies by 1024; DCGM's field doc says "in KB").
``PCIE_KB`` keeps 1024 (KiB, as nvitop); ``make gpu-check`` measures the ratio against the PCIe
byte counter during host-to-device copies on a real GPU (``pcie_kb`` in its summary).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpulse.sources.nvml import errors as E

log = logging.getLogger(__name__)

PCIE_KB = 1024
FIELDS = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")


class WindowReader:
    """Reads the PCIe 20 ms windows of some GPUs every ``interval_s`` on a daemon thread."""

    def __init__(
        self,
        nvml: Any,
        gpus: list[tuple[int, Any]],
        count_error: Callable[[int], None],
        interval_s: float = 10.0,
    ) -> None:
        self.nvml = nvml
        self.gpus = gpus
        self.count_error = count_error
        self.interval_s = interval_s
        self._fresh: dict[int, dict[str, float]] = {}
        self._unsupported: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpulse-nvml-window", daemon=True)
        self._thread.start()

    def take(self, index: int) -> dict[str, float] | None:
        """The values read for GPU ``index`` since the last take, if any."""
        with self._lock:
            return self._fresh.pop(index, None)

    def unsupported(self) -> list[int]:
        """GPUs found without the call since the last look (the probe is this thread's first read,
        so that opening the source does not wait 20 ms per GPU either)."""
        with self._lock:
            out, self._unsupported = self._unsupported, []
            return out

    def _run(self) -> None:
        nv = self.nvml
        read = nv.nvmlDeviceGetPcieThroughput
        gpus = list(self.gpus)
        while not self._stop.is_set():
            for index, handle in list(gpus):
                if self._stop.is_set():
                    return
                try:
                    values = {name: float(read(handle, counter) * PCIE_KB) for counter, name in enumerate(FIELDS)}
                except Exception as e:
                    code = E.code_of(e)
                    if code in E.UNSUPPORTED:
                        gpus.remove((index, handle))
                        with self._lock:
                            self._unsupported.append(index)
                    elif E.outcome_of(code) is E.ReadOutcome.GPU_LOST:
                        gpus.remove((index, handle))  # the cycle marks it lost and counts it, once
                    elif E.outcome_of(code) is E.ReadOutcome.OK:
                        self.count_error(code)  # a dead driver is the cycle's to count and handle
                    continue
                with self._lock:
                    self._fresh[index] = values
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
