"""The InfluxQL subset the InfluxDB 3 stand-in (:mod:`support.fake_influx_v3`) answers, planned onto DataFusion SQL.

InfluxDB 3 runs InfluxQL by planning it onto DataFusion (``core/iox_query_influxql/src/plan/planner.rs``,
``influxdata/influxdb`` 3.10 nightly d7834110); this module parses the statements gpulse sends and writes
the SQL whose result that plan gives, following the planner's snapshot tests
(``core/iox_query_influxql/src/plan/snapshots/``, short: **P**). The subset, exactly:

* ``SHOW DATABASES``;
* ``SELECT * | <field or tag>[, ...] FROM <source> [WHERE <cond>]``: ``time`` first, then the columns
  (``*``: every tag and field, by name, as the wildcard rewriter expands it); rows where every selected
  field is null are left out (P ``select__functions__selectors_additional_fields``:
  ``Filter: f IS NOT NULL OR ...``);
* ``SELECT first(<field>) | last(<field>) FROM <source> [WHERE <cond>]``: one row, ``time`` and ``first``
  / ``last``, ``time`` the selected point's (``selector_first``/``selector_last`` over the non-null
  values: P ``..._selectors_additional_fields_4``); none when no point matches (``__aggr_count > 0``);
* ``SHOW TAG VALUES FROM <source> WITH KEY = <tag> [WHERE <cond>]``: columns ``key``, ``value``, the
  distinct values sorted (P ``metadata_queries__show_tag_values_1``..``4``; nulls kept, as the
  ``Distinct`` there keeps them); without a time condition only the last day is read (the planner's
  ``Filter: time >= now() - 1d``).

``<source>`` is ``[["db".]"rp".]"m"``; ``<cond>`` is conditions joined by ``AND``, each ``time <op> <int
ns>`` (``>=``, ``>``, ``<=``, ``<``), ``<tag> = '<string>'`` or a parenthesised ``OR`` of those. A tag or
field the table does not have is null (IOx's schema for the measurement), so a condition on it matches
nothing; a measurement the database does not have gives no series. Anything else is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DAY_NS = 86_400 * 10**9
_IDENT = r'(?:"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*)'
_STRING = r"'(?:[^'\\]|\\.)*'"
_SOURCE = rf"(?P<from>{_IDENT}(?:\.{_IDENT}){{0,2}})"
_WHERE = r"(?:\s+WHERE\s+(?P<where>.+?))?\s*;?\s*$"
_SELECT = re.compile(
    rf"^\s*SELECT\s+(?P<cols>\*|(?:first|last)\(\s*{_IDENT}\s*\)|{_IDENT}(?:\s*,\s*{_IDENT})*)\s+FROM\s+{_SOURCE}{_WHERE}",
    re.IGNORECASE | re.DOTALL,
)
_SHOW_TAG_VALUES = re.compile(
    rf"^\s*SHOW\s+TAG\s+VALUES\s+FROM\s+{_SOURCE}\s+WITH\s+KEY\s*=\s*(?P<key>{_IDENT}){_WHERE}",
    re.IGNORECASE | re.DOTALL,
)
_SHOW_DATABASES = re.compile(r"\s*SHOW\s+DATABASES\s*;?\s*", re.IGNORECASE)
_SELECTOR = re.compile(rf"(?P<fn>first|last)\(\s*(?P<field>{_IDENT})\s*\)", re.IGNORECASE)
_TIME = re.compile(r"time\s*(?P<op>>=|<=|>|<)\s*(?P<ns>-?\d+)", re.IGNORECASE)
_TAG_EQ = re.compile(rf"(?P<tag>{_IDENT})\s*=\s*(?P<value>{_STRING})")


class Unsupported(ValueError):
    """A statement outside the subset (the stand-in answers it as an in-band error)."""


def unquote(ident: str) -> str:
    return ident[1:-1].replace('\\"', '"') if ident.startswith('"') else ident


def _string(literal: str) -> str:
    return re.sub(r"\\(.)", r"\1", literal[1:-1])


@dataclass(frozen=True)
class Source:
    """``FROM [["db".]"rp".]"m"``: the database the query names (``db/rp``, or ``db`` for ``autogen``), if any."""

    measurement: str
    database: str | None = None


@dataclass(frozen=True)
class TagMatch:
    """``tag = 'a' [OR tag = 'b' ...]`` (one tag or several: each term its own)."""

    terms: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Condition:
    """A ``WHERE``: a time range ``[start, stop)`` (None: unbounded) and tag matches, all ANDed."""

    start_ns: int | None = None
    stop_ns: int | None = None
    tags: tuple[TagMatch, ...] = ()

    @property
    def has_time(self) -> bool:
        return self.start_ns is not None or self.stop_ns is not None


@dataclass(frozen=True)
class ShowDatabases:
    pass


@dataclass(frozen=True)
class Select:
    source: Source
    where: Condition
    columns: tuple[str, ...] = ()  # empty: ``*``
    selector: str | None = None  # first | last
    field: str | None = None  # the selector's field


@dataclass(frozen=True)
class ShowTagValues:
    source: Source
    key: str
    where: Condition = field(default_factory=Condition)


Statement = ShowDatabases | Select | ShowTagValues


def _source(text: str) -> Source:
    """``iox_query_influxql_rewrite`` ``resolve_dbrp``: ``"db"."rp"`` is database ``db/rp`` (``autogen`` and
    ``default``: ``db``); a retention policy without a database is dropped."""
    parts = [unquote(p) for p in re.findall(_IDENT, text)]
    if len(parts) < 3:
        return Source(parts[-1])
    db, rp, m = parts
    return Source(m, db if rp in ("autogen", "default") else f"{db}/{rp}")


def _split_and(text: str) -> list[str]:
    """Split at top-level ``AND`` (outside parentheses and strings)."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == "'":
            m = re.compile(_STRING).match(text, i)
            i = m.end() if m else len(text)
            continue
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and re.match(r"\sAND\s", text[i : i + 5], re.IGNORECASE):
            out.append(text[start:i])
            start = i + 5
            i += 5
            continue
        i += 1
    return [*out, text[start:]]


