"""A small builder for Grafana *Classic* dashboard JSON with raw InfluxQL targets.

Classic JSON (``schemaVersion`` + ``panels`` + ``templating``) is what file provisioning loads on
Grafana 12 and 13 alike; the Grafana 13 v2 format (``apiVersion/kind/spec/elements``) is rejected
by file provisioning, so it is never produced here. Every query is raw InfluxQL (``rawQuery``), so
tests can substitute Grafana's macros and run it against a real InfluxDB.

What each record turns into follows Grafana 12.4's generated types (``@grafana/schema`` 12.4.11,
``dist/esm/raw/composable/<panel>/panelcfg/x/*_types.gen``): every panel carries the complete
``options`` its type requires, table columns the complete ``custom`` config. The test suite
type-checks the output against those types (``agent/tests/dashboards/test_grafana_types.py``).

Units are per query (time series: an override per ``refId``) and per column (tables: an override
per column name), so no number is shown in another column's unit. Panels are laid out left to
right on Grafana's 24-column grid; :meth:`Dashboard.row` starts a new row. Panel ids and ``refId``
letters are assigned in order, so output is deterministic.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from gpulse.dashboards.units import Json, ThresholdSteps, Unit
from gpulse.influx.tiers import RAW, TIER_BY_NAME

#: The provisioned InfluxQL datasources, one per tier (grafana/provisioning/datasources/influxdb.yaml).
#: On 1.x and 2.x all three read the bucket's database and the query's retention policy picks the
#: tier (``FROM "1h"."gpu"``); InfluxDB 3 drops that retention policy and reads the datasource's
#: database (``iox_v1_query_api`` ``handler.rs``), so there each one names its tier's database
#: (``gpulse``, ``gpulse/1m``, ``gpulse/1h``: grafana/provisioning-v3/datasources/influxdb.yaml).
#: A query keeps its retention policy and goes to its tier's datasource, and so reads the same tier on both.
DATASOURCE_UIDS: dict[str, str] = {RAW: "gpulse-influxql", "1m": "gpulse-influxql-1m", "1h": "gpulse-influxql-1h"}
DATASOURCE_UID = DATASOURCE_UIDS[RAW]
DATASOURCE = {"type": "influxdb", "uid": DATASOURCE_UID}
#: The built-in "Mixed" datasource of a panel whose targets name their own (their tiers differ).
MIXED = {"type": "datasource", "uid": "-- Mixed --"}
#: Grafana 12.4 loads classic dashboards of this schema version without migrating them.
SCHEMA_VERSION = 41
TAG = "gpulse"
#: Grafana's built-in variable carrying the dashboard's current time range into a link.
KEEP_TIME = "${__url_time_range}"


@dataclass(frozen=True)
class Column:
    """A numeric column of a table (its name after the panel's transformations) and its unit."""

    name: str
    unit: Unit
    thresholds: ThresholdSteps | None = None
    #: Table cell display: "color-text" or "color-background" when ``thresholds`` colour it.
    cell: str = "color-text"


@dataclass(frozen=True)
class Query:
    """One raw InfluxQL target: a time series (every value in ``unit``) or a table (``columns``)."""

    sql: str
    unit: Unit | None = None
    alias: str = ""
    table: bool = False
    #: The tier the query reads (its ``FROM`` names the same retention policy); picks the datasource.
    tier: str = RAW

    def __post_init__(self) -> None:
        if self.tier != RAW and self.tier not in TIER_BY_NAME:
            raise ValueError(f"unknown tier {self.tier!r}")

    @property
    def datasource(self) -> Json:
        return datasource(self.tier)

    def target(self, ref_id: str) -> Json:
        t: Json = {
            "refId": ref_id,
            "datasource": self.datasource,
            "query": self.sql,
            "rawQuery": True,
            "resultFormat": "table" if self.table else "time_series",
        }
        if self.alias:
            t["alias"] = self.alias
        return t


@dataclass(frozen=True)
class Link:
    """A data link to another gpulse dashboard: its uid, variables from the clicked value, the time range.

    ``variables`` are (dashboard variable, Grafana link expression) pairs, e.g.
    ``("host", "${__field.labels.host}")``; Grafana substitutes the expressions when the link opens.
    """

    title: str
    dashboard: str
    variables: tuple[tuple[str, str], ...] = ()
    keep_time: bool = True

    @property
    def url(self) -> str:
        params = [f"var-{name}={value}" for name, value in self.variables]
        if self.keep_time:
            params.append(KEEP_TIME)
        return f"/d/{self.dashboard}" + ("?" + "&".join(params) if params else "")

    def to_json(self) -> Json:
        return {"title": self.title, "url": self.url, "targetBlank": False}


def panel_url(dashboard: str, panel_id: int, **variables: str) -> str:
    """A path that opens one panel of a dashboard (Grafana 12's ``viewPanel=panel-<id>``)."""
    query = urllib.parse.urlencode({"viewPanel": f"panel-{panel_id}", **{f"var-{k}": v for k, v in variables.items()}})
    return f"/d/{dashboard}?{query}"


@dataclass
class Panel:
    """A panel before layout: its kind, texts, queries and display options.

    ``legend`` is one of ``wide`` (table below the plot with mean/max/last, for a few series),
    ``side`` (a narrow list on the right: with 64 GPUs the plot keeps its width and the list
    scrolls) or ``none``.
    """

    type: str
    title: str
    description: str
    queries: list[Query]
    unit: Unit | None = None
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: ThresholdSteps | None = None
    interval: str | None = None
    stacked: bool = False
    bars: bool = False
    steps: bool = False
    legend: str = "side"
    columns: tuple[Column, ...] = ()
    links: tuple[Link, ...] = ()
    transformations: list[Json] = field(default_factory=list)
    options: Json = field(default_factory=dict)
    custom: Json = field(default_factory=dict)
    overrides: list[Json] = field(default_factory=list)
    no_value: str | None = None
    text: str = ""

    @property
    def default_unit(self) -> Unit | None:
        return self.unit or next((q.unit for q in self.queries if q.unit is not None), None)

    def _defaults(self) -> Json:
        d: Json = {}
        unit = self.default_unit
        if unit is not None:
            d["unit"] = unit.id
            if unit.decimals is not None:
                d["decimals"] = unit.decimals
        if self.min is not None:
            d["min"] = self.min
        if self.max is not None:
            d["max"] = self.max
        if self.thresholds is not None:
            d["thresholds"] = self.thresholds.to_json()
            d["color"] = {"mode": "thresholds"} if self.type != "timeseries" else {"mode": "palette-classic"}
        elif self.type == "timeseries":
            d["color"] = {"mode": "palette-classic"}
        if self.no_value is not None:
            d["noValue"] = self.no_value
        if self.links:
            d["links"] = [link.to_json() for link in self.links]
        return d

    def _overrides(self) -> list[Json]:
        out: list[Json] = []
        unit = self.default_unit
        for i, q in enumerate(self.queries):
            if q.unit is not None and q.unit != unit:
                props: list[Json] = [{"id": "unit", "value": q.unit.id}]
                if q.unit.decimals is not None:
                    props.append({"id": "decimals", "value": q.unit.decimals})
                out.append({"matcher": {"id": "byFrameRefID", "options": ref_id(i)}, "properties": props})
        for c in self.columns:
            props = [{"id": "unit", "value": c.unit.id}]
            if c.unit.decimals is not None:
                props.append({"id": "decimals", "value": c.unit.decimals})
            if c.thresholds is not None:
                props += [
                    {"id": "thresholds", "value": c.thresholds.to_json()},
                    {"id": "color", "value": {"mode": "thresholds"}},
                    {"id": "custom.cellOptions", "value": {"type": c.cell}},
                ]
            out.append({"matcher": {"id": "byName", "options": c.name}, "properties": props})
        return out + self.overrides

    def _custom(self) -> Json | None:
        if self.type == "timeseries":
            custom: Json = {
                "drawStyle": "bars" if self.bars else "line",
                "lineInterpolation": "stepAfter" if self.steps else "linear",
                "lineWidth": 1,
                "fillOpacity": 80 if self.bars else (30 if self.stacked else 0),
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"mode": "normal" if self.stacked else "none", "group": "A"},
                "axisPlacement": "auto",
                "thresholdsStyle": {"mode": self.thresholds.style if self.thresholds else "off"},
            }
        elif self.type == "table":
            custom = {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False, "filterable": True}
        else:
            return None
        custom.update(self.custom)
        return custom

    def _options(self) -> Json:
        reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
        if self.type == "timeseries":
            if self.legend == "wide":
                legend: Json = {
                    "displayMode": "table",
                    "placement": "bottom",
                    "showLegend": True,
                    "calcs": ["mean", "max", "lastNotNull"],
                }
            elif self.legend == "side":
                legend = {"displayMode": "list", "placement": "right", "showLegend": True, "calcs": [], "width": 170}
            else:
                legend = {"displayMode": "hidden", "placement": "bottom", "showLegend": False, "calcs": []}
            options: Json = {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc", "maxHeight": 400}}
        elif self.type == "stat":
            options = {
                "reduceOptions": reduce,
                "orientation": "auto",
                "colorMode": "value" if self.thresholds else "none",
                "graphMode": "none",
                "justifyMode": "auto",
                "textMode": "auto",
                "wideLayout": True,
                "showPercentChange": False,
                "percentChangeColorMode": "standard",
            }
        elif self.type == "table":
            options = {"showHeader": True, "cellHeight": "sm", "frameIndex": 0}
        elif self.type == "bargauge":
            options = {
                "reduceOptions": reduce,
                "orientation": "horizontal",
                "displayMode": "basic",
                "valueMode": "color",
                "namePlacement": "auto",
                "showUnfilled": True,
                "sizing": "auto",
                "minVizHeight": 16,
                "minVizWidth": 8,
                "maxVizHeight": 300,
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False, "calcs": []},
            }
        elif self.type == "text":
            options = {"mode": "markdown", "content": self.text}
        else:
            raise ValueError(f"unsupported panel type {self.type!r}")
        options.update(self.options)
        return options

    def to_json(self, panel_id: int, x: int, y: int) -> Json:
        defaults = self._defaults()
        custom = self._custom()
        if custom is not None:
            defaults["custom"] = custom
        panel: Json = {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "fieldConfig": {"defaults": defaults, "overrides": self._overrides()},
            "options": self._options(),
        }
        if self.queries:
            sources = {q.tier for q in self.queries}
            panel["datasource"] = self.queries[0].datasource if len(sources) == 1 else dict(MIXED)
            panel["targets"] = [q.target(ref_id(i)) for i, q in enumerate(self.queries)]
        if self.interval:
            panel["interval"] = self.interval
        if self.transformations:
            panel["transformations"] = self.transformations
        return panel


