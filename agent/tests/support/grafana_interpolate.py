"""Stand-in for what Grafana's InfluxDB (InfluxQL) datasource does to a query before sending it.

No Grafana server runs in the tests: :func:`interpolate` reproduces the substitution of
``$timeFilter``, ``$__interval``, ``$__from``/``$__to`` and template variables (``$host``,
``${host}``, ``${host:regex}``, ``[[host]]``), so a dashboard query can be run against InfluxDB as
Grafana would send it. It follows Grafana's ``public/app/features/templating/template_srv.ts``
(``replace``: the three variable syntaxes, the ``:regex`` format) and the InfluxDB datasource's
``datasource.ts`` (``getTimeFilter`` for ``$timeFilter``, ``interpolateQueryExpr``: a multi-value or
"All" variable's values regex-escaped and joined as ``(a|b)``; ``template_srv.ts`` inserts a
variable's custom ``allValue`` for "All" as is, unformatted). These names are Grafana 12's
source tree as recalled when this module moved to test support, not checked against the source
then (from Grafana 13 the InfluxDB datasource is an external plugin the image bundles). Where it
differs: only relative
ranges (``now``, ``now-N[smhdw]``) are rendered, never absolute dates; ``$__interval`` is given by
the caller (``grafana_queries.grafana_interval`` computes Grafana's), and a single-value variable
without ``:regex`` is inserted unescaped.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

_REGEX_SPECIALS = re.compile(r"[\\^$*+?.()|\[\]{}/]")
_RELATIVE = re.compile(r"^now-(\d+)([smhdw])$")


def regex_escape(value: str) -> str:
    """Grafana's escaping of a variable value placed inside an InfluxQL ``/regex/``."""
    return _REGEX_SPECIALS.sub(lambda m: "\\" + m.group(0), value)


def _influx_time(raw: str) -> str:
    if raw == "now":
        return "now()"
    m = _RELATIVE.match(raw)
    if not m:
        raise ValueError(f"only now and now-N[smhdw] time ranges are supported, not {raw!r}")
    return f"now() - {m.group(1)}{m.group(2)}"


def time_filter(time_from: str, time_to: str = "now") -> str:
    """``$timeFilter`` as Grafana's InfluxQL datasource renders a relative range."""
    return f"time >= {_influx_time(time_from)} and time <= {_influx_time(time_to)}"


@dataclass(frozen=True)
class Selection:
    """A template variable's current selection; ``multi`` when it is multi-value or has All.

    ``all_value``: "All" is selected and the variable has a custom ``allValue``, which stands for it."""

    values: tuple[str, ...]
    multi: bool = True
    all_value: str | None = None

    def render(self, fmt: str | None) -> str:
        if self.all_value is not None:
            return self.all_value
        if fmt == "regex" or self.multi:
            escaped = [regex_escape(v) for v in self.values]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        return self.values[0] if self.values else ""


def interpolate(
    query: str,
    variables: Mapping[str, Selection],
    *,
    time_from: str = "now-6h",
    interval: str = "10s",
    from_ms: int | None = None,
    to_ms: int | None = None,
) -> str:
    """The query as Grafana would send it for this time range, interval and variable selection."""
    macros = {
        "timeFilter": time_filter(time_from),
        "__timeFilter": time_filter(time_from),
        "__interval": interval,
        "__interval_ms": str(_duration_ms(interval)),
    }
    if from_ms is None or to_ms is None:
        to_ms = time.time_ns() // 1_000_000
        from_ms = to_ms - _duration_ms(_relative(time_from))
    macros["__from"], macros["__to"] = str(from_ms), str(to_ms)

    def sub(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("bracket") or m.group("plain")
        fmt = m.group("fmt")
        if name in macros:
            return macros[name]
        if name in variables:
            return variables[name].render(fmt)
        raise KeyError(f"query uses ${name}, which is neither a macro nor a dashboard variable: {query}")

    return re.sub(
        r"\$\{(?P<braced>\w+)(?::(?P<fmt>\w+))?\}|\[\[(?P<bracket>\w+)\]\]|\$(?P<plain>\w+)",
        sub,
        query,
    )


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
