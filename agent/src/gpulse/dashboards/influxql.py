"""What Grafana does to an InfluxQL query before sending it, and which schema names a query uses.

:func:`interpolate` reproduces the InfluxDB datasource's substitution of ``$timeFilter``,
``$__interval``, ``$__from``/``$__to`` and template variables (``$host``, ``${host}``,
``${host:regex}``, ``[[host]]``), including its regex escaping of multi-value variables, so a
dashboard query can be run against InfluxDB exactly as Grafana would send it.

:func:`references` lists the measurements (with retention policy) and the identifiers a query
uses, and :func:`check_references` checks them against :mod:`gpulse.schema`, so a renamed field
breaks the build instead of silently emptying a panel. A query never names the database: the
datasource's ``dbName`` is the bucket the user configured (``GPULSE_BUCKET``), so ``FROM
"1h"."gpu"`` follows it and ``FROM "gpulse"."1h"."gpu"`` would break for any other name.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulse.schema import DOWNSAMPLE_SUFFIXES, MEASUREMENTS

#: Retention policies the setup creates: raw (default) and the downsampled ones.
DOWNSAMPLED_RPS = ("1m", "1h")

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
class Variable:
    """A template variable's current selection; ``multi`` when it is multi-value or has All."""

    values: tuple[str, ...]
    multi: bool = True

    def render(self, fmt: str | None) -> str:
        if fmt == "regex" or self.multi:
            escaped = [regex_escape(v) for v in self.values]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        return self.values[0] if self.values else ""


def interpolate(
    query: str,
    variables: Mapping[str, Variable],
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


# -- schema references -------------------------------------------------------------------------
_SOURCE = re.compile(r'\bFROM\s+((?:"[^"]+"\.){0,2}"[^"]+")', re.IGNORECASE)
_ALIAS = re.compile(r'\bAS\s+"([^"]+)"', re.IGNORECASE)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'")
_REGEX = re.compile(r"=~\s*/(?:[^/\\]|\\.)*/|!~\s*/(?:[^/\\]|\\.)*/")
_IDENT = re.compile(r'"([^"]+)"')


@dataclass
class References:
    #: (retention policy or None for the default, measurement)
    sources: list[tuple[str | None, str]] = field(default_factory=list)
    identifiers: set[str] = field(default_factory=set)
    aliases: set[str] = field(default_factory=set)


def references(query: str) -> References:
    """The measurements, field/tag identifiers and aliases an InfluxQL query names (all double-quoted)."""
    refs = References()
    for m in _SOURCE.finditer(query):
        parts = _IDENT.findall(m.group(1))
        if len(parts) == 3:
            raise ValueError(f"query names the database {parts[0]!r}; name only the retention policy: {query}")
        rp = parts[-2] if len(parts) >= 2 else None
        refs.sources.append((rp, parts[-1]))
    refs.aliases = set(_ALIAS.findall(query))
    rest = _SOURCE.sub(" ", query)
    rest = _ALIAS.sub(" ", rest)
    rest = _STRING.sub(" ", rest)
    rest = _REGEX.sub(" ", rest)
    refs.identifiers = set(_IDENT.findall(rest))
    return refs


def _known_names(rp: str | None, measurement: str) -> tuple[set[str], list[str]]:
    """Tags and fields readable from ``measurement`` in ``rp``, and problems with the source itself."""
    m = MEASUREMENTS.get(measurement)
    if m is None:
        return set(), [f"unknown measurement {measurement!r}"]
    names = set(m.all_tags)
    problems: list[str] = []
    if rp in DOWNSAMPLED_RPS:
        if not m.downsampled:
            problems.append(f"{measurement!r} is not downsampled, so it has nothing in retention policy {rp!r}")
        for f in m.fields:
            if f.downsample is None:
                continue
            names.add(f.name)
            if f.downsample == "mean":
                names.update(f.name + s for s in DOWNSAMPLE_SUFFIXES)
    elif rp not in (None, "raw"):
        problems.append(f"unknown retention policy {rp!r}")
    else:
        names.update(m.by_name)
    return names, problems


def check_references(query: str) -> list[str]:
    """Problems with the names ``query`` uses; empty when every one exists in the schema."""
    refs = references(query)
    if not refs.sources:
        return [f"no FROM measurement found: {query}"]
    problems: list[str] = []
    known: set[str] = set(refs.aliases) | {"time"}
    open_patterns: list[str] = []
    for rp, measurement in refs.sources:
        names, source_problems = _known_names(rp, measurement)
        problems += source_problems
        known |= names
        m = MEASUREMENTS.get(measurement)
        if m is not None and m.open_fields and rp not in DOWNSAMPLED_RPS:
            open_patterns.append(m.open_fields)
    for ident in sorted(refs.identifiers - known):
        if not any(re.fullmatch(p, ident) for p in open_patterns):
            sources = ", ".join(f"{rp or 'raw'}.{m}" for rp, m in refs.sources)
            problems.append(f"{ident!r} is not a tag or field of {sources}")
    return problems


def tag_keys(query: str) -> Sequence[str]:
    """The keys of a ``SHOW TAG VALUES ... WITH KEY = "k"`` query."""
    return re.findall(r'WITH\s+KEY\s*=\s*"([^"]+)"', query, re.IGNORECASE)


def _top_level(text: str, sep: str) -> list[int]:
    """Offsets of ``sep`` outside parentheses and quotes (case-insensitive)."""
    out, depth, quote = [], 0, ""
    upper, sep = text.upper(), sep.upper()
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and upper.startswith(sep, i):
            out.append(i)
    return out


_COLUMN_ALIAS = re.compile(r'^(?P<expr>.*?)\s+AS\s+"(?P<alias>[^"]+)"$', re.IGNORECASE | re.DOTALL)
_CALL = re.compile(r"^(?P<fn>\w+)\(")
_BARE = re.compile(r'^"(?P<name>[^"]+)"$')


def select_columns(query: str) -> list[tuple[str, str]]:
    """The outermost SELECT's columns as (expression, column name InfluxDB gives it)."""
    body = query.strip()
    if not body.upper().startswith("SELECT "):
        return []
    body = body[len("SELECT ") :]
    ends = _top_level(body, " FROM ")
    body = body[: ends[0]] if ends else body
    cuts = [0, *(i + 1 for i in _top_level(body, ",")), len(body) + 1]
    out = []
    for a, b in itertools.pairwise(cuts):
        expr = body[a : b - 1].strip()
        m = _COLUMN_ALIAS.match(expr)
        if m:
            out.append((m["expr"].strip(), m["alias"]))
        elif (call := _CALL.match(expr)) is not None:
            out.append((expr, call["fn"]))
        elif (bare := _BARE.match(expr)) is not None:
            out.append((expr, bare["name"]))
        else:
            out.append((expr, expr))
    return out


_PLAIN = re.compile(r'^(?:(?:mean|median|max|min|last|first)\()?"(?P<field>[^"]+)"\)?$', re.IGNORECASE)


def plain_field(expression: str) -> str | None:
    """The field an expression shows unchanged (``mean("x")``, ``last("x")``, ``"x"``), else ``None``."""
    m = _PLAIN.match(expression.strip())
    return m["field"] if m else None
