"""Run a dashboard's queries as Grafana would send them, against a real InfluxDB 1.x.

No Grafana server exists here: :func:`support.grafana_interpolate.interpolate` reproduces its macro
and variable substitution, and :func:`grafana_interval` its ``$__interval`` (range / max data
points, rounded to Grafana's steps, never below the panel's or datasource's minimum: ``rangeutil.ts``
``calculateInterval`` and ``roundInterval`` of ``@grafana/data`` 12.4.10, the table below in seconds).
Where it differs: Grafana's max data points is the panel's width in pixels (a query option), here a
fixed 1,000; below 1 s Grafana rounds to ms steps, which the datasource's 1 s minimum makes moot. Variables
resolve the way Grafana 12.4's InfluxDB datasource resolves them (``datasource.ts``
``toMetricFindValue``: the first string field of each frame, in row order, duplicates dropped),
sorted by the variable's ``sort`` option, defaulting to the first option unless "All" is offered.
A ``textbox`` variable (a hidden setting) takes its default or the value ``picks`` gives it, as
``var-<name>=`` in a dashboard URL does. Annotations run their ``target.query`` (the current form; see :class:`gpulse.dashboards.builder.Annotation`).
Shared by the dashboard tests and the demo tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from support.grafana_interpolate import Selection, interpolate

MAX_DATA_POINTS = 1000
_ROUND = [(1.5, 1), (3.5, 2), (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (210, 120), (450, 300)]
_ROUND += [(750, 600), (1050, 900), (1500, 1200), (2700, 1800), (5400, 3600), (9000, 7200), (16200, 10800)]
_ROUND += [(32400, 21600), (86400, 43200), (604800, 86400), (1814400, 604800), (3628800, 2592000)]


def grafana_interval(range_s: float, min_interval: str | None) -> str:
    """``$__interval``: range / max data points, rounded like Grafana, never below the min interval."""
    raw = range_s / MAX_DATA_POINTS
    nice = next((v for limit, v in _ROUND if raw < limit), 31536000)
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


def variable_values(influx: Any, query: str) -> list[str]:
    """A variable query's options in the order Grafana's InfluxDB datasource builds them.

    SHOW TAG VALUES frames carry the ``value`` column; a SELECT yields one frame per column, and
    each contributes its first string field (a numeric column would add its numbers, so gpulse's
    variable queries select exactly one string column).
    """
    out: dict[str, None] = {}
    for res in influx.query(query, db="gpulse").get("results", []):
        for s in res.get("series", []) or []:
            cols = s["columns"]
            if cols == ["key", "value"]:
                columns = [1]
            else:
                columns = [i for i, c in enumerate(cols) if c != "time"]
            for i in columns:
                for values in s["values"]:
                    if values[i] is not None:
                        out.setdefault(str(values[i]), None)
    return list(out)


def _sorted(values: list[str], sort: int) -> list[str]:
    """Grafana's variable ``sort``: 0 keeps the query's order, 1/2 alphabetical, 3/4 numerical."""
    if sort == 0:
        return values
    if sort in (3, 4):
        key: Any = lambda v: int(m.group(0)) if (m := re.search(r"\d+", v)) else -1  # noqa: E731
    else:
        key = str
    return sorted(values, key=key, reverse=sort in (2, 4))


def resolve_variables(
    influx: Any, dash: dict[str, Any], time_from: str, picks: Mapping[str, str]
) -> dict[str, Selection]:
    """Run each variable's query in order; select the value ``picks`` names, else what Grafana selects
    by default (All where offered, else the first option).

    A variable with a custom ``allValue`` may list nothing: Grafana still offers "All" (the query
    variable's options start with it whenever ``includeAll`` is set), and "All" stands for that value."""
    resolved: dict[str, Selection] = {}
    for v in dash["templating"]["list"]:
        if v["type"] == "textbox":  # a setting: its default, or the value a URL's var-<name>= gives
            resolved[v["name"]] = Selection((picks.get(v["name"], v["query"]),), multi=False)
            continue
        q = interpolate(v["query"], resolved, time_from=time_from)
        values = _sorted(variable_values(influx, q), v.get("sort", 0))
        pick = picks.get(v["name"])
        every = pick is None and bool(v["includeAll"])  # "All" is selected
        all_value = (v.get("allValue") or None) if every else None  # an empty allValue is none (scenes)
        if not values and all_value is not None:
            resolved[v["name"]] = Selection((), all_value=all_value)
            continue
        assert values, f"{dash['title']}: variable ${v['name']} has no values: {q}"
        if pick is not None:
            assert pick in values, f"{dash['title']}: ${v['name']} does not offer {pick}: {values}"
            values = [pick]
        elif not v["includeAll"]:
            values = values[:1]
        resolved[v["name"]] = Selection(tuple(values), multi=bool(v["multi"]), all_value=all_value, all=every)
    return resolved


def panel_queries(dash: dict[str, Any], variables: Mapping[str, Selection], time_from: str) -> list[tuple[Any, ...]]:
    """(panel, target, query as Grafana sends it) for every target of every panel."""
    out = []
    for p in dash["panels"]:
        interval = grafana_interval(range_seconds(time_from), p.get("interval"))
        for t in p.get("targets", []):
            out.append((p, t, interpolate(t["query"], variables, time_from=time_from, interval=interval)))
    return out


def annotation_queries(
    dash: dict[str, Any], variables: Mapping[str, Selection], time_from: str
) -> list[tuple[str, str]]:
    return [
        (a["name"], interpolate(a["target"]["query"], variables, time_from=time_from))
        for a in dash["annotations"]["list"]
        if "target" in a and a["target"].get("fromAnnotations")
    ]


def panel_rows(influx: Any, dash: dict[str, Any], time_from: str, picks: Mapping[str, str]) -> dict[str, int]:
    """Data rows per panel title (and ``annotation: name``) over ``now-<range>``, with ``picks`` chosen.

    Panels without queries (text) are left out."""
    variables = resolve_variables(influx, dash, time_from, picks)
    counts: dict[str, int] = {}
    for p, _t, q in panel_queries(dash, variables, time_from):
        counts[p["title"]] = counts.get(p["title"], 0) + data_rows(influx, q)
    for name, q in annotation_queries(dash, variables, time_from):
        counts[f"annotation: {name}"] = data_rows(influx, q)
    return counts
