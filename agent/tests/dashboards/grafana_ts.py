"""Grafana's own code as a test oracle: the TypeScript type check, the unit formatter, the transformers.

Grafana cannot run here, so its npm packages at the image's version stand in for it (installed in
``tests/grafana-types`` by ``npm ci``, the way ``tests/flux`` is):

* :func:`dashboard_ts` writes one ``.ts`` file per dashboard in which every link, variable,
  annotation, panel, panel ``options``, ``fieldConfig.defaults.custom``, override value, data
  link, transformation and target is its own object literal, typed by Grafana's generated types
  (``@grafana/schema``'s ``dist/esm/raw/composable/<panel>/panelcfg/x/*_types.gen``, the
  dashboard types, ``@grafana/data``'s transformer and data-link types, the vendored InfluxDB
  query type). An object literal is checked for excess properties and each enum value, so a
  misspelled option or enum fails ``tsc --strict --noEmit``; importing the JSON whole would not
  (its strings widen to ``string``).
* :func:`grafana` runs ``tests/grafana-types/grafana.cjs``: Grafana's ``getValueFormat``,
  ``getValueFormats``, field matchers and standard transformers, under node.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.fixtures import REPO

HARNESS = REPO / "tests" / "grafana-types"
SCHEMA = "@grafana/schema/dist/esm/raw/composable/{0}/panelcfg/x/{1}PanelCfg_types.gen"
#: panel type -> (module folder, type-file prefix, whether it exports a FieldConfig (custom) type)
PANELS = {
    "timeseries": ("timeseries", "TimeSeries", True),
    "stat": ("stat", "Stat", False),
    "table": ("table", "Table", True),
    "bargauge": ("bargauge", "BarGauge", False),
    "text": ("text", "Text", False),
}
#: The npm versions the harness pins: the grafana/grafana image's version (docker-compose.yml), which
#: Grafana publishes as @grafana/schema and @grafana/data with each release.
SCHEMA_VERSION = "13.2.3"
DATA_VERSION = "13.2.3"


class Ref:
    """A reference to another generated constant inside a literal."""

    def __init__(self, name: str) -> None:
        self.name = name


def literal(value: Any, indent: int = 0) -> str:
    """A TypeScript object literal for JSON data, with :class:`Ref` as bare identifiers."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {literal(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(inner + literal(v, indent + 1) for v in value) + f"\n{pad}]"
    return json.dumps(value, ensure_ascii=False)


class _Module:
    def __init__(self) -> None:
        self.consts: list[str] = []

    def const(self, name: str, type_: str, value: Any) -> Ref:
        self.consts.append(f"export const {name}: {type_} = {literal(value)};\n")
        return Ref(name)


def _override_type(prop_id: str, panel_type: str) -> str:
    module, _, has_custom = PANELS[panel_type]
    if prop_id == "links":
        return "Link[]"
    if prop_id.startswith("custom."):
        if not has_custom:
            return "never"
        return f"Lit<NonNullable<{module}.FieldConfig[{json.dumps(prop_id.removeprefix('custom.'))}]>>"
    return f"Lit<NonNullable<schema.FieldConfig[{json.dumps(prop_id)}]>>"


def _panel(m: _Module, p: dict[str, Any]) -> Ref:
    pid = p.get("id", "x")
    if p.get("type") == "row":
        return m.const(f"row_{pid}", "Lit<schema.RowPanel>", p)
    if p.get("type") not in PANELS:
        raise ValueError(f"no generated Grafana types for panel type {p.get('type')!r} (panel {p.get('title')!r})")
    module, _, has_custom = PANELS[p["type"]]
    name = f"panel_{pid}"
    p = copy.deepcopy(p)
    if "options" in p:
        p["options"] = m.const(f"{name}_options", f"Lit<{module}.Options>", p["options"])
    fc = p.get("fieldConfig")
    if fc is not None:
        defaults = fc.get("defaults", {})
        if "custom" in defaults:
            custom_type = f"Lit<{module}.FieldConfig>" if has_custom else "Record<string, never>"
            defaults["custom"] = m.const(f"{name}_custom", custom_type, defaults["custom"])
        if "links" in defaults:
            defaults["links"] = [m.const(f"{name}_link_{i}", "Link", link) for i, link in enumerate(defaults["links"])]
        for oi, o in enumerate(fc.get("overrides", [])):
            o["matcher"] = m.const(f"{name}_override_{oi}_matcher", "Matcher", o["matcher"])
            for pi, prop in enumerate(o.get("properties", [])):
                if "value" in prop:
                    prop["value"] = m.const(
                        f"{name}_override_{oi}_{pi}", _override_type(prop["id"], p["type"]), prop["value"]
                    )
    if "targets" in p:
        p["targets"] = [
            m.const(f"{name}_target_{t.get('refId', i)}", "InfluxTarget", t) for i, t in enumerate(p["targets"])
        ]
    if "transformations" in p:
        p["transformations"] = [
            m.const(f"{name}_transformation_{i}", "Transformation", t) for i, t in enumerate(p["transformations"])
        ]
    custom = f"{module}.FieldConfig" if has_custom else "Record<string, never>"
    return m.const(name, f"Lit<schema.Panel<{module}.Options, {custom}>>", p)


