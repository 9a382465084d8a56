"""Stand-in for what Grafana does to an InfluxQL dashboard query before InfluxDB sees it.

No Grafana server runs in the tests: :func:`interpolate` reproduces the two stages a query of the
stack's Grafana (13.2, a scenes dashboard, the InfluxDB datasource in backend mode) goes through,
so a dashboard query can be run against InfluxDB as Grafana would send it. Read in:

* grafana/scenes at v8.16.1 (the newest snapshot stored, 2026-08-20; the version Grafana 13.2.3
  bundles was not pinned): ``packages/scenes/src/variables/constants.ts`` ``VARIABLE_REGEX``,
  ``interpolation/sceneInterpolator.ts`` ``sceneInterpolator`` and ``formatValue``,
  ``interpolation/formatRegistry.ts``, ``variants/MultiValueVariable.ts`` ``getValue`` and
  ``CustomAllValue``, ``macros/timeMacros.ts`` ``TimeFromAndToMacro``;
* grafana/grafana (a stored version of ``main`` whose commit the store does not name, with
  ``isMigrationToggleOnAndIsAccessProxy``; Grafana 13.2.3 is commit 90ffed056f08, not stored):
  ``public/app/plugins/datasource/influxdb/datasource.ts`` ``applyTemplateVariables``,
  ``applyVariables``, ``interpolateQueryExpr``, ``annotationEvents``;
  ``pkg/tsdb/influxdb/models/query.go`` (commit b93b115f6b0d) ``Query.Build``,
  ``renderTimeFilter``, ``epochMStoInfluxTime``; the feature toggle ``influxdbBackendMigration`` is
  GA and on by default (``featureToggles`` in ``packages/grafana-data``), so InfluxQL goes through
  the backend.

Stage 1, the browser (:func:`_browser`): each ``$var``, ``[[var]]``, ``[[var:fmt]]``, ``${var}``,
``${var:fmt}`` is replaced; a name that is neither a variable nor a macro is left as written. An
explicit ``:fmt`` uses the format registry (``regex``, ``raw``, ``pipe``, ``csv``, ``glob``, ``text``;
an unknown one falls back to ``glob``). Without one, the datasource's ``interpolateQueryExpr(value,
variable, query)`` decides (:func:`_influx_expr`):

* a single string value that JavaScript's ``parseFloat`` reads as a number is inserted as is;
* a multi-value variable's values are regex-escaped, an array always in parentheses ``(a|b)``, even
  of one value;
* any other value is escaped only when the raw query holds a regex literal after ``=~`` or ``!~``
  that contains ``$name`` (that spelling only, not ``${name}``), else inserted as is (an array as
  JavaScript joins it, ``a,b``).

"All" with a custom ``allValue`` inserts that value whatever the format (``:text`` gives ``All``) and
interpolates it again; "All" without one stands for the array of every option's value. ``$__from``
and ``$__to`` are the range's epoch milliseconds. ``$__interval`` and ``$__interval_ms`` are left for
the backend (``applyTemplateVariables`` sets them to themselves).

Stage 2, the backend (:func:`_backend`): ``$timeFilter`` becomes ``time >= {from}ms and time <=
{to}ms``, then ``$interval``, ``$__interval_ms`` and ``$__interval`` are replaced, in that order.

Known differences: the time range is given as ``now-N[smhdw]`` and turned into epoch milliseconds
here (Grafana's browser does it with the dashboard's time zone; relative ranges do not depend on
it); ``$__interval`` is given by the caller (``grafana_queries.grafana_interval`` computes
Grafana's); a variable's display text is taken to equal its value (``:text``); field paths
(``${var.field}``), ``${__from:date}`` and the other formats (``percentencode``, ``queryparam``,
``lucene``, ...) raise ``ValueError``; a name still unresolved after both stages raises
``KeyError`` (InfluxDB would refuse it as an unbound parameter). The characters ``escapeRegex``
escapes (``\\ ^ $ * + ? . ( ) | [ ] { } /``, ``@grafana/data``) were not found in the stored source;
scenes' ``formatRegistry.test.ts`` checks only that ``.`` is escaped.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

_REGEX_SPECIALS = re.compile(r"[\\^$*+?.()|\[\]{}/]")
_RELATIVE = re.compile(r"^now-(\d+)([smhdw])$")
#: scenes' ``VARIABLE_REGEX``: $var | [[var]] / [[var:fmt]] | ${var}, ${var.path}, ${var:fmt}
_VARIABLE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)((?:\.[^:^{}\[\]]+|\[\"[^\"]*\"\]|\['[^']*'\]|\[[^\]\"']*\])*)(?::([^}]+))?\}"
)
#: ``interpolateQueryExpr``'s ``regexMatcher``: a regex literal after ``=~`` or ``!~``
_REGEX_LITERAL = re.compile(
    r"(\s*(=|!)~\s*)\/((?![*+?])(?:[^\r\n\[/\\]|\\.|\[(?:[^\r\n\]\\]|\\.)*\])+)\/"
    r"((?:g(?:im?|mi?)?|i(?:gm?|mg?)?|m(?:gi?|ig?)?)?)",
    re.M,
)
#: what JavaScript's ``parseFloat`` reads a number from (leading white space, then a decimal or Infinity)
_JS_FLOAT = re.compile(r"\s*[+-]?(?:Infinity|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_BACKEND_MACROS = ("__interval", "__interval_ms")


def regex_escape(value: str) -> str:
    """``escapeRegex`` of ``@grafana/data``: a variable value placed inside an InfluxQL ``/regex/``."""
    return _REGEX_SPECIALS.sub(lambda m: "\\" + m.group(0), value)


@dataclass(frozen=True)
class Selection:
    """A template variable's current selection.

    ``multi``: the variable is multi-value (``isMulti``), so its value is an array even of one.
    ``all_value``: "All" is selected and the variable has a custom ``allValue``, which stands for it.
    ``all``: "All" is selected without a custom ``allValue``: ``values`` are every option's value."""

    values: tuple[str, ...]
    multi: bool = True
    all_value: str | None = None
    all: bool = False

    def value(self) -> str | list[str]:
        """``MultiValueVariable.getValue``: an array for a multi-value variable or "All", else the one value."""
        if self.multi or self.all:
            return list(self.values)
        return self.values[0] if self.values else ""


