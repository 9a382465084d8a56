"""Checks of a dashboard's InfluxQL against :mod:`gpulse.schema`, for the dashboard and alert tests.

:func:`check_references` checks the measurements (with retention policy) and identifiers a query
names (:func:`gpulse.dashboards.influxql.references`) against the schema, so a renamed field breaks
the build instead of silently emptying a panel; :func:`select_columns`, :func:`plain_field` and
:func:`tag_keys` read the parts of a query the tests compare with the panels' units and variables.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from gpulse.dashboards.influxql import references
from gpulse.schema import DOWNSAMPLE_SUFFIXES, MEASUREMENTS

#: Retention policies the setup creates: raw (default) and the downsampled ones.
DOWNSAMPLED_RPS = ("1m", "1h")


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
