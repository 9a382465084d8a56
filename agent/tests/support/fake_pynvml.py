"""A faithful fake of the NVML boundary: ``pynvml`` (nvidia-ml-py) without a GPU or a driver.

What it stands in for: ``libnvidia-ml.so`` as seen through the real ``pynvml`` module. It
monkeypatches the ``nvml*`` functions the sources use *on the real module*, with the real
signatures (a test checks them), so code under test does ``import pynvml`` as in production and
gets the real exception classes (``pynvml.NVMLError_GpuIsLost`` ...), constants and ctypes
structures back: ``nvmlDeviceGetFieldValues`` returns a ``c_nvmlFieldValue_t`` array with a
per-entry ``nvmlReturn``, ``nvmlGpmMetricsGet`` fills the caller's ``c_nvmlGpmMetricsGet_t``,
``nvmlEventSetWait_v2`` returns ``c_nvmlEventData_t`` or raises ``NVMLError_Timeout`` after the
wait, device handles are real ``c_nvmlDevice_t`` pointers. Any *other* real wrapper answers
``FunctionNotFound``, as an old driver missing the symbol would, and is recorded in ``missing``.

Scriptable per GPU (:class:`FakeGpu`): an H100 (GPM, NVLink, ECC, HBM temperature, no fan), an
A100 (no GPM), an RTX 4090 (fan; ECC, NVLink, GPM, perf-policy counters NotSupported), MIG mode
(utilisation, process utilisation and GPM NotSupported on the parent), any function or field id
NotSupported (``gpu.unsupported``), one-shot errors (``gpu.fail``), a GPU lost mid-run
(:meth:`FakeNvml.lose`), init failures (``FakeNvml(init_error=...)``), a driver reload
(:meth:`FakeNvml.driver_unload` / :meth:`FakeNvml.driver_load`: calls fail, then old handles are
stale until ``nvmlInit``), and events (:meth:`FakeNvml.emit_event`, e.g. XID 79).

Usage::

    fake = FakeNvml.install(monkeypatch, gpus=[h100(0), rtx4090(1)])   # or FakeNvml.install(None, ...)
    src = NvmlSource(); src.open(); src.collect(now_ns)
    fake.uninstall()   # only needed without monkeypatch

``fake_h100_node(8)`` gives the eight GPUs of a DGX-like node for benchmarks.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

NVMLError = pynvml.NVMLError
_SUCCESS = pynvml.NVML_SUCCESS
_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_MIB = 1 << 20
# ctypes field descriptors: pynvml's structures override attribute access (slow), and the
# fake should cost little next to the code it serves in benchmarks.
_GM = pynvml.c_nvmlGpmMetric_t
_FVT = pynvml.c_nvmlFieldValue_t
_VALUE_ATTRS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _ptr(addr: int, typ: Any) -> Any:
    return ctypes.cast(ctypes.c_void_p(addr), typ)


def _addr(p: Any) -> int:
    return ctypes.cast(p, ctypes.c_void_p).value or 0


@dataclass
class FakeGpu:
    """One scripted GPU. Change the public attributes between cycles to script a run."""

    index: int
    name: str
    uuid: str
    mem_total: int
    power_limit_mw: int
    max_clocks: tuple[int, int, int]  # graphics, SM, memory (NVML_CLOCK_* order)
    pcie: tuple[int, int] = (5, 16)
    gpm: bool = False
    ecc: bool = False
    nvlink_links: int = 0
    fan: bool = False
    hbm_temp: bool = False
    perf_policy: bool = False
    mig: bool = False
    memory_v2: bool = True
    event_types: int = 0
    # live values
    util_gpu: int = 0
    util_mem: int = 0
    mem_used: int = 0
    mem_reserved: int = 512 * _MIB
    temp: int = 35
    temp_mem: int = 40
    power_mw: int = 70_000
    energy_mj: int = 1_000_000
    clocks: list[int] = field(default_factory=lambda: [345, 345, 1593])
    reasons: int = 0x1
    pstate: int = 0
    fan_pct: int = 30
    pcie_kb: tuple[int, int] = (1000, 2000)
    enc: int = 0
    dec: int = 0
    throttle: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(74, 80), 0))
    pcie_replays: int = 0
    pcie_link: tuple[int, int] | None = None
    ecc_counts: dict[tuple[int, int], int] = field(default_factory=lambda: {(0, 0): 0, (1, 0): 0, (0, 1): 3, (1, 1): 0})
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    nvlink_kib: dict[int, list[int]] = field(default_factory=dict)
    nvlink_down: set[int] = field(default_factory=set)
    gpm_values: dict[int, float] = field(default_factory=dict)
    compute_procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    graphics_procs: list[tuple[int, int | None]] = field(default_factory=list)
    proc_samples: list[tuple[int, int, int, int]] = field(default_factory=list)  # (pid, ts µs, sm, mem)
    unsupported: set[Any] = field(default_factory=set)  # function names and field ids that answer NotSupported
    fail: dict[str, list[int]] = field(default_factory=dict)  # function name -> error codes raised next
    lost: bool = False

    def __post_init__(self) -> None:
        if self.pcie_link is None:
            self.pcie_link = self.pcie
        for link in range(self.nvlink_links):
            self.nvlink_kib.setdefault(link, [1_000_000 * (link + 1), 900_000 * (link + 1)])

    # field id (+ scope) -> (value type, value) or an NVML error code
    def field_value(self, fid: int, scope: int) -> tuple[int, Any] | int:
        if fid in self.unsupported:
            return _NOT_SUPPORTED
        if fid == 82:
            return (1, self.temp_mem) if self.hbm_temp else _NOT_SUPPORTED
        if fid == 186:
            return (1, self.power_mw)
        if fid == 83:
            return (3, self.energy_mj)
        if 74 <= fid <= 79:
            return (3, self.throttle[fid]) if self.perf_policy else _NOT_SUPPORTED
        if fid == 94:
            return (1, self.pcie_replays)
        if 3 <= fid <= 6:
            if not self.ecc:
                return _NOT_SUPPORTED
            err, counter = {3: (0, 0), 4: (1, 0), 5: (0, 1), 6: (1, 1)}[fid]
            return (3, self.ecc_counts[(err, counter)])
        if fid in (138, 139):
            if scope >= self.nvlink_links:
                return pynvml.NVML_ERROR_INVALID_ARGUMENT
            return (3, self.nvlink_kib[scope][fid - 138])
        return _NOT_SUPPORTED  # retired pages (29-31) are pre-Ampere; anything else unknown here


def _uuid(kind: int, index: int) -> str:
    return f"GPU-{kind:08x}-{index:04x}-4{index:03x}-8000-{index * 7919 + kind:012x}"


def h100(index: int, **kw: Any) -> FakeGpu:
    """H100 SXM: GPM, 18 NVLinks, ECC, HBM temperature, perf-policy counters; no fan."""
    defaults: dict[str, Any] = dict(
        name="NVIDIA H100 80GB HBM3",
        uuid=_uuid(0x100, index),
        mem_total=85_520_809_984,
        power_limit_mw=700_000,
        max_clocks=(1980, 1980, 2619),
        pcie=(5, 16),
        gpm=True,
        ecc=True,
        nvlink_links=18,
        hbm_temp=True,
        perf_policy=True,
        event_types=0x8 | 0x2 | 0x1 | 0x4000 | 0x8000 | 0x4 | 0x10,
        gpm_values={
            2: 71.5,
            3: 40.25,
            5: 45.0,
            7: 43.5,
            10: 36.0,
            13: 2.0,
            12: 11.0,
            11: 0.0,
            20: 1200.0,
            21: 2400.0,
            60: 100_000.0,
            61: 110_000.0,
        },
    )
    defaults.update(kw)
    return FakeGpu(index, **defaults)


def a100(index: int, **kw: Any) -> FakeGpu:
    """A100 SXM4: like the H100 without GPM, 12 NVLinks."""
    defaults: dict[str, Any] = dict(
        name="NVIDIA A100-SXM4-80GB",
        uuid=_uuid(0xA100, index),
        mem_total=85_899_345_920,
        power_limit_mw=400_000,
        max_clocks=(1410, 1410, 1593),
        pcie=(4, 16),
        ecc=True,
        nvlink_links=12,
        hbm_temp=True,
        perf_policy=True,
        event_types=0x8 | 0x2 | 0x1 | 0x4,
    )
    defaults.update(kw)
    return FakeGpu(index, **defaults)


def rtx4090(index: int, **kw: Any) -> FakeGpu:
    """GeForce RTX 4090: fan and GDDR; ECC, NVLink, GPM, HBM temp, perf-policy counters NotSupported."""
    defaults: dict[str, Any] = dict(
        name="NVIDIA GeForce RTX 4090",
        uuid=_uuid(0x4090, index),
        mem_total=25_757_220_864,
        power_limit_mw=450_000,
        max_clocks=(3120, 3120, 10501),
        pcie=(4, 16),
        fan=True,
        event_types=0x8 | 0x4 | 0x10,
        unsupported={"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetNvLinkState"},
    )
    defaults.update(kw)
    return FakeGpu(index, **defaults)


def fake_h100_node(n: int = 8, busy: bool = True) -> list[FakeGpu]:
    """The GPUs of a DGX-like H100 node, busy training (for benchmarks)."""
    gpus = [h100(i) for i in range(n)]
    if busy:
        for g in gpus:
            g.util_gpu, g.util_mem, g.mem_used, g.temp, g.power_mw = 99, 45, 70 * (1 << 30), 67, 610_000
            g.clocks, g.reasons = [1980, 1980, 2619], 0x0
            g.compute_procs = [(4100 + g.index, 69 * (1 << 30))]
    return gpus


_GpmGet_metrics = pynvml.c_nvmlGpmMetricsGet_t.metrics
_GpmGet_num = pynvml.c_nvmlGpmMetricsGet_t.numMetrics


class _EventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # gpu index -> mask
        self.queue: queue.Queue[Any] = queue.Queue()


class FakeNvml:
    """The fake library state; install() patches the real pynvml module with its methods."""

    FUNCTIONS = (
        "nvmlInit",
        "nvmlShutdown",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetProcessUtilization",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlEventSetCreate",
        "nvmlEventSetFree",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
        "nvmlEventSetWait",
    )

    def __init__(
        self, gpus: list[FakeGpu], *, init_error: int | None = None, driver_version: str = "570.124.06"
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver_version = driver_version
        self.driver_up = True
        self.refcount = 0
        self.generation = 0
        self.calls: Counter[str] = Counter()
        self.missing: Counter[str] = Counter()
        self._handles: dict[int, tuple[FakeGpu, int]] = {}
        self._handle_objs: dict[tuple[int, int], Any] = {}
        self._by_addr: dict[int, tuple[FakeGpu, int]] = {}
        self._next_addr = 0x5000_0000
        self._gpm_samples: dict[int, tuple[int, dict[int, float]] | None] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._lock = threading.Lock()
        self._saved: dict[str, Any] = {}
        self._monkeypatch: Any = None

    # -- installation ----------------------------------------------------------------------------
    @classmethod
    def install(cls, monkeypatch: Any = None, gpus: list[FakeGpu] | None = None, **kw: Any) -> FakeNvml:
        fake = cls(gpus if gpus is not None else [h100(0)], **kw)
        patches = {name: getattr(fake, name) for name in cls.FUNCTIONS}
        patches["_nvmlGetFunctionPointer"] = fake._missing_symbol
        for name, fn in patches.items():
            if monkeypatch is not None:
                monkeypatch.setattr(pynvml, name, fn)
            else:
                fake._saved[name] = getattr(pynvml, name)
                setattr(pynvml, name, fn)
        fake._monkeypatch = monkeypatch
        return fake

    def uninstall(self) -> None:
        for name, fn in self._saved.items():
            setattr(pynvml, name, fn)
        self._saved.clear()

    def _missing_symbol(self, name: str) -> Any:
        self.missing[name] += 1
        raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    # -- scripting -------------------------------------------------------------------------------
    def lose(self, index: int) -> None:
        """The GPU falls off the bus: every call on it answers GpuIsLost."""
        self.gpus[index].lost = True

    def driver_unload(self) -> None:
        """Every call answers DriverNotLoaded until driver_load()."""
        self.driver_up = False

    def driver_load(self) -> None:
        """The driver is back; NVML must be initialised again and old handles are stale."""
        self.driver_up = True
        self.refcount = 0
        self.generation += 1

    def emit_event(self, index: int, event_type: int, data: int = 0) -> bool:
        """Deliver an event to every set that registered this type on this GPU; False if none did."""
        g = self.gpus[index]
        delivered = False
        for es in list(self._event_sets.values()):
            if es.registered.get(index, 0) & event_type:
                ev = pynvml.c_nvmlEventData_t()
                ev.device = self._handle(g)
                ev.eventType = event_type
                ev.eventData = data
                ev.gpuInstanceId = 0xFFFFFFFF
                ev.computeInstanceId = 0xFFFFFFFF
                es.queue.put(ev)
                delivered = True
        return delivered

    @property
    def initialized(self) -> bool:
        return self.refcount > 0

    # -- helpers ---------------------------------------------------------------------------------
    def _lib(self, fn: str) -> None:
        self.calls[fn] += 1
        if not self.driver_up:
            raise NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if self.refcount <= 0:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _dev(self, handle: Any, fn: str) -> FakeGpu:
        self._lib(fn)
        entry = self._handles.get(id(handle)) or self._by_addr.get(_addr(handle))
        if entry is None:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g, gen = entry
        if gen != self.generation:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if g.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        pending = g.fail.get(fn)
        if pending:
            raise NVMLError(pending.pop(0))
        if fn in g.unsupported:
            raise NVMLError(_NOT_SUPPORTED)
        return g

    def _handle(self, g: FakeGpu) -> Any:
        key = (g.index, self.generation)
        h = self._handle_objs.get(key)
        if h is None:
            addr = 0x1000_0000 + self.generation * 0x1000 + g.index * 0x10
            h = _ptr(addr, pynvml.c_nvmlDevice_t)
            self._handle_objs[key] = h
            self._handles[id(h)] = (g, self.generation)
            self._by_addr[addr] = (g, self.generation)
        return h

    def _alloc_addr(self) -> int:
        with self._lock:
            self._next_addr += 0x100
            return self._next_addr

    # -- library ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        if not self.driver_up:
            raise NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._lib("nvmlShutdown")
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._lib("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._lib("nvmlSystemGetNVMLVersion")
        return "12." + self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._lib("nvmlSystemGetCudaDriverVersion")
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        self._lib("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._lib("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[index]
        if g.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._handle(g)

    # -- identity --------------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g = self._dev(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = f"00000000:{0x18 + 0x10 * g.index:02X}:00.0".encode()
        info.bus = 0x18 + 0x10 * g.index
        return info

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        self._dev(handle, "nvmlDeviceGetVbiosVersion")
        return "96.00.99.00.01"

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        g = self._dev(device, "nvmlDeviceGetMigMode")
        if not g.gpm and not g.ecc:  # consumer boards have no MIG
            raise NVMLError(_NOT_SUPPORTED)
        return [1, 1] if g.mig else [0, 0]

    # -- per cycle -------------------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        g = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        if version:
            if not g.memory_v2:
                raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            m = pynvml.c_nvmlMemory_v2_t()
            m.version = version
            m.total, m.reserved, m.used = g.mem_total, g.mem_reserved, g.mem_used
            m.free = g.mem_total - g.mem_reserved - g.mem_used
            return m
        m1 = pynvml.c_nvmlMemory_t()  # v1: "used" includes the driver-reserved memory
        m1.total, m1.used = g.mem_total, g.mem_used + g.mem_reserved
        m1.free = g.mem_total - m1.used
        return m1

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        if g.mig:
            raise NVMLError(_NOT_SUPPORTED)
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = g.util_gpu, g.util_mem
        return u

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._dev(handle, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:
        g = self._dev(handle, "nvmlDeviceGetTemperatureV")
        if version != pynvml.nvmlTemperature_v1:
            raise NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return g.temp

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return self._dev(handle, "nvmlDeviceGetClockInfo").clocks[type]

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        return self._dev(handle, "nvmlDeviceGetMaxClockInfo").max_clocks[type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPerformanceState").pstate

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        g = self._dev(handle, "nvmlDeviceGetFanSpeed")
        if not g.fan:
            raise NVMLError(_NOT_SUPPORTED)
        return g.fan_pct

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        return self._dev(device, "nvmlDeviceGetPcieThroughput").pcie_kb[counter]

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        return [self._dev(handle, "nvmlDeviceGetEncoderUtilization").enc, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        return [self._dev(handle, "nvmlDeviceGetDecoderUtilization").dec, 167_000]

    # -- slower tiers ----------------------------------------------------------------------------
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_link[0]  # type: ignore[index]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_link[1]  # type: ignore[index]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie[1]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        g = self._dev(handle, "nvmlDeviceGetTotalEccErrors")
        if not g.ecc:
            raise NVMLError(_NOT_SUPPORTED)
        return g.ecc_counts[(errorType, counterType)]

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        g = self._dev(device, "nvmlDeviceGetRemappedRows")
        if not g.ecc:
            raise NVMLError(_NOT_SUPPORTED)
        return g.remapped

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        g = self._dev(device, "nvmlDeviceGetNvLinkState")
        if link >= g.nvlink_links:
            raise NVMLError(_NOT_SUPPORTED if g.nvlink_links == 0 else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in g.nvlink_down else 1

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        g = self._dev(handle, "nvmlDeviceGetFieldValues")
        if not fieldIds:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        ts = time.time_ns() // 1000
        for i, fid in enumerate(fieldIds):
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            v = values[i]
            _FVT.fieldId.__set__(v, fid)
            _FVT.scopeId.__set__(v, scope)
            _FVT.timestamp.__set__(v, ts)
            _FVT.latencyUsec.__set__(v, 2)
            r = g.field_value(fid, scope)
            if isinstance(r, int):
                _FVT.nvmlReturn.__set__(v, r)
            else:
                _FVT.valueType.__set__(v, r[0])
                setattr(_FVT.value.__get__(v), _VALUE_ATTRS[r[0]], r[1])
        return values

    # -- processes -------------------------------------------------------------------------------
    def _procs(self, rows: list[tuple[int, int | None]]) -> list[Any]:
        out = []
        for pid, mem in rows:
            s = pynvml.c_nvmlProcessInfo_v3_t(pid, 0, 0xFFFFFFFF, 0xFFFFFFFF)
            obj = pynvml.nvmlStructToFriendlyObject(s)
            obj.usedGpuMemory = mem  # None stands for NVML_VALUE_NOT_AVAILABLE, as pynvml converts it
            out.append(obj)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._procs(self._dev(handle, "nvmlDeviceGetComputeRunningProcesses").compute_procs)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        return self._procs(self._dev(handle, "nvmlDeviceGetGraphicsRunningProcesses").graphics_procs)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        g = self._dev(handle, "nvmlDeviceGetProcessUtilization")
        if g.mig:
            raise NVMLError(_NOT_SUPPORTED)
        rows = [s for s in g.proc_samples if s[1] > timeStamp]
        if not rows:
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for pid, ts, sm, mem in rows:
            s = pynvml.c_nvmlProcessUtilizationSample_t()
            s.pid, s.timeStamp, s.smUtil, s.memUtil = pid, ts, sm, mem
            out.append(s)
        return out

    # -- GPM -------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        g = self._dev(device, "nvmlGpmQueryDeviceSupport")
        s = pynvml.c_nvmlGpmSupport_t()
        s.version = pynvml.NVML_GPM_SUPPORT_VERSION
        s.isSupportedDevice = 1 if g.gpm else 0
        return s

    def nvmlGpmSampleAlloc(self) -> Any:
        self._lib("nvmlGpmSampleAlloc")
        addr = self._alloc_addr()
        self._gpm_samples[addr] = None
        return _ptr(addr, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._lib("nvmlGpmSampleFree")
        if self._gpm_samples.pop(_addr(gpmSample), False) is False:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        g = self._dev(device, "nvmlGpmSampleGet")
        if not g.gpm or g.mig:  # under MIG, GPM needs nvmlGpmMigSampleGet per GPU instance
            raise NVMLError(_NOT_SUPPORTED)
        addr = _addr(gpmSample)
        if addr not in self._gpm_samples:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_samples[addr] = (g.index, dict(g.gpm_values))
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._lib("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        s1 = self._gpm_samples.get(_addr(metricsGet.sample1))
        s2 = self._gpm_samples.get(_addr(metricsGet.sample2))
        if s1 is None or s2 is None or s1[0] != s2[0] or metricsGet.sample1 is metricsGet.sample2:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        values = s2[1]  # the activity over the interval ending at sample 2
        metrics = _GpmGet_metrics.__get__(metricsGet)
        for i in range(_GpmGet_num.__get__(metricsGet)):
            m = metrics[i]
            v = values.get(_GM.metricId.__get__(m))
            _GM.value.__set__(m, 0.0 if v is None else v)
            _GM.nvmlReturn.__set__(m, _NOT_SUPPORTED if v is None else _SUCCESS)
        return metricsGet

    # -- events ----------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._lib("nvmlEventSetCreate")
        addr = self._alloc_addr()
        self._event_sets[addr] = _EventSet()
        return _ptr(addr, pynvml.c_nvmlEventSet_t)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._lib("nvmlEventSetFree")
        if self._event_sets.pop(_addr(eventSet), None) is None:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetSupportedEventTypes").event_types

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        g = self._dev(handle, "nvmlDeviceRegisterEvents")
        es = self._event_sets.get(_addr(eventSet))
        if es is None:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & ~g.event_types:
            raise NVMLError(_NOT_SUPPORTED)
        es.registered[g.index] = es.registered.get(g.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        self._lib("nvmlEventSetWait_v2")
        es = self._event_sets.get(_addr(eventSet))
        if es is None:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        try:
            return es.queue.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)
