"""Probe every metric on a GPU once and compile what works into a per-GPU sampling plan.

The plan is the capability table made executable: per tier combination one field-values
:class:`~gpulse.sources.nvml.fields.FieldBatch`, and per tier (every cycle, ~10 s, ~60 s) a list of
small collectors ``(label, fn(handle, out))`` bound to the pynvml functions that answered. The hot
path then loops over these and never probes, so an unsupported metric costs nothing and is absent
from the line, never 0.

What a GPU costs per cycle is what the plan holds: on an H100 one field-values call (power,
energy, HBM temperature, PCIe byte counters; the ~10 s tier adds the throttle counters, PCIe
replays and NVLink per link, state included, to the same call), ten single-value calls
(utilisation, memory, temperature, three clocks, clock-event reasons, P-state, encoder, decoder)
and two GPM calls. No call in the plan waits: ``nvmlDeviceGetPcieThroughput`` (20 ms) is replaced
by the PCIe byte counters, or read off the cycle by :mod:`.window` where they are missing.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulse import schema
from gpulse.sources.base import GpuIdentity
from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml import gpm as nvml_gpm
from gpulse.sources.nvml import mig as nvml_mig
from gpulse.sources.nvml import window
from gpulse.sources.nvml.events import handle_key
from gpulse.sources.nvml.fields import (
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_RX_KIB,
    FI_NVLINK_STATE,
    FI_NVLINK_TX_KIB,
    RATE_READS,
    TIERS,
    UINT_MAX,
    VALUE_READS,
    FieldBatch,
    field_results,
)

Collector = Callable[[Any, dict[str, Any]], None]
Factory = Callable[[Any], Collector | None]

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
    ("fast", "encoder", (_codec("nvmlDeviceGetEncoderUtilization", "enc_util_pct"),), ()),
    ("fast", "decoder", (_codec("nvmlDeviceGetDecoderUtilization", "dec_util_pct"),), ()),
    # an administrative setting: read with the ~10 s tier, not every cycle
    ("medium", "power_limit", (_getter("nvmlDeviceGetEnforcedPowerLimit", "power_limit_w", scale=0.001),), ()),
    ("medium", "pcie_replays", (_getter("nvmlDeviceGetPcieReplayCounter", "pcie_replays"),), ("pcie_replays",)),
    ("medium", "pcie_link_gen", (_getter("nvmlDeviceGetCurrPcieLinkGeneration", "pcie_link_gen"),), ()),
    ("medium", "pcie_link_width", (_getter("nvmlDeviceGetCurrPcieLinkWidth", "pcie_link_width"),), ()),
    ("slow", "ecc", (_ecc_calls,), ("ecc_corrected_volatile",)),
    ("slow", "remapped_rows", (_remapped,), ()),
)

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


class ProcessAccess(enum.Enum):
    """What the driver answered for this GPU's process list at probe time (``gpu_info.process_access``)."""

    OK = "ok"
    NO_PERMISSION = "no_permission"  # a MIG parent for a non-root caller: aggregate lists need privileges
    NOT_SUPPORTED = "not_supported"


#: What ``gpulse doctor`` tells a user about a GPU's ``process_access`` (MIG parents and others).
PROCESS_ACCESS_ADVICE: dict[str, str] = {
    ProcessAccess.OK.value: "process list readable",
    ProcessAccess.NO_PERMISSION.value: (
        "process list needs privileges (NVML answers NO_PERMISSION: on a MIG-enabled GPU the aggregate list is "
        "given to privileged callers only); gpulse reads each MIG instance's own list instead, or run the agent "
        "as root for the GPU-wide list"
    ),
    ProcessAccess.NOT_SUPPORTED.value: "the driver offers no process list for this GPU",
}