def dashboard_ts(dash: dict[str, Any], source: str) -> str:
    """The ``.ts`` file that type-checks ``dash`` (generated from ``source``)."""
    m = _Module()
    d = copy.deepcopy(dash)
    d["links"] = [m.const(f"link_{i}", "Lit<schema.DashboardLink>", link) for i, link in enumerate(d.get("links", []))]
    templating = d.get("templating", {})
    templating["list"] = [
        m.const(f"variable_{v.get('name', i)}", "Lit<schema.VariableModel>", v)
        for i, v in enumerate(templating.get("list", []))
    ]
    annotations = d.get("annotations", {})
    typed = []
    for i, a in enumerate(annotations.get("list", [])):
        if (a.get("datasource") or {}).get("type") == "influxdb":
            a = dict(a)
            if "target" in a:
                a["target"] = m.const(f"annotation_{i}_target", "InfluxTarget", a["target"])
            typed.append(m.const(f"annotation_{i}", "InfluxAnnotation", a))
        else:
            typed.append(m.const(f"annotation_{i}", "Lit<schema.AnnotationQuery>", a))
    annotations["list"] = typed
    d["panels"] = [_panel(m, p) for p in d.get("panels", [])]
    m.const("dashboard", "Lit<schema.Dashboard>", d)
    imports = [
        f"// Generated by agent/tests/dashboards/grafana_ts.py from {source}; checked with tsc --strict --noEmit.",
        "import type * as schema from '@grafana/schema';",
        *(
            f"import type * as {mod} from '{SCHEMA.format(mod, prefix)}';"
            for mod, prefix, _ in (PANELS[k] for k in sorted(PANELS))
        ),
        "import type { InfluxAnnotation, InfluxTarget, Link, Lit, Matcher, Transformation } from '../harness';",
        "",
    ]
    return "\n".join(imports) + "\n" + "\n".join(m.consts)


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int
    code: str
    message: str


_DIAG = re.compile(r"^(?P<file>[^(\s]+)\((?P<line>\d+),\d+\): error (?P<code>TS\d+): (?P<msg>.*)$")


def node() -> str:
    path = shutil.which("node")
    if path is None:
        raise RuntimeError("node is needed for Grafana's type check and formatter (apt-get install nodejs npm)")
    return path