def datasource(tier: str) -> Json:
    """The reference to the datasource of a tier."""
    return {"type": "influxdb", "uid": DATASOURCE_UIDS[tier]}


def ref_id(index: int) -> str:
    return chr(ord("A") + index)


def organize(
    *,
    only: str | None = None,
    exclude: tuple[str, ...] = (),
    order: tuple[str, ...] = (),
    rename: dict[str, str] | None = None,
) -> Json:
    """Grafana's ``organize`` transformation; ``only`` applies it to one query's frames (by refId).

    Tables joined from several queries each bring a ``Time`` field whose display names collide
    after the join, so each query's ``Time`` is renamed or dropped before joining.
    """
    t: Json = {
        "id": "organize",
        "options": {
            "excludeByName": dict.fromkeys(exclude, True),
            "indexByName": {name: i for i, name in enumerate(order)},
            "renameByName": rename or {},
        },
    }
    if only is not None:
        t["filter"] = {"id": "byRefId", "options": only}
    return t


def join(field: str) -> Json:
    """Grafana's ``joinByField`` (outer): one table row per value of ``field`` across the queries."""
    return {"id": "joinByField", "options": {"byField": field, "mode": "outer"}}


@dataclass(frozen=True)
class Variable:
    """A query variable, refreshed on time-range change.

    ``multi`` allows several values; ``include_all`` adds "All" (and makes it the default).
    ``sort`` is Grafana's option: 1 alphabetical, 3 numerical, 0 the query's own order (used to
    put the latest run first). ``all_value`` is what "All" stands for in a query (Grafana's
    ``allValue``, inserted as is): ``.*`` in ``=~ /^$v$/`` also matches series without the tag,
    which the default (every listed value, as ``(a|b)``) leaves out.
    """

    name: str
    label: str
    query: str
    multi: bool = True
    include_all: bool = True
    sort: int = 1
    tier: str = RAW
    all_value: str | None = None

    def to_json(self) -> Json:
        extra: Json = {"allValue": self.all_value} if self.all_value is not None else {}
        return {
            "name": self.name,
            "label": self.label,
            "type": "query",
            "datasource": datasource(self.tier),
            "query": self.query,
            "refresh": 2,
            "multi": self.multi,
            "includeAll": self.include_all,
            "options": [],
            "regex": "",
            "sort": self.sort,
            "hide": 0,
            **extra,
        }