@dataclass
class GpuPlan:
    """Everything the hot path needs for one GPU, decided once at probe time."""

    identity: GpuIdentity
    handle: Any
    key: int
    info: dict[str, Any]
    calls: dict[str, list[tuple[str, Collector]]]
    supported: set[str]
    values: dict[str, list[tuple[int, int, str, float | None]]] = field(default_factory=dict)
    rates: list[tuple[int, str]] = field(default_factory=list)
    links: list[int] = field(default_factory=list)
    link_totals: bool = False
    #: (medium due, slow due) -> the field-values request of such a cycle
    batches: dict[tuple[bool, bool], FieldBatch] = field(default_factory=dict)
    #: previous (counter, timestamp µs) of each rate field
    rate_prev: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: read by the window reader (20 ms wait per call), not by the cycle
    pcie_window: bool = False
    gpm: nvml_gpm.GpmSampler | None = None
    proc_lists: list[Callable[[Any], Any]] = field(default_factory=list)
    proc_util: Callable[[Any, int], Any] | None = None
    process_access: ProcessAccess = ProcessAccess.OK
    mig: bool = False
    migs: list[nvml_mig.MigPlan] = field(default_factory=list)
    #: transient error codes met while probing (counted by the source)
    probe_errors: list[int] = field(default_factory=list)

    #: the GPU's index, copied from ``identity`` once: the cycle reads it per GPU
    index: int = field(init=False)

    def __post_init__(self) -> None:
        self.index = self.identity.index

    def compile_batches(self) -> None:
        """One field-values layout per (medium, slow) combination; links ride with the medium tier."""
        self.batches = {}
        for medium in (False, True):
            for slow in (False, True):
                values = [v for t in TIERS if t == "fast" or (t == "medium" and medium) or (t == "slow" and slow)
                          for v in self.values.get(t, [])]  # fmt: skip
                links = self.links if medium else []
                self.batches[(medium, slow)] = FieldBatch.build(values, self.rates, links, self.link_totals and medium)

    def info_fields(self) -> dict[str, Any]:
        """The gpu_info point: static facts plus the current supported/unsupported lists."""
        out = dict(self.info)
        out["gpm_supported"] = 1 if self.gpm is not None else 0
        out["process_access"] = self.process_access.value
        out.update(_supported_lists(self.supported))
        return out

    def close(self) -> None:
        """Free the NVML allocations of this GPU (GPM samples), its MIG devices' included."""
        if self.gpm is not None:
            self.gpm.close()
            self.gpm = None
        for m in self.migs:
            m.close()


def _supported_lists(supported: set[str]) -> dict[str, str]:
    names = [f.name for f in schema.GPU.fields]
    return {
        "supported_metrics": ",".join(n for n in names if n in supported),
        "unsupported_metrics": ",".join(n for n in names if n not in supported),
    }


def mig_info_fields(parent: GpuPlan, m: nvml_mig.MigPlan) -> dict[str, Any]:
    """The gpu_info point of one MIG device (tagged with its ``mig``)."""
    out: dict[str, Any] = {"name": f"{parent.identity.model} MIG {m.profile}", "mig_uuid": m.uuid}
    out.update(mig_gpu_instance=m.gpu_instance, mig_compute_instance=m.compute_instance)
    out["gpm_supported"] = 1 if m.gpm is not None else 0
    out["process_access"] = (ProcessAccess.OK if m.proc_lists else ProcessAccess.NOT_SUPPORTED).value
    out.update(_supported_lists(m.supported))
    return out


def _call_ok(nv: Any, fn: Callable[[], Any], errors: list[int] | None = None) -> tuple[bool, Any]:
    """(True, value) on success or a transient error, (False, None) when unsupported.

    A lost GPU or a dead driver propagates. A transient error (Timeout, Unknown, ...) keeps the
    metric: one bad answer at start must not hide a metric for the agent's whole life. Its code
    is appended to ``errors`` so the source counts it. ``NVMLLibraryMismatchError`` (a missing
    versioned symbol behind an unversioned wrapper) is FunctionNotFound: unsupported.
    """
    try:
        return True, fn()
    except E.nvml_errors(nv) as e:
        code = E.code_of(e)
        if code in E.LOST or code in E.DRIVER_GONE:
            raise
        if code in E.UNSUPPORTED or errors is None:
            return False, None
        errors.append(code)
        return True, None