def _js_string(value: str | list[str]) -> str:
    return value if isinstance(value, str) else ",".join(value)


def _regex_format(value: str | list[str]) -> str:
    if isinstance(value, str):
        return regex_escape(value)
    escaped = [regex_escape(v) for v in value]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


_FORMATS = {
    "raw": _js_string,
    "regex": _regex_format,
    "pipe": lambda v: v if isinstance(v, str) else "|".join(v),
    "csv": lambda v: v if isinstance(v, str) else ",".join(v),
    "glob": lambda v: "{" + ",".join(v) + "}" if isinstance(v, list) and len(v) > 1 else _js_string(v),
    "text": lambda v: v if isinstance(v, str) else " + ".join(v),
}


def _influx_expr(value: str | list[str], multi: bool, name: str, query: str) -> str:
    """``interpolateQueryExpr`` of the InfluxDB datasource, for a variable used without a format."""
    if isinstance(value, str) and _JS_FLOAT.match(value):
        return value
    if multi:
        return regex_escape(value) if isinstance(value, str) else "(" + "|".join(map(regex_escape, value)) + ")"
    in_regex = re.compile(r"\/(?:\^)?(.*)(\$" + name + r")(.*)(?:\$)?\/", re.M)
    if any(in_regex.search(m.group(0)) for m in _REGEX_LITERAL.finditer(query)):
        return regex_escape(value) if isinstance(value, str) else "(" + "|".join(map(regex_escape, value)) + ")"
    return _js_string(value)


def _browser(
    text: str,
    variables: Mapping[str, Selection],
    range_ms: tuple[int, int],
    query: str | None,
) -> str:
    """``sceneInterpolator`` with the datasource's format function (``query`` is the raw query it is given),
    or with none (``query`` None: a custom all value interpolated again, whose default format is glob)."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if m.group(5):
            raise ValueError(f"field paths are not modelled: {m.group(0)}")
        if name in _BACKEND_MACROS:
            return f"${name}"
        if name in ("__from", "__to"):
            if fmt:
                raise ValueError(f"the {fmt} format of ${name} is not modelled")
            return str(range_ms[0] if name == "__from" else range_ms[1])
        sel = variables.get(name)
        if sel is None:
            return m.group(0)
        if sel.all_value is not None:  # CustomAllValue.formatter, then interpolated again
            return "All" if fmt == "text" else _browser(sel.all_value, variables, range_ms, None)
        value = sel.value()
        if fmt is None and query is not None:
            return _influx_expr(value, sel.multi, name, query)
        kind = (fmt or "glob").split(":")[0]
        if kind not in _FORMATS and kind in ("percentencode", "queryparam", "lucene", "date", "json", "sqlstring"):
            raise ValueError(f"the {kind} format is not modelled")
        return _FORMATS.get(kind, _FORMATS["glob"])(value)

    return _VARIABLE.sub(sub, text)


def _backend(text: str, range_ms: tuple[int, int], interval: str) -> str:
    """``Query.Build``'s replacements, in its order."""
    text = text.replace("$timeFilter", f"time >= {range_ms[0]}ms and time <= {range_ms[1]}ms")
    text = text.replace("$interval", interval)
    text = text.replace("$__interval_ms", str(_duration_ms(interval)))
    return text.replace("$__interval", interval)


def interpolate(
    query: str,
    variables: Mapping[str, Selection],
    *,
    time_from: str = "now-6h",
    interval: str = "10s",
    from_ms: int | None = None,
    to_ms: int | None = None,
) -> str:
    """The query as Grafana would send it to InfluxDB for this time range, interval and variable selection."""
    if from_ms is None or to_ms is None:
        to_ms = time.time_ns() // 1_000_000
        from_ms = to_ms - _duration_ms(_relative(time_from))
    sent = _backend(_browser(query, variables, (from_ms, to_ms), query), (from_ms, to_ms), interval)
    left = re.search(r"(?<!\\)\$(\w+)|\[\[(\w+)", sent)
    if left:
        name = left.group(1) or left.group(2)
        raise KeyError(f"query uses ${name}, which is neither a macro nor a dashboard variable: {query}")
    return sent


def _relative(time_from: str) -> str:
    m = _RELATIVE.match(time_from)
    if not m:
        raise ValueError(f"only now-N[smhdw] time ranges are supported, not {time_from!r}")
    n, unit = int(m.group(1)), m.group(2)
    return f"{n * 7}d" if unit == "w" else f"{n}{unit}"


def _duration_ms(d: str) -> int:
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", d)
    if not m:
        raise ValueError(f"bad interval {d!r}")
    return int(m.group(1)) * {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[m.group(2)]