def any_job(query: str, tier: str = RAW) -> Variable:
    """``$job``: the jobs ``query`` lists; "All" (the default) also matches points no job holds."""
    return Variable("job", "Job", query, tier=tier, all_value=".*")


@dataclass(frozen=True)
class Setting:
    """A hidden text variable: a setting queries use (``$name``), changed with ``var-<name>=`` in the URL."""

    name: str
    label: str
    default: str

    def to_json(self) -> Json:
        current = {"text": self.default, "value": self.default}
        return {
            "name": self.name,
            "label": self.label,
            "type": "textbox",
            "query": self.default,
            "current": current,
            "options": [{**current, "selected": True}],
            "hide": 2,
        }


@dataclass(frozen=True)
class Annotation:
    """An InfluxQL annotation in Grafana 12's current form: the query and its columns in ``target``.

    Grafana's InfluxDB ``prepareAnnotation`` (public/app/plugins/datasource/influxdb/migrations.ts)
    rebuilds the old top-level ``query``/``*Column`` layout only when a ``target`` already exists,
    and its ``_query`` runs an annotation only for a target with ``fromAnnotations`` and a ``query``;
    so the target carries everything and ``queryType`` is what that migration writes (``tags``).
    """

    name: str
    query: str
    text: str
    tags: str
    color: str
    title: str = ""
    time_end: str = ""

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "datasource": dict(DATASOURCE),
            "enable": True,
            "hide": False,
            "iconColor": self.color,
            "target": {
                "refId": "Anno",
                "query": self.query,
                "rawQuery": True,
                "fromAnnotations": True,
                "queryType": "tags",
                "textColumn": self.text,
                "tagsColumn": self.tags,
                "titleColumn": self.title,
                "timeEndColumn": self.time_end,
            },
        }