def probe_gpu(
    nv: Any,
    index: int,
    system: dict[str, Any],
    want_gpm: bool = True,
    gpm_clock: Callable[[], int] = time.monotonic_ns,
) -> GpuPlan:
    """Probe GPU ``index``; raises pynvml errors only when the GPU is lost or the driver is gone."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    name = str(nv.nvmlDeviceGetName(h))
    uuid = str(nv.nvmlDeviceGetUUID(h))
    ident = GpuIdentity(index, uuid, name)
    info: dict[str, Any] = {"name": name, **system}
    supported: set[str] = set()
    errors: list[int] = []
    plan = GpuPlan(ident, h, handle_key(h), info, {t: [] for t in TIERS}, supported, probe_errors=errors)
    _probe_fields(nv, plan)

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
                plan.calls[tier].append((label, fn))
                supported.update(scratch or _LABEL_FIELDS.get(label, ()))
                if label == "memory":
                    info["mem_total_bytes"] = scratch.get("mem_total_bytes")
                if label == "power_limit":
                    info["power_limit_w"] = scratch.get("power_limit_w")
                break

    _probe_static(nv, h, info)
    mig = _call_ok(nv, lambda: nv.nvmlDeviceGetMigMode(h))[1]
    plan.mig = bool(mig and mig[0] == 1)
    info["mig_mode"] = 1 if plan.mig else 0
    _probe_nvlink(nv, plan)
    info["nvlink_links"] = len(plan.links)
    _probe_pcie(nv, plan)
    plan.compile_batches()
    gpm_ok = want_gpm and nvml_gpm.gpm_supported(nv, h)
    if gpm_ok and not plan.mig:  # a MIG parent has no GPM of its own: per GPU instance below
        try:
            plan.gpm = nvml_gpm.GpmSampler(nv, h, clock_ns=gpm_clock)
            supported.update(nvml_gpm.FIELDS)
        except E.nvml_errors(nv) as e:
            if E.outcome_of(E.code_of(e)) is not E.ReadOutcome.OK:
                raise
    _probe_processes(nv, plan)
    if plan.mig:
        plan.migs = nvml_mig.probe_migs(nv, h, _call_ok, _memory_collector, gpm_clock if gpm_ok else None)
        info["mig_devices"] = len(plan.migs)
    return plan


def _memory_collector(nv: Any, handle: Any) -> Collector | None:
    """The v2 memory call if it answers on ``handle``, else v1 (for a MIG device handle)."""
    for factory in (_mem_v2, _mem_v1):
        fn = factory(nv)
        if fn is not None and _call_ok(nv, lambda fn=fn: fn(handle, {}))[0]:
            return fn
    return None


def _probe_fields(nv: Any, plan: GpuPlan) -> None:
    """One batch with every candidate field; keep the entries that answer plausibly."""
    h = plan.handle
    fids = [(fid, sc) for _, fid, sc, *_ in VALUE_READS] + [(fid, 0) for fid, _ in RATE_READS]
    ok, values = _call_ok(nv, lambda: nv.nvmlDeviceGetFieldValues(h, fids))
    if not ok or values is None:
        return
    results = list(field_results(nv, values))
    for (tier, fid, scope, fname, scale, (lo, hi)), (ret, v, _ts) in zip(VALUE_READS, results, strict=False):
        if ret in E.LOST or ret in E.DRIVER_GONE:
            raise nv.NVMLError(ret)
        if ret != 0:
            continue
        v = v * scale if scale is not None else v
        if isinstance(v, (int, float)) and lo <= v <= hi:
            plan.values.setdefault(tier, []).append((fid, scope, fname, scale))
            plan.supported.add(fname)
    for (fid, fname), (ret, _v, _ts) in zip(RATE_READS, results[len(VALUE_READS) :], strict=True):
        if ret == 0:
            plan.rates.append((fid, fname))
            plan.supported.add(fname)


def _probe_pcie(nv: Any, plan: GpuPlan) -> None:
    """Without the PCIe byte counters, the 20 ms throughput call, read (and probed) off the cycle
    by :mod:`.window`; it withdraws the fields if the GPU turns out not to answer."""
    if not plan.rates and hasattr(nv, "nvmlDeviceGetPcieThroughput"):
        plan.pcie_window = True
        plan.supported.update(window.FIELDS)


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
    """Links whose state and byte counters answer through field values (one batch, no per-link calls).

    The link count comes from ``NVML_FI_DEV_NVLINK_LINK_COUNT`` where it answers, else every link
    up to ``NVML_NVLINK_MAX_LINKS`` is asked in the same batch. The all-links scope (``UINT_MAX``)
    is kept when it answers: it is the total, and the per-link sum is checked against it."""
    h = plan.handle
    ok, values = _call_ok(nv, lambda: nv.nvmlDeviceGetFieldValues(h, [(FI_NVLINK_LINK_COUNT, 0)]))
    count = next((v for ret, v, _ in field_results(nv, values) if ret == 0), None) if ok and values else None
    candidates = range(int(count) if count else getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
    fids = [(fid, link) for link in candidates for fid in (FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB, FI_NVLINK_STATE)]
    fids += [(FI_NVLINK_TX_KIB, UINT_MAX), (FI_NVLINK_RX_KIB, UINT_MAX)]
    ok, values = _call_ok(nv, lambda: nv.nvmlDeviceGetFieldValues(h, fids))
    if not ok or values is None:
        return
    rets = [ret for ret, _, _ in field_results(nv, values)]
    plan.links = [link for i, link in enumerate(candidates) if rets[3 * i] == rets[3 * i + 1] == rets[3 * i + 2] == 0]
    if plan.links:
        plan.link_totals = rets[-2] == 0 and rets[-1] == 0
        plan.supported.update(("nvlink_tx_kib", "nvlink_rx_kib"))


def _probe_processes(nv: Any, plan: GpuPlan) -> None:
    h = plan.handle
    access = None
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        f = getattr(nv, name, None)
        if f is None:
            continue
        try:
            f(h)
        except E.nvml_errors(nv) as e:
            code = E.code_of(e)
            if code in E.LOST or code in E.DRIVER_GONE:
                raise
            if access is None:
                access = ProcessAccess.NO_PERMISSION if code == E.NO_PERMISSION else ProcessAccess.NOT_SUPPORTED
            continue
        access = ProcessAccess.OK
        if not plan.mig:  # on a MIG GPU each instance's own list is read instead (no duplicates)
            plan.proc_lists.append(f)
    plan.process_access = access or ProcessAccess.NOT_SUPPORTED
    util = getattr(nv, "nvmlDeviceGetProcessUtilization", None)
    if util is None:
        return
    try:
        util(h, 0)
        plan.proc_util = util
    except E.nvml_errors(nv) as e:
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