def ensure_installed() -> None:
    """``npm ci`` the harness when missing (CI does it in .ci/run), then check the pinned versions."""
    pkg = HARNESS / "node_modules" / "@grafana" / "schema" / "package.json"
    if not pkg.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed to install tests/grafana-types (apt-get install nodejs npm)")
        r = subprocess.run(
            [npm, "ci", "--prefix", str(HARNESS), "--no-audit", "--no-fund"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(
                f"`npm ci --prefix tests/grafana-types` failed (needs the npm registry):\n{r.stderr[-2000:]}"
            )
    versions = {
        name: json.loads((HARNESS / "node_modules" / "@grafana" / name / "package.json").read_text())["version"]
        for name in ("schema", "data")
    }
    assert versions == {"schema": SCHEMA_VERSION, "data": DATA_VERSION}, versions


@contextmanager
def workdir() -> Iterator[Path]:
    """A scratch folder inside the harness (so imports resolve to its node_modules), removed after."""
    path = Path(tempfile.mkdtemp(prefix=".check-", dir=HARNESS))
    try:
        (path / "tsconfig.json").write_text(
            json.dumps({"extends": "../tsconfig.json", "include": ["*.ts", "../harness.ts", "../vendor/**/*.ts"]})
        )
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tsc(folder: Path) -> list[Diagnostic]:
    """``tsc --strict --noEmit`` over a folder made by :func:`workdir`; its errors."""
    r = subprocess.run(
        [node(), str(HARNESS / "node_modules" / "typescript" / "bin" / "tsc"), "-p", str(folder), "--pretty", "false"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=HARNESS,
    )
    diags, last = [], None
    for line in r.stdout.splitlines():
        m = _DIAG.match(line)
        if m:
            last = Diagnostic(Path(m["file"]).name, int(m["line"]), m["code"], m["msg"])
            diags.append(last)
        elif last is not None and line.startswith(" "):  # continuation of the previous message
            diags[-1] = last = Diagnostic(last.file, last.line, last.code, last.message + "\n" + line.strip())
    if r.returncode != 0 and not diags:
        raise RuntimeError(f"tsc failed without diagnostics:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return diags


def grafana(command: str, payload: Any) -> Any:
    """Run ``grafana.cjs <command>`` with ``payload`` as JSON on stdin; its JSON answer."""
    r = subprocess.run(
        [node(), str(HARNESS / "grafana.cjs"), command],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=HARNESS,
    )
    if r.returncode != 0:
        raise RuntimeError(f"grafana.cjs {command} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- reading a formatted value back ---------------------------------------------------------------
_SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3, "µ": 1e-6, "n": 1e-9}
_TIME_S = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "hour": 3600.0, "day": 86400.0}
_TIME_S |= {"week": 604800.0, "year": 31536000.0}
_TIME_S |= {k + "s": v for k, v in list(_TIME_S.items()) if k in ("min", "hour", "day", "week", "year")}


def _si(unit: str) -> dict[str, float]:
    return {p + unit: f for p, f in _SI.items()}


#: quantity -> {suffix Grafana may print: the factor to the quantity's own unit}
SUFFIXES: dict[str, dict[str, float]] = {
    "percent": {"%": 1.0},
    "ratio": {"%": 0.01},
    "bytes": {"B": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40, "PiB": 2.0**50},
    "bytes/s": {"B/s": 1.0, "kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12},
    "MHz": {"kHz": 1e-3, "MHz": 1.0, "GHz": 1e3, "THz": 1e6},
    "W": {"mW": 1e-3, "W": 1.0, "kW": 1e3, "MW": 1e6},
    "°C": {"°C": 1.0},
    "s": _TIME_S,
    "ms": {k: v * 1e3 for k, v in _TIME_S.items()},
    "J": {"mJ": 1e-3, "J": 1.0, "kJ": 1e3, "MJ": 1e6, "GJ": 1e9},
    "kWh": {"Wh": 1e-3, "kWh": 1.0, "MWh": 1e3, "GWh": 1e6},
    "GPU-h": {"GPU-h": 1.0},
    "count": {"": 1.0},
    "plain": {"": 1.0},
    "TFLOP/s": {"GFLOPS": 1e-3, "TFLOPS": 1.0, "PFLOPS": 1e3},
    "samples/s": {"samples/s": 1.0},
    "tokens/s": _si("tokens/s"),
    "lines/s": {"lines/s": 1.0},
    "records/s": {"records/s": 1.0},
}
#: quantities shown as an exact integer with a fixed prefix
EXACT = {"id": "", "P-state": "P", "gen": "Gen ", "lanes": "x"}
_NUMBER = re.compile(r"^(?P<prefix>[^\d-]*)(?P<num>-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*(?P<suffix>.*?)$")


def misreads(quantity: str, value: float, text: str) -> str | None:
    """Why ``text`` does not show ``value`` as that amount of ``quantity``, or ``None`` when it does.

    A suffix must be one of the quantity's own (bytes in B/KiB/MiB/..., a GPU-hour as GPU-h, never
    weeks), and number x suffix must give back the value to within the displayed precision."""
    if quantity == "timestamp":
        return None if re.search(r"\bago$|^in |^a few seconds", text) else f"{text!r} is not a relative time"
    m = _NUMBER.match(text.strip())
    if not m:
        return f"{text!r} is not a number"
    number, prefix, suffix = float(m["num"]), m["prefix"], m["suffix"].strip()
    if quantity in EXACT:
        want = EXACT[quantity]
        ok = prefix == want and suffix == "" and m["num"] == str(round(value))
        return None if ok else f"{text!r} is not {want}{round(value)}"
    if prefix:
        return f"{text!r} has a prefix"
    factors = SUFFIXES[quantity]
    if suffix not in factors:
        return f"{text!r}: {suffix!r} is not a unit of {quantity} ({', '.join(repr(s) for s in factors)})"
    decimals = len(m["num"].split(".")[1]) if "." in m["num"] else 0
    shown = number * factors[suffix]
    # half a unit of the last digit shown: a value exactly halfway (2.25 % shown as 2.3 %) is read right,
    # whatever the float error of the products (1e-9 of slack)
    tolerance = max(abs(value) * 0.01, 0.5 * 10.0**-decimals * factors[suffix]) * (1 + 1e-9)
    return None if abs(shown - value) <= tolerance else f"{text!r} reads as {shown:g}, not {value:g}"


# -- frames as Grafana's InfluxQL backend builds them ---------------------------------------------
def _field_type(values: list[Any]) -> str:
    sample = next((v for v in values if v is not None), None)
    return "string" if isinstance(sample, str) else "boolean" if isinstance(sample, bool) else "number"


def _frame_name(name: str, column: str, tags: dict[str, str], alias: str) -> str:
    """pkg/tsdb/influxdb/influxql/util FormatFrameName: the alias with $col, $m and $tag_X filled in."""
    if not alias:
        suffix = " {" + ", ".join(f"{k}: {v}" for k, v in tags.items()) + "}" if tags else ""
        return f"{name}.{column}{suffix}"

    def sub(m: re.Match[str]) -> str:
        key = m.group(1) or m.group(2)
        if key in ("col",):
            return column
        if key in ("m", "measurement"):
            return name
        if key.startswith("tag_"):
            return tags.get(key.removeprefix("tag_"), m.group(0))
        return m.group(0)

    return re.sub(r"\$(\w+)|\[\[(\w+)\]\]", sub, alias)


def backend_frames(response: dict[str, Any], target: dict[str, Any]) -> list[dict[str, Any]]:
    """The data frames Grafana's InfluxQL backend makes of a ``/query`` response (epoch=ms).

    Follows ``pkg/tsdb/influxdb/influxql/buffered/response_parser.go``: a ``table`` target gives
    one frame (Time, then the series' tags as string fields, then the value columns); a
    ``time_series`` target one frame per series and column, with a ``Time`` and a ``Value`` field
    labelled with the series' tags and named by the alias.
    """
    series = [s for res in response.get("results", []) for s in res.get("series", []) or []]
    if not series:
        return []
    ref = target["refId"]
    if target.get("resultFormat") == "table":
        columns = series[0]["columns"]
        fields: list[dict[str, Any]] = []
        rows = [(s, v) for s in series for v in s["values"]]
        if columns[0] == "time":
            fields.append({"name": "Time", "type": "time", "values": [v[0] for _, v in rows]})
        for key in series[0].get("tags") or {}:
            fields.append({"name": key, "type": "string", "values": [(s.get("tags") or {}).get(key) for s, _ in rows]})
        for i, col in enumerate(columns[1:], start=1):
            values = [v[i] for _, v in rows]
            fields.append({"name": col, "type": _field_type(values), "values": values, "displayNameFromDS": col})
        return [{"refId": ref, "name": series[0]["name"], "fields": fields}]
    frames = []
    for s in series:
        tags = s.get("tags") or {}
        for i, col in enumerate(s["columns"]):
            if col == "time":
                continue
            values = [v[i] for v in s["values"]]
            name = _frame_name(s["name"], col, tags, target.get("alias", ""))
            frames.append(
                {
                    "refId": ref,
                    "name": name,
                    "fields": [
                        {"name": "Time", "type": "time", "values": [v[0] for v in s["values"]]},
                        {"name": "Value", "type": _field_type(values), "labels": tags, "values": values,
                         "displayNameFromDS": name},
                    ],
                }
            )  # fmt: skip
    return frames
