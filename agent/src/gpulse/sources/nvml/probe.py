"""Probe every metric on a GPU once and compile what works into a per-GPU sampling plan.

The plan is the capability table made executable: per tier (every cycle, ~10 s, ~60 s) one list
of ``nvmlDeviceGetFieldValues`` ids with the field each entry fills, and one list of small
collectors ``(label, fn(handle, out))`` bound to the pynvml functions that answered. The hot path
then loops over these lists and never probes, so an unsupported metric costs nothing and is
absent from the line, never 0.

Field ids are the long-stable ones (the newer ``CLOCKS_EVENT_REASON_*`` ids were renumbered
between binding releases: 251 in nvidia-ml-py 12.575.51, 269 in 13.x); each entry's ``nvmlReturn`` and a plausible range are checked at probe time.
Units: power fields are mW (→ W); energy is mJ; NVLink counters are KiB; the perf-policy
(throttle-time) counters 74-79 are stored as read, in the driver's unit, which nvidia-smi prints
as µs (``clocks_event_reasons_counters_*``) while the older ViolationStatus API documents ns —
hence the ``*_us`` fields say "driver units"; derive a fraction of time with a rate over a known
throttled interval on real hardware before trusting the scale.
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpulse import schema
from gpulse.sources.base import GpuIdentity
from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml import gpm as nvml_gpm
from gpulse.sources.nvml.events import handle_key

Collector = Callable[[Any, dict[str, Any]], None]
Factory = Callable[[Any], Collector | None]

#: nvmlValueType_t -> attribute of the c_nvmlValue_t union
VALUE_ATTR = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_INF = math.inf
#: (tier, field id, scope id, gpu field, scale or None, plausible (lo, hi) of the converted value)
FIELD_READS: tuple[tuple[str, int, int, str, float | None, tuple[float, float]], ...] = (
    ("fast", 82, 0, "temp_mem_c", None, (1, 150)),  # NVML_FI_DEV_MEMORY_TEMP
    ("fast", 186, 0, "power_w", 0.001, (0, 5000)),  # NVML_FI_DEV_POWER_INSTANT, scope GPU, mW
    ("fast", 83, 0, "energy_mj", None, (0, _INF)),  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    ("medium", 74, 0, "throttle_power_us", None, (0, _INF)),  # NVML_FI_DEV_PERF_POLICY_POWER
    ("medium", 75, 0, "throttle_thermal_us", None, (0, _INF)),
    ("medium", 76, 0, "throttle_sync_boost_us", None, (0, _INF)),
    ("medium", 77, 0, "throttle_board_limit_us", None, (0, _INF)),
    ("medium", 78, 0, "throttle_low_util_us", None, (0, _INF)),
    ("medium", 79, 0, "throttle_reliability_us", None, (0, _INF)),
    ("medium", 94, 0, "pcie_replays", None, (0, _INF)),  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    ("slow", 3, 0, "ecc_corrected_volatile", None, (0, _INF)),  # ECC_SBE_VOL_TOTAL
    ("slow", 4, 0, "ecc_uncorrected_volatile", None, (0, _INF)),  # ECC_DBE_VOL_TOTAL
    ("slow", 5, 0, "ecc_corrected_aggregate", None, (0, _INF)),  # ECC_SBE_AGG_TOTAL
    ("slow", 6, 0, "ecc_uncorrected_aggregate", None, (0, _INF)),  # ECC_DBE_AGG_TOTAL
    ("slow", 29, 0, "retired_pages_sbe", None, (0, _INF)),  # NVML_FI_DEV_RETIRED_SBE
    ("slow", 30, 0, "retired_pages_dbe", None, (0, _INF)),
    ("slow", 31, 0, "retired_pages_pending", None, (0, 1)),
)
FI_NVLINK_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, scopeId = link
FI_NVLINK_RX_KIB = 139
PCIE_KB = 1024  # nvmlDeviceGetPcieThroughput answers in KB/s (20 ms window); read as KiB like nvitop

_THROTTLE = schema.THROTTLE_MASK
_FLAGS = tuple((bit, name) for bit, name, _ in schema.CLOCK_EVENT_FLAGS)
_FLAG_CACHE: dict[int, dict[str, int]] = {}


def decode_clock_reasons(mask: int) -> dict[str, int]:
    """The clk_* flags and ``throttled`` of a clock-event bitmask (cached: few masks occur)."""
    d = _FLAG_CACHE.get(mask)
    if d is None:
        d = {name: 1 if mask & bit else 0 for bit, name in _FLAGS}
        d["throttled"] = 1 if mask & _THROTTLE else 0
        if len(_FLAG_CACHE) < 4096:
            _FLAG_CACHE[mask] = d
    return d


# -- collectors (one factory per metric, alternatives in order of preference) ----------------------
def _util(nv: Any) -> Collector:
    f = nv.nvmlDeviceGetUtilizationRates

    def c(h: Any, out: dict[str, Any]) -> None:
        u = f(h)
        out["util_gpu_pct"] = u.gpu
        out["util_mem_pct"] = u.memory

    return c


def _mem_v2(nv: Any) -> Collector | None:
    f, v2 = nv.nvmlDeviceGetMemoryInfo, getattr(nv, "nvmlMemory_v2", None)
    if v2 is None:
        return None

    def c(h: Any, out: dict[str, Any]) -> None:
        m = f(h, version=v2)  # v2: used excludes driver-reserved memory (v1 counts it as used)
        out["mem_used_bytes"] = m.used
        out["mem_free_bytes"] = m.free
        out["mem_reserved_bytes"] = m.reserved
        out["mem_total_bytes"] = m.total

    return c


def _mem_v1(nv: Any) -> Collector:
    f = nv.nvmlDeviceGetMemoryInfo

    def c(h: Any, out: dict[str, Any]) -> None:
        m = f(h)  # drivers < 515: used includes reserved memory; nothing better exists there
        out["mem_used_bytes"] = m.used
        out["mem_free_bytes"] = m.free
        out["mem_total_bytes"] = m.total

    return c


def _getter(fn_name: str, field_name: str, *args: Any, scale: float | None = None) -> Factory:
    """A factory for a one-value call ``fn(handle, *args)``."""

    def factory(nv: Any) -> Collector | None:
        f = getattr(nv, fn_name, None)
        if f is None:
            return None
        if scale is None:

            def c(h: Any, out: dict[str, Any]) -> None:
                out[field_name] = f(h, *args)

        else:

            def c(h: Any, out: dict[str, Any]) -> None:
                out[field_name] = f(h, *args) * scale

        return c

    return factory


def _temp_v(nv: Any) -> Collector | None:
    f = getattr(nv, "nvmlDeviceGetTemperatureV", None)
    if f is None:
        return None

    def c(h: Any, out: dict[str, Any]) -> None:
        out["temp_gpu_c"] = f(h, 0)  # NVML_TEMPERATURE_GPU

    return c


def _reasons(fn_name: str) -> Factory:
    def factory(nv: Any) -> Collector | None:
        f = getattr(nv, fn_name, None)
        if f is None:
            return None

        def c(h: Any, out: dict[str, Any]) -> None:
            m = f(h)
            out["clock_event_reasons"] = m
            out.update(decode_clock_reasons(m))

        return c

    return factory


def _codec(fn_name: str, field_name: str) -> Factory:
    def factory(nv: Any) -> Collector | None:
        f = getattr(nv, fn_name, None)
        if f is None:
            return None

        def c(h: Any, out: dict[str, Any]) -> None:
            out[field_name] = f(h)[0]  # [utilization %, sampling period µs]

        return c

    return factory


def _ecc_calls(nv: Any) -> Collector | None:
    f = getattr(nv, "nvmlDeviceGetTotalEccErrors", None)
    if f is None:
        return None

    def c(h: Any, out: dict[str, Any]) -> None:
        out["ecc_corrected_volatile"] = f(h, 0, 0)  # CORRECTED, VOLATILE
        out["ecc_uncorrected_volatile"] = f(h, 1, 0)
        out["ecc_corrected_aggregate"] = f(h, 0, 1)  # AGGREGATE
        out["ecc_uncorrected_aggregate"] = f(h, 1, 1)

    return c


def _remapped(nv: Any) -> Collector | None:
    f = getattr(nv, "nvmlDeviceGetRemappedRows", None)
    if f is None:
        return None

    def c(h: Any, out: dict[str, Any]) -> None:
        corr, unc, pending, failure = f(h)
        out["remapped_rows_correctable"] = corr
        out["remapped_rows_uncorrectable"] = unc
        out["remapped_rows_pending"] = 1 if pending else 0
        out["remapped_rows_failure"] = 1 if failure else 0

    return c


#: (tier, label, alternatives, used only when these fields did not come from field values)
CALLS: tuple[tuple[str, str, tuple[Factory, ...], tuple[str, ...]], ...] = (
    ("fast", "utilization", (_util,), ()),
    ("fast", "memory", (_mem_v2, _mem_v1), ()),
    ("fast", "temperature", (_temp_v, _getter("nvmlDeviceGetTemperature", "temp_gpu_c", 0)), ()),
    ("fast", "power", (_getter("nvmlDeviceGetPowerUsage", "power_w", scale=0.001),), ("power_w",)),
    ("fast", "energy", (_getter("nvmlDeviceGetTotalEnergyConsumption", "energy_mj"),), ("energy_mj",)),
    ("fast", "power_limit", (_getter("nvmlDeviceGetEnforcedPowerLimit", "power_limit_w", scale=0.001),), ()),
    ("fast", "clock_sm", (_getter("nvmlDeviceGetClockInfo", "clock_sm_mhz", 1),), ()),  # NVML_CLOCK_SM
    ("fast", "clock_mem", (_getter("nvmlDeviceGetClockInfo", "clock_mem_mhz", 2),), ()),
    ("fast", "clock_graphics", (_getter("nvmlDeviceGetClockInfo", "clock_graphics_mhz", 0),), ()),
    (
        "fast",
        "clock_event_reasons",
        (_reasons("nvmlDeviceGetCurrentClocksEventReasons"), _reasons("nvmlDeviceGetCurrentClocksThrottleReasons")),
        (),
    ),
    ("fast", "pstate", (_getter("nvmlDeviceGetPerformanceState", "pstate"),), ()),
    ("fast", "fan", (_getter("nvmlDeviceGetFanSpeed", "fan_pct"),), ()),
    ("fast", "pcie_tx", (_getter("nvmlDeviceGetPcieThroughput", "pcie_tx_bytes_per_s", 0, scale=PCIE_KB),), ()),
    ("fast", "pcie_rx", (_getter("nvmlDeviceGetPcieThroughput", "pcie_rx_bytes_per_s", 1, scale=PCIE_KB),), ()),
    ("fast", "encoder", (_codec("nvmlDeviceGetEncoderUtilization", "enc_util_pct"),), ()),
    ("fast", "decoder", (_codec("nvmlDeviceGetDecoderUtilization", "dec_util_pct"),), ()),
    ("medium", "pcie_replays", (_getter("nvmlDeviceGetPcieReplayCounter", "pcie_replays"),), ("pcie_replays",)),
    ("medium", "pcie_link_gen", (_getter("nvmlDeviceGetCurrPcieLinkGeneration", "pcie_link_gen"),), ()),
    ("medium", "pcie_link_width", (_getter("nvmlDeviceGetCurrPcieLinkWidth", "pcie_link_width"),), ()),
    ("slow", "ecc", (_ecc_calls,), ("ecc_corrected_volatile",)),
    ("slow", "remapped_rows", (_remapped,), ()),
)
TIERS = ("fast", "medium", "slow")

#: The fields a collector writes, for one that was kept after a transient error at probe time.
_LABEL_FIELDS: dict[str, tuple[str, ...]] = {
    "utilization": ("util_gpu_pct", "util_mem_pct"),
    "memory": ("mem_used_bytes", "mem_free_bytes", "mem_reserved_bytes", "mem_total_bytes"),
    "temperature": ("temp_gpu_c",),
    "power": ("power_w",),
    "energy": ("energy_mj",),
    "power_limit": ("power_limit_w",),
    "clock_sm": ("clock_sm_mhz",),
    "clock_mem": ("clock_mem_mhz",),
    "clock_graphics": ("clock_graphics_mhz",),
    "clock_event_reasons": ("clock_event_reasons", "throttled", *(name for _, name, _ in schema.CLOCK_EVENT_FLAGS)),
    "pstate": ("pstate",),
    "fan": ("fan_pct",),
    "pcie_tx": ("pcie_tx_bytes_per_s",),
    "pcie_rx": ("pcie_rx_bytes_per_s",),
    "encoder": ("enc_util_pct",),
    "decoder": ("dec_util_pct",),
    "pcie_replays": ("pcie_replays",),
    "pcie_link_gen": ("pcie_link_gen",),
    "pcie_link_width": ("pcie_link_width",),
    "ecc": (
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
    ),
    "remapped_rows": (
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
    ),
}


def _fields_of(label: str) -> tuple[str, ...]:
    return _LABEL_FIELDS.get(label, ())


@dataclass
class Tier:
    """What one tier reads: a field-values batch and a list of collectors."""

    fids: list[tuple[int, int]] = field(default_factory=list)
    fmap: list[tuple[str, float | None]] = field(default_factory=list)
    calls: list[tuple[str, Collector]] = field(default_factory=list)


@dataclass
class GpuPlan:
    """Everything the hot path needs for one GPU, decided once at probe time."""

    identity: GpuIdentity
    handle: Any
    key: int
    info: dict[str, Any]
    tiers: dict[str, Tier]
    supported: set[str]
    links: list[int] = field(default_factory=list)
    link_fids: list[tuple[int, int]] = field(default_factory=list)
    gpm: nvml_gpm.GpmSampler | None = None
    proc_lists: list[Callable[[Any], Any]] = field(default_factory=list)
    proc_util: Callable[[Any, int], Any] | None = None
    mig: bool = False
    #: transient error codes met while probing (counted by the source)
    probe_errors: list[int] = field(default_factory=list)

    @property
    def index(self) -> int:
        return self.identity.index

    def info_fields(self) -> dict[str, Any]:
        """The gpu_info point: static facts plus the current supported/unsupported lists."""
        names = [f.name for f in schema.GPU.fields]
        out = dict(self.info)
        out["gpm_supported"] = 1 if self.gpm is not None else 0
        out["supported_metrics"] = ",".join(n for n in names if n in self.supported)
        out["unsupported_metrics"] = ",".join(n for n in names if n not in self.supported)
        return out


def field_value(fv: Any) -> Any:
    return getattr(fv.value, VALUE_ATTR[fv.valueType])


# c_nvmlFieldValue_t: fieldId u32, scopeId u32, timestamp i64, latencyUsec i64, valueType u32,
# nvmlReturn u32, value (8-byte union). pynvml's structures override __getattribute__ (≈0.2 µs per
# attribute), so the hot path decodes the whole array in one struct pass instead.
_FV = struct.Struct("<IIqqIIQ")


def _decode(vtype: int, raw: int) -> Any:
    if vtype == 0:
        return struct.unpack("<d", raw.to_bytes(8, "little"))[0]
    if vtype == 1:
        return raw & 0xFFFFFFFF
    if vtype == 6:
        return raw & 0xFFFF
    if vtype == 4:
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if vtype == 5:
        v = raw & 0xFFFFFFFF
        return v - (1 << 32) if v >= 1 << 31 else v
    return raw  # 2 (unsigned long, 64-bit on Linux), 3 (unsigned long long)


def field_results(nv: Any, values: Any) -> Iterator[tuple[int, Any]]:
    """(nvmlReturn, value) per entry of a ``nvmlDeviceGetFieldValues`` answer."""
    if ctypes.sizeof(nv.c_nvmlFieldValue_t) == _FV.size:
        for _f, _s, _t, _l, vtype, ret, raw in _FV.iter_unpack(bytes(values)):
            yield ret, (raw if vtype == 3 else _decode(vtype, raw)) if ret == 0 else None
    else:  # a binding with another layout: slow but right
        for fv in values:
            ret = fv.nvmlReturn
            yield ret, field_value(fv) if ret == 0 else None


def _call_ok(nv: Any, fn: Callable[[], Any], errors: list[int] | None = None) -> tuple[bool, Any]:
    """(True, value) on success or a transient error, (False, None) when unsupported.

    A lost GPU or a dead driver propagates. A transient error (Timeout, Unknown, ...) keeps the
    metric: one bad answer at start must not hide a metric for the agent's whole life. Its code
    is appended to ``errors`` so the source counts it.
    """
    try:
        return True, fn()
    except nv.NVMLError as e:
        code = E.code_of(e)
        if code in E.LOST or code in E.DRIVER_GONE:
            raise
        if code in E.UNSUPPORTED or errors is None:
            return False, None
        errors.append(code)
        return True, None


def probe_gpu(nv: Any, index: int, system: dict[str, Any], want_gpm: bool = True) -> GpuPlan:
    """Probe GPU ``index``; raises pynvml errors only when the GPU is lost or the driver is gone."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    name = str(nv.nvmlDeviceGetName(h))
    uuid = str(nv.nvmlDeviceGetUUID(h))
    ident = GpuIdentity(index, uuid, name)
    info: dict[str, Any] = {"name": name, **system}
    tiers = {t: Tier() for t in TIERS}
    supported: set[str] = set()
    errors: list[int] = []

    # field values: one batch with every candidate, keep the entries that answer plausibly
    ok, values = _call_ok(nv, lambda: nv.nvmlDeviceGetFieldValues(h, [(fid, sc) for _, fid, sc, *_ in FIELD_READS]))
    if ok:
        for (tier, fid, scope, fname, scale, (lo, hi)), (ret, v) in zip(
            FIELD_READS, field_results(nv, values), strict=True
        ):
            if ret in E.LOST or ret in E.DRIVER_GONE:
                raise nv.NVMLError(ret)
            if ret != 0:
                continue
            v = v * scale if scale is not None else v
            if isinstance(v, (int, float)) and lo <= v <= hi:
                tiers[tier].fids.append((fid, scope))
                tiers[tier].fmap.append((fname, scale))
                supported.add(fname)

    for tier, label, alternatives, only_if_missing in CALLS:
        if only_if_missing and only_if_missing[0] in supported:
            continue
        for factory in alternatives:
            fn = factory(nv)
            if fn is None:
                continue
            scratch: dict[str, Any] = {}
            ok, _ = _call_ok(nv, lambda fn=fn, scratch=scratch: fn(h, scratch), errors)
            if ok:
                tiers[tier].calls.append((label, fn))
                supported.update(scratch or _fields_of(label))
                if label == "memory":
                    info["mem_total_bytes"] = scratch.get("mem_total_bytes")
                if label == "power_limit":
                    info["power_limit_w"] = scratch.get("power_limit_w")
                break

    plan = GpuPlan(ident, h, handle_key(h), info, tiers, supported, probe_errors=errors)
    _probe_static(nv, h, info)
    mig = _call_ok(nv, lambda: nv.nvmlDeviceGetMigMode(h))[1]
    plan.mig = bool(mig and mig[0] == 1)
    info["mig_mode"] = 1 if plan.mig else 0
    _probe_nvlink(nv, plan)
    info["nvlink_links"] = len(plan.links)
    if want_gpm and nvml_gpm.gpm_supported(nv, h):
        try:
            plan.gpm = nvml_gpm.GpmSampler(nv, h)
            supported.update(nvml_gpm.FIELDS)
        except nv.NVMLError as e:
            if E.code_of(e) in E.LOST or E.code_of(e) in E.DRIVER_GONE:
                raise
    _probe_processes(nv, plan)
    return plan


