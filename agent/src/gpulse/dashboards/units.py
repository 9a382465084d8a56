"""Units, colours and thresholds: what a number on a dashboard means and when it is bad.

A :class:`Unit` pairs a Grafana unit id (one that ``@grafana/data``'s value formats know) with the
quantity it displays. The quantity is what the tests hold the unit to: Grafana's own formatter must
render a sample of that quantity as the same amount of the same thing (a pid as its digits, bytes in
B/KiB/MiB, 1980 MHz as MHz or GHz, GPU-hours as GPU-hours and never as weeks). ``SCHEMA_UNITS`` ties
quantities to the units of :mod:`gpulse.schema`, so a panel that shows a field as it is stored must
use a unit of that field's quantity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]


@dataclass(frozen=True)
class Unit:
    """A Grafana unit id, the quantity it shows, and how many decimals (``None``: Grafana's choice)."""

    id: str
    quantity: str
    decimals: int | None = None


PERCENT = Unit("percent", "percent", 1)  # 0..100
RATIO = Unit("percentunit", "ratio", 1)  # 0..1, shown as %
BYTES = Unit("bytes", "bytes")  # IEC: KiB, MiB, GiB
BYTES_PER_S = Unit("Bps", "bytes/s")  # SI: kB/s, MB/s, GB/s
MHZ = Unit("rotmhz", "MHz")
WATT = Unit("watt", "W")
CELSIUS = Unit("celsius", "°C", 0)
SECONDS = Unit("s", "s")
MILLISECONDS = Unit("ms", "ms")
JOULE = Unit("joule", "J")
KWH = Unit("kwatth", "kWh")
GPU_HOURS = Unit("suffix:GPU-h", "GPU-h", 1)
#: Counts of things (errors, GPUs, skipped cycles): the digits, no K/M scaling.
COUNT = Unit("none", "count", 0)
#: Identifiers shown as numbers (pid, step, GPU index): the digits exactly.
ID = Unit("none", "id", 0)
PSTATE = Unit("prefix:P", "P-state", 0)
PCIE_GEN = Unit("prefix:Gen ", "gen", 0)
PCIE_LANES = Unit("prefix:x", "lanes", 0)
TFLOPS = Unit("tflops", "TFLOP/s", 1)
SAMPLES_PER_S = Unit("suffix:samples/s", "samples/s", 1)
#: Tokens/s run to millions: SI-scaled (k, M).
TOKENS_PER_S = Unit("si:tokens/s", "tokens/s")
LINES_PER_S = Unit("suffix:lines/s", "lines/s", 1)
RECORDS_PER_S = Unit("suffix:records/s", "records/s", 1)
#: A timestamp (epoch ms) shown as "2 minutes ago".
TIME_AGO = Unit("dateTimeFromNow", "timestamp")
#: A value without a physical unit (loss).
PLAIN = Unit("none", "plain", 3)

#: gpulse.schema unit -> the quantities a plain aggregate of such a field may be shown as.
SCHEMA_UNITS: dict[str, tuple[str, ...]] = {
    "%": ("percent",),
    "B": ("bytes",),
    "B/s": ("bytes/s",),
    "MHz": ("MHz",),
    "W": ("W",),
    "°C": ("°C",),
    "s": ("s",),
    "ms": ("ms",),
    "ratio": ("ratio",),
    "count": ("count",),
    "": ("id",),
    "gen": ("gen",),
    "lanes": ("lanes",),
    "P-state": ("P-state",),
    "TFLOP/s": ("TFLOP/s",),
    "1/s": ("samples/s", "tokens/s"),
    "0/1": ("count",),
}

# Grafana's named palette colours (the theme resolves them).
GREEN, YELLOW, ORANGE, RED, BLUE, TEXT = "green", "yellow", "orange", "red", "blue", "text"


@dataclass(frozen=True)
class ThresholdSteps:
    """Absolute threshold steps: ``base`` below the first step, then each (value, colour) upwards.

    ``style`` is how a time series draws them (Grafana's ``thresholdsStyle.mode``): ``off``,
    ``dashed``, ``line+area``, ...; stats and table cells colour their value by them.
    """

    base: str
    steps: tuple[tuple[float, str], ...] = ()
    style: str = "dashed"

    def to_json(self) -> Json:
        return {
            "mode": "absolute",
            "steps": [{"color": self.base, "value": None}, *({"color": c, "value": v} for v, c in self.steps)],
        }


def rising(warn: float, bad: float, *, style: str = "dashed") -> ThresholdSteps:
    """Higher is worse: green, yellow from ``warn``, red from ``bad``."""
    return ThresholdSteps(GREEN, ((warn, YELLOW), (bad, RED)), style)


def falling(bad: float, warn: float, *, style: str = "dashed") -> ThresholdSteps:
    """Lower is worse: red below ``bad``, yellow below ``warn``, green above."""
    return ThresholdSteps(RED, ((bad, YELLOW), (warn, GREEN)), style)


def any_is_bad(*, style: str = "off") -> ThresholdSteps:
    """A count where anything above zero deserves a look (uncorrected ECC errors, XIDs, lost GPUs)."""
    return ThresholdSteps(GREEN, ((1, RED),), style)


def none_is_bad() -> ThresholdSteps:
    """A count where zero is the alarm (reports from an agent in the last minutes)."""
    return ThresholdSteps(RED, ((1, GREEN),), "off")


#: GPU die temperature: most data-centre GPUs slow down in the high 80s (Telegraf's board uses 65/85).
TEMPERATURE = rising(75, 85)
#: Memory / power used as a share of what there is.
SHARE_OF_LIMIT = rising(80, 95)
#: Share of time the clocks were held back.
THROTTLED = rising(5, 20)