def _condition(text: str | None) -> Condition:
    if not text:
        return Condition()
    start = stop = None
    tags: list[TagMatch] = []
    for term in (t.strip() for t in _split_and(text)):
        if m := _TIME.fullmatch(term):
            ns, op = int(m["ns"]), m["op"]
            if op in (">=", ">"):  # planner_time_range_expression: time > t is time >= t + 1
                lo = ns + (op == ">")
                start = lo if start is None else max(start, lo)
            else:
                hi = ns + (op == "<=")
                stop = hi if stop is None else min(stop, hi)
            continue
        inner = term[1:-1] if term.startswith("(") and term.endswith(")") else term
        ors = re.split(r"\s+OR\s+", inner.strip(), flags=re.IGNORECASE)
        matches = [_TAG_EQ.fullmatch(o.strip()) for o in ors]
        if not all(matches):
            raise Unsupported(f"the stand-in's InfluxQL does not answer the condition {term!r}")
        tags.append(TagMatch(tuple((unquote(m["tag"]), _string(m["value"])) for m in matches if m)))
    return Condition(start, stop, tuple(tags))


def parse(q: str) -> Statement:
    """One statement of the subset, or :class:`Unsupported`."""
    if _SHOW_DATABASES.fullmatch(q):
        return ShowDatabases()
    if m := _SHOW_TAG_VALUES.match(q):
        return ShowTagValues(_source(m["from"]), unquote(m["key"]), _condition(m["where"]))
    if m := _SELECT.match(q):
        where = _condition(m["where"])
        if s := _SELECTOR.fullmatch(m["cols"]):
            return Select(_source(m["from"]), where, selector=s["fn"].lower(), field=unquote(s["field"]))
        cols = () if m["cols"] == "*" else tuple(unquote(c.strip()) for c in m["cols"].split(","))
        return Select(_source(m["from"]), where, cols)
    raise Unsupported(f"the stand-in answers SHOW DATABASES, SHOW TAG VALUES and simple SELECTs only: {q}")


# -- SQL -----------------------------------------------------------------------------------------------
def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def where_sql(cond: Condition, columns: set[str], default_start_ns: int | None = None) -> str:
    """The ``WHERE`` clause over a table with ``columns``: a missing tag is null, so its match is false."""
    parts = []
    start = cond.start_ns if cond.has_time else default_start_ns
    if start is not None:
        parts.append(f"time >= to_timestamp_nanos({start})")
    if cond.stop_ns is not None:
        parts.append(f"time < to_timestamp_nanos({cond.stop_ns})")
    for match in cond.tags:
        terms = [f"{ident(t)} = {literal(v)}" if t in columns else "FALSE" for t, v in match.terms]
        parts.append("(" + " OR ".join(terms) + ")")
    return " WHERE " + " AND ".join(parts) if parts else ""


def select_sql(s: Select, tags: set[str], fields: list[str]) -> tuple[str, list[str]] | None:
    """The SQL of a SELECT on a table with those tags and fields, and the answer's column names; None
    when it selects no field the table has (IOx answers no series)."""
    columns = set(tags) | set(fields)
    where = where_sql(s.where, columns)
    time = "CAST(time AS BIGINT) AS time"
    if s.selector is not None:
        if s.field not in fields:
            return None
        null = f"{ident(s.field)} IS NOT NULL"
        where = f"{where} AND {null}" if where else f" WHERE {null}"
        order = "ASC" if s.selector == "first" else "DESC"
        sql = f"SELECT {time}, {ident(s.field)} AS {ident(s.selector)} FROM {ident(s.source.measurement)}{where} ORDER BY time {order} LIMIT 1"
        return sql, ["time", s.selector]
    names = sorted(columns) if not s.columns else list(s.columns)
    chosen = [f for f in names if f in fields]
    if not chosen:
        return None
    any_field = " OR ".join(f"{ident(f)} IS NOT NULL" for f in chosen)
    where = f"{where} AND ({any_field})" if where else f" WHERE ({any_field})"
    cols = ", ".join(ident(c) if c in columns else f"NULL AS {ident(c)}" for c in names)
    return f"SELECT {time}, {cols} FROM {ident(s.source.measurement)}{where} ORDER BY time", ["time", *names]


def tag_values_sql(s: ShowTagValues, tags: set[str], fields: list[str], now_ns: int) -> str | None:
    """``SHOW TAG VALUES`` as SQL (P ``show_tag_values``: the last day unless a time condition is given)."""
    if s.key not in tags:
        return None
    where = where_sql(s.where, set(tags) | set(fields), now_ns - DAY_NS)
    return f"SELECT DISTINCT CAST({ident(s.key)} AS VARCHAR) AS value FROM {ident(s.source.measurement)}{where} ORDER BY value"