def _probe_static(nv: Any, h: Any, info: dict[str, Any]) -> None:
    def put(key: str, fn: Callable[[], Any], conv: Callable[[Any], Any] = lambda v: v) -> None:
        ok, v = _call_ok(nv, fn)
        if ok and v is not None:
            info[key] = conv(v)

    put("pci_bus_id", lambda: nv.nvmlDeviceGetPciInfo(h).busId, _text)
    put("vbios_version", lambda: nv.nvmlDeviceGetVbiosVersion(h), _text)
    put("clock_sm_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, 1))
    put("clock_mem_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, 2))
    put("clock_graphics_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, 0))
    put("pcie_max_gen", lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
    put("pcie_max_width", lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h))
    if info.get("power_limit_w") is None:
        info.pop("power_limit_w", None)
    if info.get("mem_total_bytes") is None:
        info.pop("mem_total_bytes", None)


def _probe_nvlink(nv: Any, plan: GpuPlan) -> None:
    """Links that exist (state answers) and whose byte counters answer through field values."""
    state = getattr(nv, "nvmlDeviceGetNvLinkState", None)
    if state is None:
        return
    h = plan.handle
    links = [
        link for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)) if _call_ok(nv, lambda k=link: state(h, k))[0]
    ]
    if not links:
        return
    fids = [(fid, link) for link in links for fid in (FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB)]
    ok, values = _call_ok(nv, lambda: nv.nvmlDeviceGetFieldValues(h, fids))
    if not ok:
        return
    rets = [ret for ret, _ in field_results(nv, values)]
    good = [link for i, link in enumerate(links) if rets[2 * i] == 0 and rets[2 * i + 1] == 0]
    plan.links = good
    plan.link_fids = [(fid, link) for link in good for fid in (FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB)]
    if good:
        plan.supported.update(("nvlink_tx_kib", "nvlink_rx_kib"))


def _probe_processes(nv: Any, plan: GpuPlan) -> None:
    h = plan.handle
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        f = getattr(nv, name, None)
        if f is not None and _call_ok(nv, lambda f=f: f(h))[0]:
            plan.proc_lists.append(f)
    util = getattr(nv, "nvmlDeviceGetProcessUtilization", None)
    if util is None:
        return
    try:
        util(h, 0)
        plan.proc_util = util
    except nv.NVMLError as e:
        code = E.code_of(e)
        if code in E.LOST or code in E.DRIVER_GONE:
            raise
        if code == E.NOT_FOUND:  # supported, just no sample newer than the cursor yet
            plan.proc_util = util


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def system_info(nv: Any) -> dict[str, Any]:
    """Driver, CUDA and NVML versions (the same for every GPU of the node)."""
    out: dict[str, Any] = {}
    for key, fn_name in (
        ("driver_version", "nvmlSystemGetDriverVersion"),
        ("nvml_version", "nvmlSystemGetNVMLVersion"),
    ):
        f = getattr(nv, fn_name, None)
        if f is not None:
            ok, v = _call_ok(nv, f)
            if ok:
                out[key] = _text(v)
    f = getattr(nv, "nvmlSystemGetCudaDriverVersion", None)
    if f is not None:
        ok, v = _call_ok(nv, f)
        if ok and isinstance(v, int) and v > 0:
            out["cuda_version"] = f"{v // 1000}.{v % 1000 // 10}"
    return out
