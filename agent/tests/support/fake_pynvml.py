"""A stand-in for ``libnvidia-ml.so`` under the real ``pynvml`` module (nvidia-ml-py 13.615.71).

What it stands in for: the NVIDIA driver's C library, and nothing above it. :meth:`FakeNvml.install`
puts a library object into ``pynvml.nvmlLib`` (so ``_LoadNvmlLibrary`` sees it loaded and never
calls ``CDLL``) and clears ``pynvml._nvmlGetFunctionPointer_cache``; pynvml's own
``_nvmlGetFunctionPointer`` then resolves every symbol against that object, as it does against a
``CDLL``. Each symbol is a Python callable with the C signature: it receives exactly what the
pynvml wrapper passes to the C function (``byref(...)`` out-arguments, ``c_uint`` values, struct
arrays, opaque handles), writes its results through those pointers into the caller's memory
(``ctypes.<type>.from_address``), and returns an ``nvmlReturn_t``. Every wrapper, struct layout,
two-call buffer protocol, version check and error mapping of the real bindings therefore runs in
every test: ``NVMLError_*`` classes come from pynvml's ``_nvmlCheckReturn``, a missing ``_v3``
symbol becomes pynvml's own ``NVMLLibraryMismatchError`` through ``throwOnVersionMismatch``.

The behaviours it models, each from the NVML API reference (``nvml.h`` of API 13 as vendored by
NVIDIA/go-nvml ``pkg/nvml/nvml.h``; section named after the function):

* ``nvmlInitWithFlags``: DRIVER_NOT_LOADED without a driver; ``NVML_ERROR_LIB_RM_VERSION_MISMATCH``
  ("RM has detected an NVML/RM version mismatch") when the kernel module is not the version of the
  library this process mapped (a driver upgrade: :meth:`FakeNvml.upgrade_driver`). The library
  stays mapped for the life of the process: pynvml's ``nvmlShutdown`` "Leave[s] the library loaded"
  and ``_LoadNvmlLibrary`` loads only while ``nvmlLib`` is None, so re-initialising cannot pick up
  the new library. Every call before init or after the last ``nvmlShutdown``: UNINITIALIZED.
* ``nvmlDeviceGetPcieThroughput``: "querying a byte counter over a 20ms interval": the call
  sleeps 20 ms (:data:`LATENCY_S`) and the threads that waited are recorded in ``waits``.
* ``nvmlDeviceGetFieldValues``: per-entry ``nvmlReturn``, one call for the whole array,
  ``timestamp`` in µs of the stand-in's clock; NVLink fields take the link in ``scopeId`` and
  ``UINT_MAX`` is "aggregate value summed up across all links" (NVLink throughput counters
  section); ``NVML_FI_DEV_NVLINK_GET_STATE`` (165) per link; PCIe byte counters 197/198
  ("Value can be wrapped").
* Process lists (``nvmlDeviceGetComputeRunningProcesses_v3``): the two-call size protocol
  (count 0 -> INSUFFICIENT_SIZE, or SUCCESS when none run), ``usedGpuMemory`` N/A as ULL max;
  "In MIG mode, if device handle is provided, the API returns aggregate information, only if the
  caller has appropriate privileges": NO_PERMISSION on a MIG parent unless ``root=True``; per-MIG
  device handles answer for their own instance. The same note on ``nvmlDeviceGetMemoryInfo(_v2)``.
* ``nvmlDeviceGetProcessUtilization``: "One utilization sample structure is returned per process
  running, that had some non-zero utilization during the last sample period"; NOT_FOUND when no
  sample is newer than ``lastSeenTimeStamp``; NULL buffer -> INSUFFICIENT_SIZE with the count;
  "On MIG-enabled GPUs, querying process utilization is not currently supported."
* ``nvmlDeviceGetUtilizationRates`` and encoder/decoder utilisation: "On MIG-enabled GPUs,
  querying ... is not currently supported" (NOT_SUPPORTED).
* GPM (``nvmlGpmSampleAlloc/Free/Get``, ``nvmlGpmMigSampleGet``, ``nvmlGpmMetricsGet``): every
  allocation is accounted and :meth:`FakeNvml.check` fails on a sample never freed; "The interval
  between two nvmlGpmSampleGet() calls should be greater than 100ms": a metrics request over a
  shorter interval is recorded as misuse and fails :meth:`check`; ``nvmlGpmSampleFree`` documents
  only SUCCESS/INVALID_ARGUMENT, so it works whatever the driver state. Per GPU instance through
  ``nvmlGpmMigSampleGet(parent, gpuInstanceId, ...)``.
* MIG: ``nvmlDeviceGetMaxMigDeviceCount`` (0 when disabled), ``nvmlDeviceGetMigDeviceHandleByIndex``
  (NOT_FOUND for an empty slot), instance ids, ``nvmlDeviceGetAttributes_v2`` ("currently only
  supports MIG device handles"), ``nvmlDeviceGetGpuInstanceProfileInfoV`` (version-checked).
* Events: ``nvmlEventSetWait_v2`` blocks up to the timeout and answers TIMEOUT; registered types
  only; XID data in ``eventData``.
* A GPU that fell off the bus answers GPU_IS_LOST; a driver unload answers DRIVER_NOT_LOADED and
  handles from before a reload answer UNINITIALIZED.

Where it is known to differ: it has no real latency except the documented 20 ms; on a MIG parent
``nvmlGpmSampleGet`` answers NOT_SUPPORTED (not in the reference; the issue's and DCGM's
account); a MIG device handle answers only identity, memory, processes and GPM (anything else
NOT_SUPPORTED, unverified); the driver's per-process sample period is modelled as 1 s (not
documented); field value types and which GPUs offer fields 197/198 are not documented (the A100
profile answers NOT_SUPPORTED for them so that the slow-path fallback is exercised); the PCIe
"KB/s" of ``nvmlDeviceGetPcieThroughput`` is modelled as KiB/s (see ``window.PCIE_KB``).

GPU profiles (:func:`h100`, :func:`h200`, :func:`a100`) take their identity, memory, power,
clocks, PCIe link and temperatures from recorded ``nvidia-smi -q`` outputs of real GPUs
(``support/nvml_captures``, each file names its source); the load values of a busy GPU
(:func:`busy`) and the GPM numbers are scripted, not recorded. :func:`rtx4090` is hand-written.

Usage::

    fake = FakeNvml.install(monkeypatch, gpus=[h100(0), rtx4090(1)])   # or FakeNvml.install(None, ...)
    src = NvmlSource(); src.open(); src.collect(now_ns)
    fake.check()       # no leaked GPM sample / event set, no misuse
    fake.uninstall()   # only needed without monkeypatch
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as nv

from support.nvml_captures import number, read_capture

_MIB = 1 << 20
UINT_MAX = 0xFFFFFFFF
ULL_NA = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE_ulonglong
#: Documented per-call waits (NVML reference, nvmlDeviceGetPcieThroughput).
LATENCY_S: dict[str, float] = {"nvmlDeviceGetPcieThroughput": 0.020}
#: GPM: "The interval between two nvmlGpmSampleGet() calls should be greater than 100ms".
GPM_MIN_INTERVAL_NS = 100_000_000
_FV_SIZE = ctypes.sizeof(nv.c_nvmlFieldValue_t)
_GM_SIZE = ctypes.sizeof(nv.c_nvmlGpmMetric_t)
_GM_OFFSET = nv.c_nvmlGpmMetricsGet_t.metrics.offset
_VALUE_CTYPES = (ctypes.c_double, ctypes.c_uint, ctypes.c_ulong, ctypes.c_ulonglong, ctypes.c_longlong, ctypes.c_int)


class _Ret(Exception):
    """An nvmlReturn_t other than SUCCESS, raised inside a C function and returned to pynvml."""

    def __init__(self, code: int) -> None:
        self.code = code


# -- the C ABI: out-arguments as the C function sees them ------------------------------------------
def _addr(arg: Any) -> int:
    """The address a pointer argument holds (``byref(x)``, a struct/array, a pointer, or NULL)."""
    if arg is None:
        return 0
    obj = getattr(arg, "_obj", None)  # byref(x) is a CArgObject keeping x
    if obj is not None:
        return ctypes.addressof(obj)
    if isinstance(arg, ctypes._Pointer):
        return ctypes.cast(arg, ctypes.c_void_p).value or 0
    return ctypes.addressof(arg)


def _val(arg: Any) -> int:
    """A by-value integer argument (``c_uint(3)`` or a plain int)."""
    return int(arg.value) if hasattr(arg, "value") else int(arg)


def _out(arg: Any, ctype: Any) -> Any:
    """The ``ctype`` object living where the out-pointer points; INVALID_ARGUMENT for NULL."""
    a = _addr(arg)
    if not a:
        raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
    return ctype.from_address(a)


def _put(arg: Any, ctype: Any, value: Any) -> None:
    _out(arg, ctype).value = value


def _put_str(buf: Any, length: Any, text: str) -> None:
    data = text.encode() + b"\0"
    if len(data) > _val(length):
        raise _Ret(nv.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(_addr(buf), data, len(data))


# -- GPUs ------------------------------------------------------------------------------------------
@dataclass
class FakeMig:
    """One MIG device (a compute instance in a GPU instance) on a MIG-enabled GPU."""

    slot: int  # index for nvmlDeviceGetMigDeviceHandleByIndex
    gi: int  # GPU instance id
    profile_id: int  # NVML_GPU_INSTANCE_PROFILE_*
    ci: int = 0
    mem_used: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    gpm_values: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MigProfile:
    """A row of ``nvidia-smi mig -lgip``: what nvmlDeviceGetGpuInstanceProfileInfoV returns."""

    profile_id: int
    name: str  # as the driver names it, "MIG 1g.18gb"
    slices: int
    memory_mib: int
    sms: int


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
    pci_bus_id: str = ""
    vbios: str = "96.00.99.00.01"
    gpm: bool = False
    ecc: bool = False
    nvlink_links: int = 0
    nvlink_aggregate: bool = True  # the UINT_MAX all-links scope answers
    pcie_counters: bool = True  # fields 197/198
    fan: bool = False
    hbm_temp: bool = False
    perf_policy: bool = False
    mig: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_devices: list[FakeMig] = field(default_factory=list)
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
    energy_mj: float = 1_000_000.0
    clocks: list[int] = field(default_factory=lambda: [345, 345, 1593])
    reasons: int = 0x1
    pstate: int = 0
    fan_pct: int = 30
    pcie_bytes_per_s: tuple[float, float] = (580_000.0, 570_000.0)  # TX, RX
    pcie_bytes: list[float] = field(default_factory=lambda: [7.0e9, 9.0e9])
    enc: int = 0
    dec: int = 0
    throttle: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(74, 80), 0))
    pcie_replays: int = 0
    pcie_link: tuple[int, int] | None = None
    ecc_counts: dict[tuple[int, int], int] = field(default_factory=lambda: {(0, 0): 0, (1, 0): 0, (0, 1): 3, (1, 1): 0})
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    nvlink_kib: dict[int, list[float]] = field(default_factory=dict)
    nvlink_kib_per_s: float = 0.0  # per link and direction
    nvlink_down: set[int] = field(default_factory=set)
    nvlink_aggregate_skew: int = 0  # KiB added to the UINT_MAX answer (to script a disagreement)
    gpm_values: dict[int, float] = field(default_factory=dict)
    compute_procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    graphics_procs: list[tuple[int, int | None]] = field(default_factory=list)
    proc_util: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (sm %, mem %) now
    unsupported: set[Any] = field(default_factory=set)  # C symbols and field ids that answer NotSupported
    fail: dict[str, list[int]] = field(default_factory=dict)  # C symbol -> error codes returned next
    lost: bool = False

    def __post_init__(self) -> None:
        if self.pcie_link is None:
            self.pcie_link = self.pcie
        if not self.pci_bus_id:
            self.pci_bus_id = f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"
        for link in range(self.nvlink_links):
            self.nvlink_kib.setdefault(link, [1_000_000.0 * (link + 1), 900_000.0 * (link + 1)])

    def advance(self, dt_s: float) -> None:
        """Counters move with time: energy by power, PCIe and NVLink bytes by their rates."""
        if dt_s <= 0:
            return
        self.energy_mj += self.power_mw * dt_s
        self.pcie_bytes[0] += self.pcie_bytes_per_s[0] * dt_s
        self.pcie_bytes[1] += self.pcie_bytes_per_s[1] * dt_s
        if self.nvlink_kib_per_s:
            for link, kib in self.nvlink_kib.items():
                if link not in self.nvlink_down:
                    kib[0] += self.nvlink_kib_per_s * dt_s
                    kib[1] += self.nvlink_kib_per_s * dt_s

    def mig_profile(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.profile_id == profile_id), None)

    # field id (+ scope) -> (value type, value) or an NVML error code
    def field_value(self, fid: int, scope: int) -> tuple[int, Any] | int:
        if fid in self.unsupported:
            return nv.NVML_ERROR_NOT_SUPPORTED
        if fid == 82:
            return (1, self.temp_mem) if self.hbm_temp else nv.NVML_ERROR_NOT_SUPPORTED
        if fid == 186:
            return (1, self.power_mw) if scope == 0 else nv.NVML_ERROR_NOT_SUPPORTED
        if fid == 83:
            return (3, int(self.energy_mj))
        if 74 <= fid <= 79:
            return (3, self.throttle[fid]) if self.perf_policy else nv.NVML_ERROR_NOT_SUPPORTED
        if fid == 94:
            return (1, self.pcie_replays)
        if 3 <= fid <= 6:
            if not self.ecc:
                return nv.NVML_ERROR_NOT_SUPPORTED
            err, counter = {3: (0, 0), 4: (1, 0), 5: (0, 1), 6: (1, 1)}[fid]
            return (3, self.ecc_counts[(err, counter)])
        if fid in (197, 198):
            if not self.pcie_counters:
                return nv.NVML_ERROR_NOT_SUPPORTED
            return (3, int(self.pcie_bytes[fid - 197]) & 0xFFFFFFFFFFFFFFFF)
        if fid == 91:
            return (1, self.nvlink_links) if self.nvlink_links else nv.NVML_ERROR_NOT_SUPPORTED
        if fid in (138, 139, 165):
            if not self.nvlink_links:
                return nv.NVML_ERROR_NOT_SUPPORTED
            if fid != 165 and scope == UINT_MAX:
                if not self.nvlink_aggregate:
                    return nv.NVML_ERROR_INVALID_ARGUMENT
                total = sum(int(v[fid - 138]) for v in self.nvlink_kib.values())
                return (3, total + self.nvlink_aggregate_skew)
            if scope >= self.nvlink_links:
                return nv.NVML_ERROR_INVALID_ARGUMENT
            if fid == 165:
                return (1, nv.NVML_NVLINK_STATE_INACTIVE if scope in self.nvlink_down else nv.NVML_NVLINK_STATE_ACTIVE)
            return (3, int(self.nvlink_kib[scope][fid - 138]))
        return nv.NVML_ERROR_NOT_SUPPORTED  # retired pages (29-31) are pre-Ampere; anything else unknown here


def _uuid(base: str, index: int) -> str:
    """The captured UUID for GPU 0; later GPUs get its last four hex digits replaced by their index."""
    return base if index == 0 else f"{base[:-4]}{index:04x}"


def _from_capture(name: str, index: int, **facts: Any) -> dict[str, Any]:
    """The profile values a recorded ``nvidia-smi -q`` shows (``support/nvml_captures/<name>.txt``)."""
    c = read_capture(name)
    link = c["PCI/GPU Link Info/PCIe Generation/Max"], c["PCI/GPU Link Info/Link Width/Max"]
    return dict(
        name=c["Product Name"],
        uuid=_uuid(c["GPU UUID"], index),
        vbios=c["VBIOS Version"],
        pci_bus_id=c["Bus Id"] if index == 0 else "",
        mem_total=int(number(c["FB Memory Usage/Total"])) * _MIB,
        mem_reserved=int(number(c["FB Memory Usage/Reserved"])) * _MIB,
        mem_used=int(number(c["FB Memory Usage/Used"])) * _MIB,
        power_limit_mw=int(number(c["GPU Power Readings/Current Power Limit"]) * 1000),
        power_mw=int(number(c["GPU Power Readings/Power Draw"]) * 1000),
        max_clocks=tuple(int(number(c[f"Max Clocks/{k}"])) for k in ("Graphics", "SM", "Memory")),
        clocks=[int(number(c[f"Clocks/{k}"])) for k in ("Graphics", "SM", "Memory")],
        pcie=(int(number(link[0])), int(number(link[1]))),
        temp=int(number(c["Temperature/GPU Current Temp"])),
        temp_mem=int(number(c["Temperature/Memory Current Temp"])),
        pcie_replays=int(number(c["PCI/Replays Since Reset"])),
        ecc=c["ECC Mode/Current"] == "Enabled",
        fan=c["Fan Speed"] != "N/A",
        reasons=0x1 if c["Clocks Event Reasons/Idle"] == "Active" else 0x0,
        pstate=int(c["Performance State"].lstrip("P")),
        hbm_temp=True,
        perf_policy=True,
        **facts,
    )


# GPM metric values of a training step on Hopper (scripted, not recorded).
_GPM_BUSY = {2: 71.5, 3: 40.25, 5: 45.0, 7: 43.5, 10: 36.0, 13: 2.0, 12: 11.0, 11: 0.0}
_GPM_BUSY.update({20: 1200.0, 21: 2400.0, 60: 100_000.0, 61: 110_000.0})
_HOPPER_EVENTS = 0x8 | 0x2 | 0x1 | 0x4000 | 0x8000 | 0x4 | 0x10
#: GPU instance profiles: (profile id, slices, memory eighths, SMs), the rows of the NVIDIA MIG User
#: Guide's "Supported MIG Profiles" tables for A100-80GB, H100 and H200 (1g, 1g with twice the
#: memory, 2g, 3g, 4g, 7g); memory = that fraction of the captured total (modelled: the driver's
#: exact MiB are not published); SM counts are H100's.
_MIG_SLICES = (
    (nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 16),
    (nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 2, 16),
    (nv.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, 2, 32),
    (nv.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 3, 4, 60),
    (nv.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 4, 4, 64),
    (nv.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 7, 8, 132),
)


def _mig_table(total_mib: int, names: tuple[str, ...]) -> tuple[MigProfile, ...]:
    return tuple(
        MigProfile(pid, f"MIG {name}", slices, total_mib * eighths // 8, sms)
        for (pid, slices, eighths, sms), name in zip(_MIG_SLICES, names, strict=True)
    )


A100_MIG = _mig_table(81920, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"))
H100_MIG = _mig_table(81559, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"))
#: NVIDIA mig-parted's default config lists 1g.18gb/2g.35gb/3g.71gb for the H200 (device 0x233510DE).
H200_MIG = _mig_table(143771, ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"))


def _hopper(capture: str, mig: tuple[MigProfile, ...], index: int, kw: dict[str, Any]) -> FakeGpu:
    facts = _from_capture(capture, index)
    facts.update(gpm=True, nvlink_links=18, event_types=_HOPPER_EVENTS, gpm_values=dict(_GPM_BUSY), mig_profiles=mig)
    facts.update(kw)
    return FakeGpu(index, **facts)


def h100(index: int, **kw: Any) -> FakeGpu:
    """H100 SXM5 80GB from a recorded 8-GPU node (driver 565.57.01); 18 NVLinks (NVLink 4,
    900 GB/s per the H100 datasheet), GPM (Hopper), ECC, HBM temperature; no fan."""
    return _hopper("h100_sxm5_80gb", H100_MIG, index, kw)


def h200(index: int, **kw: Any) -> FakeGpu:
    """H200 SXM 141GB from a recorded capture (driver 550.90.12); 18 NVLinks, GPM, ECC; no fan."""
    return _hopper("h200_sxm_141gb", H200_MIG, index, kw)


def a100(index: int, **kw: Any) -> FakeGpu:
    """A100-SXM4-80GB from a recorded 4-GPU node (driver 555.42.02); 12 NVLinks (NVLink 3, 600 GB/s
    per the A100 datasheet); no GPM (Hopper and later). PCIe byte counters (197/198) answer
    NotSupported here to exercise the fallback (which GPUs offer them is not documented)."""
    facts = _from_capture("a100_sxm4_80gb", index)
    facts.update(nvlink_links=12, pcie_counters=False, event_types=0x8 | 0x2 | 0x1 | 0x4, mig_profiles=A100_MIG)
    facts.update(kw)
    return FakeGpu(index, **facts)


def rtx4090(index: int, **kw: Any) -> FakeGpu:
    """GeForce RTX 4090 (hand-written, not recorded): fan and GDDR; ECC, NVLink, GPM, HBM temp,
    perf-policy counters NotSupported."""
    defaults: dict[str, Any] = dict(
        name="NVIDIA GeForce RTX 4090",
        uuid=f"GPU-00004090-{index:04x}-4{index:03x}-8000-{index * 7919 + 0x4090:012x}",
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


def busy(g: FakeGpu, pid: int | None = None) -> FakeGpu:
    """Script a training load on ``g`` (values typical of a bf16 matmul loop; not recorded)."""
    g.util_gpu, g.util_mem, g.temp, g.power_mw = 99, 45, 67, int(g.power_limit_mw * 0.87)
    g.mem_used = int(g.mem_total * 0.86)
    g.clocks, g.reasons = list(g.max_clocks), 0x0
    g.pcie_bytes_per_s = (2.0e9, 1.0e9)
    g.nvlink_kib_per_s = 4.0e6 if g.nvlink_links else 0.0
    pid = 4100 + g.index if pid is None else pid
    g.compute_procs = [(pid, g.mem_used - 600 * _MIB)]
    g.proc_util = {pid: (98, 44)}
    return g


def fake_h100_node(n: int = 8, busy_load: bool = True) -> list[FakeGpu]:
    """The GPUs of a DGX-like H100 node, busy training (for benchmarks)."""
    gpus = [h100(i) for i in range(n)]
    return [busy(g) for g in gpus] if busy_load else gpus


def mig_h200(index: int, layout: tuple[str, ...] = ("2g.35gb", "1g.18gb", "1g.18gb"), **kw: Any) -> FakeGpu:
    """An H200 in MIG mode with the given GPU instances (one compute instance each)."""
    g = h200(index, mig=True, **kw)
    by_name = {p.name.removeprefix("MIG "): p for p in g.mig_profiles}
    for slot, name in enumerate(layout):
        values = {k: v * (slot + 1) / len(layout) for k, v in _GPM_BUSY.items()}
        g.mig_devices.append(
            FakeMig(slot, gi=[1, 3, 5, 7, 9, 11, 13][slot], profile_id=by_name[name].profile_id, gpm_values=values)
        )
    return g


class _EventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # gpu index -> mask
        self.queue: queue.Queue[tuple[int, int, int]] = queue.Queue()


class _CFunction:
    """One exported symbol: counts the call, applies the documented wait, returns nvmlReturn_t."""

    def __init__(self, fake: FakeNvml, name: str, impl: Callable[..., None]) -> None:
        self.fake, self.name, self.impl = fake, name, impl
        self.restype: Any = ctypes.c_int  # pynvml sets restype on some (nvmlErrorString)
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        fake = self.fake
        t0 = time.thread_time_ns()
        with fake._lock:
            fake.calls[self.name] += 1
        try:
            wait = LATENCY_S.get(self.name)
            if wait:
                with fake._lock:
                    fake.waits[threading.current_thread().name] += 1
                time.sleep(wait)
            result = self.impl(*args)
            return nv.NVML_SUCCESS if result is None else result
        except _Ret as r:
            return r.code
        finally:
            fake.inside_ns += time.thread_time_ns() - t0


class _Library:
    """What ``pynvml.nvmlLib`` holds: symbols by attribute, AttributeError when not exported (as CDLL)."""

    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> _CFunction:
        fake = self.__dict__["_fake"]
        impl = getattr(fake, f"c_{name}", None)
        if impl is None or name in fake.missing_symbols:
            fake.missing[name] += 1
            raise AttributeError(name)
        return _CFunction(fake, name, impl)


class FakeNvml:
    """The driver's state and its C functions (``c_<symbol>``); see the module docstring."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        driver_version: str = "570.124.06",
        root: bool = False,
        missing_symbols: set[str] | frozenset[str] = frozenset(),
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver_version = driver_version  # the kernel module's
        self.library_version = driver_version  # the libnvidia-ml.so this process mapped
        self.root = root
        self.missing_symbols = set(missing_symbols)
        self.clock_ns = clock_ns
        self.driver_up = True
        self.refcount = 0
        self.generation = 0
        self.calls: Counter[str] = Counter()
        self.missing: Counter[str] = Counter()
        self.waits: Counter[str] = Counter()  # thread name -> calls with a built-in wait
        self.inside_ns = 0  # CPU time spent inside the C functions
        self.misuse: list[str] = []
        self._lock = threading.Lock()
        self._handles: dict[int, tuple[FakeGpu, FakeMig | None, int]] = {}
        self._gpm_samples: dict[int, tuple[Any, int, dict[int, float]] | None] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._next_addr = 0x5000_0000
        self._last_ns: dict[int, int] = {}
        self._saved: dict[str, Any] = {}

    # -- installation ----------------------------------------------------------------------------
    @classmethod
    def install(cls, monkeypatch: Any = None, gpus: list[FakeGpu] | None = None, **kw: Any) -> FakeNvml:
        """Make the real pynvml resolve its C functions against a new stand-in."""
        fake = cls(gpus if gpus is not None else [h100(0)], **kw)
        patches = {"nvmlLib": _Library(fake), "_nvmlGetFunctionPointer_cache": {}, "_nvmlLib_refcount": 0}
        for name, value in patches.items():
            if monkeypatch is not None:
                monkeypatch.setattr(nv, name, value)
            else:
                fake._saved[name] = getattr(nv, name)
                setattr(nv, name, value)
        return fake

    def uninstall(self) -> None:
        for name, value in self._saved.items():
            setattr(nv, name, value)
        self._saved.clear()

    def check(self) -> None:
        """Fail on what a real driver would leak or a reader of the reference would call misuse."""
        problems = list(self.misuse)
        if self._gpm_samples:
            problems.append(f"{len(self._gpm_samples)} GPM sample(s) allocated and never freed")
        if self._event_sets:
            problems.append(f"{len(self._event_sets)} event set(s) created and never freed")
        assert not problems, "; ".join(problems)

    @property
    def gpm_samples_live(self) -> int:
        return len(self._gpm_samples)

    # -- scripting -------------------------------------------------------------------------------
    def lose(self, index: int) -> None:
        """The GPU falls off the bus: every call on it answers GpuIsLost."""
        self.gpus[index].lost = True

    def driver_unload(self) -> None:
        """Every call answers DriverNotLoaded until driver_load()."""
        self.driver_up = False

    def driver_load(self) -> None:
        """The same driver is back; NVML must be initialised again and old handles are stale."""
        self.driver_up = True
        self.refcount = 0
        self.generation += 1

    def upgrade_driver(self, version: str) -> None:
        """The kernel module is replaced by ``version`` (the library this process mapped stays)."""
        self.driver_version = version
        self.driver_load()

    def emit_event(self, index: int, event_type: int, data: int = 0) -> bool:
        """Deliver an event to every set that registered this type on this GPU; False if none did."""
        delivered = False
        for es in list(self._event_sets.values()):
            if es.registered.get(index, 0) & event_type:
                es.queue.put((self._handle_addr(self.gpus[index], None), event_type, data))
                delivered = True
        return delivered

    @property
    def initialized(self) -> bool:
        return self.refcount > 0

    def calls_for(self, *names: str) -> int:
        return sum(self.calls[n] for n in names)

    # -- helpers ---------------------------------------------------------------------------------
    def _now(self) -> int:
        return self.clock_ns()

    def _lib(self) -> None:
        if not self.driver_up:
            raise _Ret(nv.NVML_ERROR_DRIVER_NOT_LOADED)
        if self.driver_version != self.library_version:
            raise _Ret(nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
        if self.refcount <= 0:
            raise _Ret(nv.NVML_ERROR_UNINITIALIZED)

    def _resolve(self, handle: Any, fn: str) -> tuple[FakeGpu, FakeMig | None]:
        self._lib()
        entry = self._handles.get(_addr(handle))
        if entry is None:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        g, mig, gen = entry
        if gen != self.generation:
            raise _Ret(nv.NVML_ERROR_UNINITIALIZED)
        if g.lost:
            raise _Ret(nv.NVML_ERROR_GPU_IS_LOST)
        pending = g.fail.get(fn)
        if pending:
            raise _Ret(pending.pop(0))
        if fn in g.unsupported:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        now = self._now()
        last = self._last_ns.get(g.index)
        if last is not None:
            g.advance((now - last) / 1e9)
        self._last_ns[g.index] = now
        return g, mig

    def _dev(self, handle: Any, fn: str) -> FakeGpu:
        """A physical-GPU call: MIG device handles answer NotSupported."""
        g, mig = self._resolve(handle, fn)
        if mig is not None:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        return g

    def _handle_addr(self, g: FakeGpu, mig: FakeMig | None) -> int:
        base = 0x1000_0000 + self.generation * 0x10000 + g.index * 0x100
        addr = base + (0x10 * (mig.slot + 1) if mig is not None else 0)
        self._handles[addr] = (g, mig, self.generation)
        return addr

    def _alloc_addr(self) -> int:
        with self._lock:
            self._next_addr += 0x100
            return self._next_addr

    # -- library ---------------------------------------------------------------------------------
    def c_nvmlInitWithFlags(self, flags: Any) -> None:
        if self.init_error is not None:
            raise _Ret(self.init_error)
        if not self.driver_up:
            raise _Ret(nv.NVML_ERROR_DRIVER_NOT_LOADED)
        if self.driver_version != self.library_version:
            raise _Ret(nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
        self.refcount += 1

    def c_nvmlShutdown(self) -> None:
        self._lib()
        self.refcount -= 1

    def c_nvmlErrorString(self, result: Any) -> bytes:
        return f"Unknown Error {_val(result)}".encode()

    def c_nvmlSystemGetDriverVersion(self, version: Any, length: Any) -> None:
        self._lib()
        _put_str(version, length, self.driver_version)

    def c_nvmlSystemGetNVMLVersion(self, version: Any, length: Any) -> None:
        self._lib()
        _put_str(version, length, "12." + self.library_version)

    def c_nvmlSystemGetCudaDriverVersion(self, version: Any) -> None:
        self._lib()
        _put(version, ctypes.c_int, 12080)

    def c_nvmlDeviceGetCount_v2(self, count: Any) -> None:
        self._lib()
        _put(count, ctypes.c_uint, len(self.gpus))

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> None:
        self._lib()
        i = _val(index)
        if not 0 <= i < len(self.gpus):
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[i]
        if g.lost:
            raise _Ret(nv.NVML_ERROR_GPU_IS_LOST)
        _put(device, ctypes.c_void_p, self._handle_addr(g, None))

    # -- identity --------------------------------------------------------------------------------
    def c_nvmlDeviceGetName(self, device: Any, name: Any, length: Any) -> None:
        g, mig = self._resolve(device, "nvmlDeviceGetName")
        text = g.name
        if mig is not None:
            p = g.mig_profile(mig.profile_id)
            text = f"{g.name} {p.name if p else 'MIG'}"
        _put_str(name, length, text)

    def c_nvmlDeviceGetUUID(self, device: Any, uuid: Any, length: Any) -> None:
        g, mig = self._resolve(device, "nvmlDeviceGetUUID")
        text = g.uuid if mig is None else f"MIG-{g.uuid[4:-4]}{mig.gi:02x}{mig.ci:02x}"
        _put_str(uuid, length, text)

    def c_nvmlDeviceGetPciInfo_v3(self, device: Any, pci: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetPciInfo_v3")
        info = _out(pci, nv.nvmlPciInfo_t)
        info.busId = g.pci_bus_id.encode()
        info.bus = int(g.pci_bus_id.split(":")[1], 16)

    def c_nvmlDeviceGetVbiosVersion(self, device: Any, version: Any, length: Any) -> None:
        _put_str(version, length, self._dev(device, "nvmlDeviceGetVbiosVersion").vbios)

    def c_nvmlDeviceGetMigMode(self, device: Any, current: Any, pending: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetMigMode")
        if not g.mig_profiles and not g.mig:  # no MIG on this product
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        _put(current, ctypes.c_uint, 1 if g.mig else 0)
        _put(pending, ctypes.c_uint, 1 if g.mig else 0)

    def c_nvmlDeviceGetMaxClockInfo(self, device: Any, type: Any, clock: Any) -> None:
        _put(clock, ctypes.c_uint, self._dev(device, "nvmlDeviceGetMaxClockInfo").max_clocks[_val(type)])

    def c_nvmlDeviceGetMaxPcieLinkGeneration(self, device: Any, gen: Any) -> None:
        _put(gen, ctypes.c_uint, self._dev(device, "nvmlDeviceGetMaxPcieLinkGeneration").pcie[0])

    def c_nvmlDeviceGetMaxPcieLinkWidth(self, device: Any, width: Any) -> None:
        _put(width, ctypes.c_uint, self._dev(device, "nvmlDeviceGetMaxPcieLinkWidth").pcie[1])

    # -- per cycle -------------------------------------------------------------------------------
    def _memory(self, device: Any, fn: str) -> tuple[int, int, int]:
        """(total, reserved, used) of a GPU or of one MIG device."""
        g, mig = self._resolve(device, fn)
        if mig is not None:
            p = g.mig_profile(mig.profile_id)
            total = (p.memory_mib if p else 0) * _MIB
            return total, 0, mig.mem_used
        if g.mig and not self.root:  # "aggregate information, only if the caller has appropriate privileges"
            raise _Ret(nv.NVML_ERROR_NO_PERMISSION)
        used = sum(m.mem_used for m in g.mig_devices) if g.mig else g.mem_used
        return g.mem_total, g.mem_reserved, used

    def c_nvmlDeviceGetMemoryInfo(self, device: Any, memory: Any) -> None:
        total, reserved, used = self._memory(device, "nvmlDeviceGetMemoryInfo")
        m = _out(memory, nv.c_nvmlMemory_t)  # v1: "used" includes the driver-reserved memory
        m.total, m.used, m.free = total, used + reserved, total - used - reserved

    def c_nvmlDeviceGetMemoryInfo_v2(self, device: Any, memory: Any) -> None:
        g, _ = self._resolve(device, "nvmlDeviceGetMemoryInfo_v2")
        if not g.memory_v2:
            raise _Ret(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        m = _out(memory, nv.c_nvmlMemory_v2_t)
        if m.version != nv.nvmlMemory_v2:
            raise _Ret(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved, used = self._memory(device, "nvmlDeviceGetMemoryInfo_v2")
        m.total, m.reserved, m.used, m.free = total, reserved, used, total - reserved - used

    def c_nvmlDeviceGetUtilizationRates(self, device: Any, utilization: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetUtilizationRates")
        if g.mig:  # "On MIG-enabled GPUs, querying device utilization rates is not currently supported."
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        u = _out(utilization, nv.c_nvmlUtilization_t)
        u.gpu, u.memory = g.util_gpu, g.util_mem

    def c_nvmlDeviceGetTemperatureV(self, device: Any, temperature: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetTemperatureV")
        t = _out(temperature, nv.c_nvmlTemperature_v1_t)
        if t.version != nv.nvmlTemperature_v1:
            raise _Ret(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        t.temperature = g.temp

    def c_nvmlDeviceGetTemperature(self, device: Any, sensor: Any, temp: Any) -> None:
        _put(temp, ctypes.c_uint, self._dev(device, "nvmlDeviceGetTemperature").temp)

    def c_nvmlDeviceGetPowerUsage(self, device: Any, power: Any) -> None:
        _put(power, ctypes.c_uint, self._dev(device, "nvmlDeviceGetPowerUsage").power_mw)

    def c_nvmlDeviceGetTotalEnergyConsumption(self, device: Any, energy: Any) -> None:
        _put(energy, ctypes.c_uint64, int(self._dev(device, "nvmlDeviceGetTotalEnergyConsumption").energy_mj))

    def c_nvmlDeviceGetEnforcedPowerLimit(self, device: Any, limit: Any) -> None:
        _put(limit, ctypes.c_uint, self._dev(device, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw)

    def c_nvmlDeviceGetClockInfo(self, device: Any, type: Any, clock: Any) -> None:
        _put(clock, ctypes.c_uint, self._dev(device, "nvmlDeviceGetClockInfo").clocks[_val(type)])

    def c_nvmlDeviceGetCurrentClocksEventReasons(self, device: Any, reasons: Any) -> None:
        _put(reasons, ctypes.c_ulonglong, self._dev(device, "nvmlDeviceGetCurrentClocksEventReasons").reasons)

    def c_nvmlDeviceGetCurrentClocksThrottleReasons(self, device: Any, reasons: Any) -> None:
        _put(reasons, ctypes.c_ulonglong, self._dev(device, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons)

    def c_nvmlDeviceGetPerformanceState(self, device: Any, pstate: Any) -> None:
        _put(pstate, ctypes.c_uint, self._dev(device, "nvmlDeviceGetPerformanceState").pstate)

    def c_nvmlDeviceGetFanSpeed(self, device: Any, speed: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetFanSpeed")
        if not g.fan:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        _put(speed, ctypes.c_uint, g.fan_pct)

    def c_nvmlDeviceGetPcieThroughput(self, device: Any, counter: Any, value: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetPcieThroughput")
        c = _val(counter)
        if c not in (0, 1):
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        _put(value, ctypes.c_uint, int(g.pcie_bytes_per_s[c] / 1024))  # "throughput in KB/s" (see module doc)

    def _codec(self, device: Any, fn: str, attr: str, util: Any, period: Any) -> None:
        g = self._dev(device, fn)
        if g.mig:  # "On MIG-enabled GPUs, querying encoder/decoder utilization is not currently supported."
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        _put(util, ctypes.c_uint, getattr(g, attr))
        _put(period, ctypes.c_uint, 167_000)

    def c_nvmlDeviceGetEncoderUtilization(self, device: Any, util: Any, period: Any) -> None:
        self._codec(device, "nvmlDeviceGetEncoderUtilization", "enc", util, period)

    def c_nvmlDeviceGetDecoderUtilization(self, device: Any, util: Any, period: Any) -> None:
        self._codec(device, "nvmlDeviceGetDecoderUtilization", "dec", util, period)

    # -- slower tiers ----------------------------------------------------------------------------
    def c_nvmlDeviceGetPcieReplayCounter(self, device: Any, value: Any) -> None:
        _put(value, ctypes.c_uint, self._dev(device, "nvmlDeviceGetPcieReplayCounter").pcie_replays)

    def c_nvmlDeviceGetCurrPcieLinkGeneration(self, device: Any, gen: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetCurrPcieLinkGeneration")
        _put(gen, ctypes.c_uint, g.pcie_link[0])  # type: ignore[index]

    def c_nvmlDeviceGetCurrPcieLinkWidth(self, device: Any, width: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetCurrPcieLinkWidth")
        _put(width, ctypes.c_uint, g.pcie_link[1])  # type: ignore[index]

    def c_nvmlDeviceGetTotalEccErrors(self, device: Any, error_type: Any, counter_type: Any, count: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetTotalEccErrors")
        if not g.ecc:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        _put(count, ctypes.c_ulonglong, g.ecc_counts[(_val(error_type), _val(counter_type))])

    def c_nvmlDeviceGetRemappedRows(self, device: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetRemappedRows")
        if not g.ecc:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        for arg, v in zip((corr, unc, pending, failure), g.remapped, strict=True):
            _put(arg, ctypes.c_uint, v)

    def c_nvmlDeviceGetNvLinkState(self, device: Any, link: Any, is_active: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetNvLinkState")
        k = _val(link)
        if k >= g.nvlink_links:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED if g.nvlink_links == 0 else nv.NVML_ERROR_INVALID_ARGUMENT)
        _put(is_active, ctypes.c_uint, 0 if k in g.nvlink_down else 1)

    def c_nvmlDeviceGetFieldValues(self, device: Any, count: Any, values: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetFieldValues")
        n, base = _val(count), _addr(values)
        if n <= 0 or not base:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        ts = self._now() // 1000
        for i in range(n):
            v = nv.c_nvmlFieldValue_t.from_address(base + i * _FV_SIZE)
            r = g.field_value(v.fieldId, v.scopeId)
            v.timestamp, v.latencyUsec = ts, 2
            if isinstance(r, int):
                v.nvmlReturn = r
            else:
                v.nvmlReturn, v.valueType = nv.NVML_SUCCESS, r[0]
                _VALUE_CTYPES[r[0]].from_address(ctypes.addressof(v) + nv.c_nvmlFieldValue_t.value.offset).value = r[1]

    # -- processes -------------------------------------------------------------------------------
    def _proc_list(self, device: Any, count: Any, infos: Any, fn: str, graphics: bool) -> None:
        g, mig = self._resolve(device, fn)
        if mig is not None:
            rows = [(pid, mem, mig.gi, mig.ci) for pid, mem in ([] if graphics else mig.procs)]
        elif g.mig:
            if not self.root:  # aggregate over instances "only if the caller has appropriate privileges"
                raise _Ret(nv.NVML_ERROR_NO_PERMISSION)
            rows = [] if graphics else [(pid, mem, m.gi, m.ci) for m in g.mig_devices for pid, mem in m.procs]
        else:
            rows = [(pid, mem, UINT_MAX, UINT_MAX) for pid, mem in (g.graphics_procs if graphics else g.compute_procs)]
        room = _out(count, ctypes.c_uint)
        if room.value < len(rows) or (rows and not _addr(infos)):
            room.value = len(rows)
            raise _Ret(nv.NVML_ERROR_INSUFFICIENT_SIZE)
        size = ctypes.sizeof(nv.c_nvmlProcessInfo_v3_t)
        for i, (pid, mem, gi, ci) in enumerate(rows):
            p = nv.c_nvmlProcessInfo_v3_t.from_address(_addr(infos) + i * size)
            p.pid, p.usedGpuMemory = pid, ULL_NA if mem is None else mem
            p.gpuInstanceId, p.computeInstanceId = gi, ci
        room.value = len(rows)

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, device: Any, count: Any, infos: Any) -> None:
        self._proc_list(device, count, infos, "nvmlDeviceGetComputeRunningProcesses_v3", graphics=False)

    def c_nvmlDeviceGetGraphicsRunningProcesses_v3(self, device: Any, count: Any, infos: Any) -> None:
        self._proc_list(device, count, infos, "nvmlDeviceGetGraphicsRunningProcesses_v3", graphics=True)

    #: The driver's per-process sample period (not documented; one sample per period is kept).
    PROC_SAMPLE_PERIOD_US = 1_000_000

    def c_nvmlDeviceGetProcessUtilization(self, device: Any, samples: Any, count: Any, last_seen: Any) -> None:
        g, mig = self._resolve(device, "nvmlDeviceGetProcessUtilization")
        if g.mig or mig is not None:  # "On MIG-enabled GPUs, querying process utilization is not currently supported."
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        now_us = self._now() // 1000
        ts = now_us - now_us % self.PROC_SAMPLE_PERIOD_US  # the last sample period's timestamp
        busy_rows = [(pid, sm, mem) for pid, (sm, mem) in sorted(g.proc_util.items()) if sm or mem]
        if not busy_rows or ts <= _val(last_seen):
            raise _Ret(nv.NVML_ERROR_NOT_FOUND)
        room = _out(count, ctypes.c_uint)
        if not _addr(samples) or room.value < len(busy_rows):
            room.value = len(busy_rows)
            raise _Ret(nv.NVML_ERROR_INSUFFICIENT_SIZE)
        size = ctypes.sizeof(nv.c_nvmlProcessUtilizationSample_t)
        for i, (pid, sm, mem) in enumerate(busy_rows):  # one sample per busy process, not a history
            s = nv.c_nvmlProcessUtilizationSample_t.from_address(_addr(samples) + i * size)
            s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil = pid, ts, sm, mem, 0, 0
        room.value = len(busy_rows)

    # -- GPM -------------------------------------------------------------------------------------
    def c_nvmlGpmQueryDeviceSupport(self, device: Any, support: Any) -> None:
        g, _ = self._resolve(device, "nvmlGpmQueryDeviceSupport")
        s = _out(support, nv.c_nvmlGpmSupport_t)
        if s.version != nv.NVML_GPM_SUPPORT_VERSION:
            raise _Ret(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        s.isSupportedDevice = 1 if g.gpm else 0

    def c_nvmlGpmSampleAlloc(self, sample: Any) -> None:
        self._lib()
        addr = self._alloc_addr()
        self._gpm_samples[addr] = None
        _put(sample, ctypes.c_void_p, addr)

    def c_nvmlGpmSampleFree(self, sample: Any) -> None:
        # documented returns: SUCCESS, or INVALID_ARGUMENT "if an invalid pointer is provided"
        if self._gpm_samples.pop(_addr(sample), False) is False:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)

    def _take(self, sample: Any, source: Any, values: dict[int, float]) -> None:
        addr = _addr(sample)
        if addr not in self._gpm_samples:
            self.misuse.append(f"GPM sample {addr:#x} used without nvmlGpmSampleAlloc (or after free)")
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_samples[addr] = (source, self._now(), dict(values))

    def c_nvmlGpmSampleGet(self, device: Any, sample: Any) -> None:
        g, mig = self._resolve(device, "nvmlGpmSampleGet")
        if not g.gpm or (g.mig and mig is None):  # a MIG parent: per instance only (see module doc)
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        self._take(sample, (g.index, mig.gi if mig else None), mig.gpm_values if mig else g.gpm_values)

    def c_nvmlGpmMigSampleGet(self, device: Any, gpu_instance_id: Any, sample: Any) -> None:
        g = self._dev(device, "nvmlGpmMigSampleGet")
        gi = _val(gpu_instance_id)
        if not g.gpm or not g.mig:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        mig = next((m for m in g.mig_devices if m.gi == gi), None)
        if mig is None:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        self._take(sample, (g.index, gi), mig.gpm_values)

    def c_nvmlGpmMetricsGet(self, metrics_get: Any) -> None:
        self._lib()
        mg = _out(metrics_get, nv.c_nvmlGpmMetricsGet_t)
        if mg.version != nv.NVML_GPM_METRICS_GET_VERSION:
            raise _Ret(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        a1 = ctypes.cast(mg.sample1, ctypes.c_void_p).value or 0
        a2 = ctypes.cast(mg.sample2, ctypes.c_void_p).value or 0
        s1, s2 = self._gpm_samples.get(a1), self._gpm_samples.get(a2)
        if s1 is None or s2 is None or a1 == a2 or s1[0] != s2[0]:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        if s2[1] - s1[1] <= GPM_MIN_INTERVAL_NS:
            self.misuse.append(f"GPM metrics over {(s2[1] - s1[1]) / 1e6:.1f} ms (< 100 ms between samples)")
        base = ctypes.addressof(mg) + _GM_OFFSET
        for i in range(mg.numMetrics):  # the activity over the interval ending at sample 2
            m = nv.c_nvmlGpmMetric_t.from_address(base + i * _GM_SIZE)
            v = s2[2].get(m.metricId)
            m.value = 0.0 if v is None else v
            m.nvmlReturn = nv.NVML_ERROR_NOT_SUPPORTED if v is None else nv.NVML_SUCCESS

    # -- events ----------------------------------------------------------------------------------
    def c_nvmlEventSetCreate(self, event_set: Any) -> None:
        self._lib()
        addr = self._alloc_addr()
        self._event_sets[addr] = _EventSet()
        _put(event_set, ctypes.c_void_p, addr)

    def c_nvmlEventSetFree(self, event_set: Any) -> None:
        self._lib()
        if self._event_sets.pop(_addr(event_set), None) is None:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)

    def c_nvmlDeviceGetSupportedEventTypes(self, device: Any, types: Any) -> None:
        _put(types, ctypes.c_ulonglong, self._dev(device, "nvmlDeviceGetSupportedEventTypes").event_types)

    def c_nvmlDeviceRegisterEvents(self, device: Any, types: Any, event_set: Any) -> None:
        g = self._dev(device, "nvmlDeviceRegisterEvents")
        es = self._event_sets.get(_addr(event_set))
        if es is None:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        mask = _val(types)
        if mask & ~g.event_types:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        es.registered[g.index] = es.registered.get(g.index, 0) | mask

    def c_nvmlEventSetWait_v2(self, event_set: Any, data: Any, timeout_ms: Any) -> None:
        self._lib()
        es = self._event_sets.get(_addr(event_set))
        if es is None:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        try:  # "If there are no events ready to be delivered, function sleeps till event arrives"
            device, etype, value = es.queue.get(timeout=_val(timeout_ms) / 1000)
        except queue.Empty:
            raise _Ret(nv.NVML_ERROR_TIMEOUT) from None
        d = _out(data, nv.c_nvmlEventData_t)
        ctypes.c_void_p.from_address(ctypes.addressof(d)).value = device
        d.eventType, d.eventData, d.gpuInstanceId, d.computeInstanceId = etype, value, UINT_MAX, UINT_MAX

    # -- MIG -------------------------------------------------------------------------------------
    def c_nvmlDeviceGetMaxMigDeviceCount(self, device: Any, count: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetMaxMigDeviceCount")
        _put(count, ctypes.c_uint, 7 if g.mig else 0)  # "Returns zero if MIG is not supported or enabled."

    def c_nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: Any, mig_device: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not g.mig:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        i = _val(index)
        if not 0 <= i < 7:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        mig = next((m for m in g.mig_devices if m.slot == i), None)
        if mig is None:  # "if no valid MIG device was found at index"
            raise _Ret(nv.NVML_ERROR_NOT_FOUND)
        _put(mig_device, ctypes.c_void_p, self._handle_addr(g, mig))

    def _mig(self, device: Any, fn: str) -> tuple[FakeGpu, FakeMig]:
        g, mig = self._resolve(device, fn)
        if mig is None:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        return g, mig

    def c_nvmlDeviceGetGpuInstanceId(self, device: Any, gi: Any) -> None:
        _put(gi, ctypes.c_uint, self._mig(device, "nvmlDeviceGetGpuInstanceId")[1].gi)

    def c_nvmlDeviceGetComputeInstanceId(self, device: Any, ci: Any) -> None:
        _put(ci, ctypes.c_uint, self._mig(device, "nvmlDeviceGetComputeInstanceId")[1].ci)

    def c_nvmlDeviceIsMigDeviceHandle(self, device: Any, is_mig: Any) -> None:
        _put(is_mig, ctypes.c_uint, 0 if self._resolve(device, "nvmlDeviceIsMigDeviceHandle")[1] is None else 1)

    def c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig_device: Any, device: Any) -> None:
        g, _ = self._mig(mig_device, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        _put(device, ctypes.c_void_p, self._handle_addr(g, None))

    def c_nvmlDeviceGetAttributes_v2(self, device: Any, attributes: Any) -> None:
        g, mig = self._mig(device, "nvmlDeviceGetAttributes_v2")  # "only supports MIG device handles"
        p = g.mig_profile(mig.profile_id)
        if p is None:
            raise _Ret(nv.NVML_ERROR_UNKNOWN)
        a = _out(attributes, nv.c_nvmlDeviceAttributes)
        a.multiprocessorCount, a.gpuInstanceSliceCount, a.computeInstanceSliceCount = p.sms, p.slices, p.slices
        a.memorySizeMB = p.memory_mib

    def c_nvmlDeviceGetGpuInstanceProfileInfoV(self, device: Any, profile: Any, info: Any) -> None:
        g = self._dev(device, "nvmlDeviceGetGpuInstanceProfileInfoV")
        out = _out(info, nv.c_nvmlGpuInstanceProfileInfo_v2_t)
        if out.version != nv.nvmlGpuInstanceProfileInfo_v2:
            raise _Ret(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        pid = _val(profile)
        if not 0 <= pid < nv.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _Ret(nv.NVML_ERROR_INVALID_ARGUMENT)
        p = g.mig_profile(pid)
        if p is None:
            raise _Ret(nv.NVML_ERROR_NOT_SUPPORTED)
        out.id, out.sliceCount, out.memorySizeMB, out.multiprocessorCount = p.profile_id, p.slices, p.memory_mib, p.sms
        out.name = p.name.encode()
