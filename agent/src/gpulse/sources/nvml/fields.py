"""The field-values batch: one ``nvmlDeviceGetFieldValues`` call per GPU per cycle.

"If any of the underlying fieldIds are populated by the same driver call, the results for those
field IDs will be populated from a single call" (NVML reference, nvmlDeviceGetFieldValues), and
each entry carries its own ``nvmlReturn`` and a ``timestamp`` (µs). So every field-backed metric
of a cycle goes into one array: the per-cycle values, the ~10 s and ~60 s tiers when they are
due, the PCIe byte counters, and NVLink per link (throughput 138/139 and state 165, the link in
``scopeId``) plus the all-links totals (``scopeId = UINT_MAX``: "aggregate value summed up across
all links"). A :class:`FieldBatch` is laid out once per tier combination at probe time; the hot path
decodes the whole answer in one ``struct`` pass.

Field ids are the long-stable ones (newer ``CLOCKS_EVENT_REASON_*`` ids were renumbered between
bindings); each entry's ``nvmlReturn`` and a plausible range are checked at probe time. Units:
power fields are mW (→ W); energy is mJ; NVLink counters are KiB; PCIe counters are bytes ("PCIe
transmit bytes. Value can be wrapped."), turned into a rate over the cycle from the entries' own
timestamps; the perf-policy (throttle-time) counters 74-79 are stored as read, in the driver's
unit, which nvidia-smi prints as µs (``clocks_event_reasons_counters_*``).
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

VALUE_ATTR = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # nvmlValueType_t order
_INF = math.inf
UINT_MAX = 0xFFFFFFFF
FI_NVLINK_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, scopeId = link (UINT_MAX: all links)
FI_NVLINK_RX_KIB = 139
FI_NVLINK_STATE = 165  # NVML_FI_DEV_NVLINK_GET_STATE: NVML_NVLINK_STATE_INACTIVE 0 / ACTIVE 1 / SLEEP 2
FI_NVLINK_LINK_COUNT = 91
NVLINK_ACTIVE = 1
TIERS = ("fast", "medium", "slow")

#: (tier, field id, scope id, gpu field, scale or None, plausible (lo, hi) of the converted value)
VALUE_READS: tuple[tuple[str, int, int, str, float | None, tuple[float, float]], ...] = (
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
#: (field id, gpu field): cumulative byte counters read every cycle, written as a rate over the cycle.
RATE_READS: tuple[tuple[int, str], ...] = (
    (197, "pcie_tx_bytes_per_s"),  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    (198, "pcie_rx_bytes_per_s"),  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
)


@dataclass
class FieldBatch:
    """The layout of one field-values request: values, then rates, then links, then link totals."""

    fids: list[tuple[int, int]] = field(default_factory=list)
    values: list[tuple[str, float | None]] = field(default_factory=list)
    rates: list[str] = field(default_factory=list)
    links: list[int] = field(default_factory=list)  # 3 entries each: tx, rx, state
    link_totals: bool = False  # 2 entries: all-links tx, rx

    @classmethod
    def build(
        cls,
        values: list[tuple[int, int, str, float | None]],
        rates: list[tuple[int, str]],
        links: list[int],
        link_totals: bool,
    ) -> FieldBatch:
        b = cls(links=list(links), link_totals=link_totals)
        b.fids = [(fid, scope) for fid, scope, _, _ in values] + [(fid, 0) for fid, _ in rates]
        b.values = [(name, scale) for _, _, name, scale in values]
        b.rates = [name for _, name in rates]
        b.fids += [(fid, link) for link in links for fid in (FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB, FI_NVLINK_STATE)]
        if link_totals:
            b.fids += [(FI_NVLINK_TX_KIB, UINT_MAX), (FI_NVLINK_RX_KIB, UINT_MAX)]
        return b


def field_value(fv: Any) -> Any:
    return getattr(fv.value, VALUE_ATTR[fv.valueType])


# c_nvmlFieldValue_t: fieldId u32, scopeId u32, timestamp i64, latencyUsec i64, valueType u32,
# nvmlReturn u32, value (8-byte union). pynvml's structures override __getattribute__ (a Python call
# per attribute read), so the hot path decodes the whole array in one struct pass instead.
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


def field_results(nv: Any, values: Any) -> Iterator[tuple[int, Any, int]]:
    """(nvmlReturn, value, timestamp µs) per entry of a ``nvmlDeviceGetFieldValues`` answer."""
    if ctypes.sizeof(nv.c_nvmlFieldValue_t) == _FV.size:
        for _f, _s, ts, _l, vtype, ret, raw in _FV.iter_unpack(bytes(values)):
            yield ret, (raw if vtype == 3 else _decode(vtype, raw)) if ret == 0 else None, ts
    else:  # a binding with another layout: slow but right
        for fv in values:
            ret = fv.nvmlReturn
            yield ret, field_value(fv) if ret == 0 else None, fv.timestamp
