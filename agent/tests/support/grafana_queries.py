"""Run a dashboard's queries as Grafana would send them, against a real InfluxDB 1.x.

No Grafana server exists here: :func:`gpulse.dashboards.influxql.interpolate` reproduces its macro
and variable substitution, and :func:`grafana_interval` its ``$__interval`` (range / max data
points, rounded to Grafana's steps, never below the panel's or datasource's minimum). Shared by the
dashboard tests and the demo tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpulse.dashboards.influxql import Variable, interpolate

MAX_DATA_POINTS = 1000
_ROUND = [(1.5, 1), (3.5, 2), (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (210, 120), (450, 300)]
_ROUND += [(750, 600), (1050, 900), (1500, 1200), (2700, 1800), (5400, 3600), (9000, 7200), (16200, 10800)]


def grafana_interval(range_s: float, min_interval: str | None) -> str:
    """``$__interval``: range / max data points, rounded like Grafana, never below the min interval."""
    raw = range_s / MAX_DATA_POINTS
    nice = next((v for limit, v in _ROUND if raw < limit), 21600)
    low = seconds(min_interval or "1s")  # the datasource's timeInterval
    return _fmt(max(nice, low))


def seconds(d: str) -> int:
    m = re.fullmatch(r"(\d+)([smhd])", d)
    assert m, d
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _fmt(s: int) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s % n == 0:
            return f"{s // n}{unit}"
    return f"{s}s"


def range_seconds(time_from: str) -> int:
    return seconds(time_from.removeprefix("now-"))


def data_rows(influx: Any, query: str) -> int:
    """Rows with at least one non-null value besides time and tags."""
    n = 0
    for res in influx.query(query, db="gpulse").get("results", []):
        for s in res.get("series", []) or []:
            cols = s["columns"]
            for values in s["values"]:
                if any(v is not None for c, v in zip(cols, values, strict=True) if c != "time"):
                    n += 1
    return n


def resolve_variables(
    influx: Any, dash: dict[str, Any], time_from: str, picks: Mapping[str, str]
) -> dict[str, Variable]:
    """Run each variable's query in order, selecting All, or the value ``picks`` names for it."""
    resolved: dict[str, Variable] = {}
    for v in dash["templating"]["list"]:
        q = interpolate(v["query"], resolved, time_from=time_from)
        values = sorted({row["value"] for row in influx.rows(q)})
        assert values, f"{dash['title']}: variable ${v['name']} has no values: {q}"
        pick = picks.get(v["name"])
        if pick is not None:
            assert pick in values, f"{dash['title']}: ${v['name']} does not offer {pick}: {values}"
            values = [pick]
        resolved[v["name"]] = Variable(tuple(values), multi=v["multi"] or v["includeAll"])
    return resolved


def panel_rows(influx: Any, dash: dict[str, Any], time_from: str, picks: Mapping[str, str]) -> dict[str, int]:
    """Data rows per panel title (and ``annotation: name``) over ``now-<range>``, with ``picks`` chosen."""
    variables = resolve_variables(influx, dash, time_from, picks)
    counts: dict[str, int] = {}
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        interval = grafana_interval(range_seconds(time_from), p.get("interval"))
        counts[p["title"]] = sum(
            data_rows(influx, interpolate(t["query"], variables, time_from=time_from, interval=interval))
            for t in p["targets"]
        )
    for a in dash["annotations"]["list"]:
        if "query" in a:
            counts[f"annotation: {a['name']}"] = data_rows(
                influx, interpolate(a["query"], variables, time_from=time_from)
            )
    return counts