BUILTIN_ANNOTATION: Json = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}


class Dashboard:
    """Collects variables, annotations and panels, then renders Classic dashboard JSON.

    ``timezone`` is the dashboard's: ``browser`` for live views, ``utc`` where queries group by
    calendar day (InfluxQL's ``time(1d)`` buckets are UTC days, so the axis must be UTC too).
    """

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
        timezone: str = "browser",
    ) -> None:
        self.uid = uid
        self.title = title
        #: Grafana folder (a directory under grafana/dashboards/) and the file name inside it.
        self.folder = folder
        self.slug = slug
        self.description = description
        self.time_from = time_from
        self.refresh = refresh
        self.timezone = timezone
        self.variables: list[Variable | Setting] = []
        self.annotations: list[Annotation] = []
        self.rows: list[tuple[str, list[Panel]]] = []

    @property
    def path(self) -> str:
        return f"{self.folder}/{self.slug}.json"

    def variable(self, var: Variable | Setting) -> None:
        self.variables.append(var)

    def annotation(self, ann: Annotation) -> None:
        self.annotations.append(ann)

    def row(self, title: str, *panels: Panel) -> None:
        self.rows.append((title, list(panels)))

    def panels(self) -> list[Panel]:
        return [p for _, ps in self.rows for p in ps]

    def layout(self) -> list[tuple[int, int, int, Panel | str]]:
        """(id, x, y, panel or row title) in order: rows are full width, panels wrap at 24 columns."""
        out: list[tuple[int, int, int, Panel | str]] = []
        next_id, y = 1, 0
        for title, panels in self.rows:
            out.append((next_id, 0, y, title))
            next_id, y = next_id + 1, y + 1
            x, row_h = 0, 0
            for p in panels:
                if x + p.width > 24:
                    x, y, row_h = 0, y + row_h, 0
                out.append((next_id, x, y, p))
                next_id += 1
                x += p.width
                row_h = max(row_h, p.height)
            y += row_h
        return out

    def panel_id(self, title: str) -> int:
        """The id Grafana will know a panel by (alerts link to it)."""
        for pid, _, _, p in self.layout():
            if isinstance(p, Panel) and p.title == title:
                return pid
        raise KeyError(f"{self.title} has no panel {title!r}")

    def to_json(self) -> Json:
        out_panels: list[Json] = []
        for pid, x, y, p in self.layout():
            if isinstance(p, str):
                out_panels.append(
                    {
                        "id": pid,
                        "type": "row",
                        "title": p,
                        "collapsed": False,
                        "panels": [],
                        "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    }
                )
            else:
                out_panels.append(p.to_json(pid, x, y))
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
            "timezone": self.timezone,
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "refresh": self.refresh,
            "links": [
                {
                    "type": "dashboards",
                    "tags": [TAG],
                    "asDropdown": True,
                    "title": "gpulse",
                    "icon": "external link",
                    "tooltip": "the other gpulse dashboards",
                    "keepTime": True,
                    "includeVars": False,
                    "targetBlank": False,
                }
            ],
            "templating": {"list": [v.to_json() for v in self.variables]},
            "annotations": {"list": [dict(BUILTIN_ANNOTATION), *(a.to_json() for a in self.annotations)]},
            "panels": out_panels,
        }


def timeseries(title: str, description: str, *queries: Query, **kw: Any) -> Panel:
    return Panel("timeseries", title, description, list(queries), **kw)


def stat(title: str, description: str, *queries: Query, **kw: Any) -> Panel:
    kw.setdefault("width", 3)
    kw.setdefault("height", 4)
    return Panel("stat", title, description, list(queries), **kw)


def table(title: str, description: str, *queries: Query, **kw: Any) -> Panel:
    kw.setdefault("width", 24)
    return Panel("table", title, description, list(queries), **kw)


def bargauge(title: str, description: str, *queries: Query, **kw: Any) -> Panel:
    return Panel("bargauge", title, description, list(queries), **kw)


def text(title: str, description: str, content: str, **kw: Any) -> Panel:
    return Panel("text", title, description, [], text=content, **kw)
