"""A small builder for Grafana *Classic* dashboard JSON with raw InfluxQL targets.

Classic JSON (``schemaVersion`` + ``panels`` + ``templating``) is what file provisioning loads on
Grafana 12 and 13 alike; the Grafana 13 v2 format (``apiVersion/kind/spec/elements``) is rejected
by file provisioning, so it is never produced here. Every query is raw InfluxQL (``rawQuery``), so
tests can substitute Grafana's macros and run it against a real InfluxDB.

Panels are laid out left to right on Grafana's 24-column grid; :meth:`Dashboard.row` starts a new
row. Panel ids and ``refId`` letters are assigned in order, so output is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The provisioned InfluxQL datasource (grafana/provisioning/datasources/influxdb.yaml).
DATASOURCE_UID = "gpulse-influxql"
DATASOURCE = {"type": "influxdb", "uid": DATASOURCE_UID}
#: Grafana 12.4 writes schemaVersion 41 for classic dashboards.
SCHEMA_VERSION = 41
TAG = "gpulse"

Json = dict[str, Any]


@dataclass(frozen=True)
class Query:
    """One raw InfluxQL target. ``table`` queries return rows, not time series (no ``$timeFilter`` needed)."""

    sql: str
    alias: str = ""
    table: bool = False

    def target(self, ref_id: str) -> Json:
        t: Json = {
            "refId": ref_id,
            "datasource": dict(DATASOURCE),
            "query": self.sql,
            "rawQuery": True,
            "resultFormat": "table" if self.table else "time_series",
        }
        if self.alias:
            t["alias"] = self.alias
        return t


@dataclass
class Panel:
    """A panel before layout: its kind, texts, queries and display options."""

    type: str
    title: str
    description: str
    queries: list[Query]
    unit: str = "short"
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    min_interval: str | None = None
    stacked: bool = False
    bars: bool = False
    custom: Json = field(default_factory=dict)
    options: Json = field(default_factory=dict)
    overrides: list[Json] = field(default_factory=list)
    transformations: list[Json] = field(default_factory=list)

    def to_json(self, panel_id: int, x: int, y: int) -> Json:
        defaults: Json = {"unit": self.unit}
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        if self.decimals is not None:
            defaults["decimals"] = self.decimals
        if self.type == "timeseries":
            custom: Json = {
                "drawStyle": "bars" if self.bars else "line",
                "lineWidth": 1,
                "fillOpacity": 80 if self.bars else (30 if self.stacked else 10),
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"mode": "normal" if self.stacked else "none", "group": "A"},
            }
            custom.update(self.custom)
            defaults["custom"] = custom
            options: Json = {
                "legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max", "lastNotNull"]},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        elif self.type == "stat":
            defaults["color"] = {"mode": "thresholds"}
            defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
            options = {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "none",
                "textMode": "auto",
            }
        elif self.type == "table":
            options = {"showHeader": True, "cellHeight": "sm"}
        else:  # bargauge
            options = {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "orientation": "horizontal",
                "displayMode": "basic",
            }
        options.update(self.options)
        panel: Json = {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "datasource": dict(DATASOURCE),
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "fieldConfig": {"defaults": defaults, "overrides": self.overrides},
            "options": options,
            "targets": [q.target(chr(ord("A") + i)) for i, q in enumerate(self.queries)],
        }
        if self.min_interval:
            panel["interval"] = self.min_interval
        if self.transformations:
            panel["transformations"] = self.transformations
        return panel


class Dashboard:
    """Collects variables, annotations and panels, then renders Classic dashboard JSON."""

    def __init__(
        self,
        uid: str,
        title: str,
        folder: str,
        slug: str,
        description: str,
        *,
        time_from: str = "now-6h",
        refresh: str = "30s",
    ) -> None:
        self.uid = uid
        self.title = title
        #: Grafana folder (a directory under grafana/dashboards/) and the file name inside it.
        self.folder = folder
        self.slug = slug
        self.description = description
        self.time_from = time_from
        self.refresh = refresh
        self.variables: list[Json] = []
        self.annotations: list[Json] = []
        self.rows: list[tuple[str, list[Panel]]] = []

    @property
    def path(self) -> str:
        return f"{self.folder}/{self.slug}.json"

    def variable(self, name: str, label: str, query: str, *, multi: bool = True, numeric_sort: bool = False) -> None:
        """A query variable, refreshed on time-range change; multi-value with All unless ``multi`` is off."""
        self.variables.append(
            {
                "name": name,
                "label": label,
                "type": "query",
                "datasource": dict(DATASOURCE),
                "query": query,
                "definition": query,
                "refresh": 2,
                "multi": multi,
                "includeAll": multi,
                "current": {},
                "options": [],
                "regex": "",
                "sort": 3 if numeric_sort else 1,
                "hide": 0,
            }
        )

    def annotation(self, name: str, query: str, *, text: str, tags: str, color: str) -> None:
        """InfluxQL annotations: each returned row is a marker; ``text``/``tags`` name its columns."""
        self.annotations.append(
            {
                "name": name,
                "datasource": dict(DATASOURCE),
                "enable": True,
                "hide": False,
                "iconColor": color,
                "query": query,
                "textColumn": text,
                "tagsColumn": tags,
                "titleColumn": "",
            }
        )

    def row(self, title: str, *panels: Panel) -> None:
        self.rows.append((title, list(panels)))

    def panels(self) -> list[Panel]:
        return [p for _, ps in self.rows for p in ps]

    def to_json(self) -> Json:
        out_panels: list[Json] = []
        next_id = 1
        y = 0
        for title, panels in self.rows:
            out_panels.append(
                {
                    "id": next_id,
                    "type": "row",
                    "title": title,
                    "collapsed": False,
                    "panels": [],
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                }
            )
            next_id += 1
            y += 1
            x, row_h = 0, 0
            for p in panels:
                if x + p.width > 24:
                    x, y, row_h = 0, y + row_h, 0
                out_panels.append(p.to_json(next_id, x, y))
                next_id += 1
                x += p.width
                row_h = max(row_h, p.height)
            y += row_h
        builtin = {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": [TAG],
            "editable": False,
            "graphTooltip": 1,
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "timezone": "browser",
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "refresh": self.refresh,
            "links": [
                {
                    "type": "dashboards",
                    "tags": [TAG],
                    "asDropdown": True,
                    "title": "gpulse",
                    "keepTime": True,
                    "includeVars": False,
                }
            ],
            "templating": {"list": self.variables},
            "annotations": {"list": [builtin, *self.annotations]},
            "panels": out_panels,
        }


def timeseries(title: str, description: str, *queries: Query, unit: str = "short", **kw: Any) -> Panel:
    return Panel("timeseries", title, description, list(queries), unit=unit, **kw)


def stat(title: str, description: str, *queries: Query, unit: str = "short", **kw: Any) -> Panel:
    kw.setdefault("width", 6)
    kw.setdefault("height", 4)
    return Panel("stat", title, description, list(queries), unit=unit, **kw)


def table(title: str, description: str, *queries: Query, unit: str = "short", **kw: Any) -> Panel:
    kw.setdefault("width", 24)
    return Panel("table", title, description, list(queries), unit=unit, **kw)


def bargauge(title: str, description: str, *queries: Query, unit: str = "short", **kw: Any) -> Panel:
    return Panel("bargauge", title, description, list(queries), unit=unit, **kw)
