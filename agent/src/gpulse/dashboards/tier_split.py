"""A query over both tiers a run can live in: raw where raw retention still holds it, 1m before that.

A run older than raw retention (30 d by default) is gone from the raw tier but its steps and its
GPUs' samples are in the 1m tier for 400 days. Grafana cannot pick a datasource or a retention
policy from the age of the time range: a query variable's value comes from the data it returns
(the first string field of each frame), never from a computation on ``$__from``, and InfluxQL has
no conditional that could return a tier's name. What a Grafana InfluxQL query *can* do is filter
on time. So every panel query of the Training run dashboard is sent twice, as two targets of a
panel on the built-in "Mixed" datasource, each to its tier's datasource:

* raw: ``$timeFilter AND time > now() - $raw_retention``;
* 1m: ``$timeFilter AND time <= now() - $raw_retention``, ``FROM "1m"."<m>"``, and ``max``/``min``
  of a gauge read its ``<field>_max``/``<field>_min`` (the tier keeps the mean under the field's name).

The two ranges do not overlap, so nothing is counted twice, and a run wholly inside one of them
(nearly every run) gets one frame, from one target; a run that straddles the boundary shows its
two parts as two series (a stat then shows two values). ``$raw_retention`` is a hidden setting of
the dashboard: its default is gpulse's raw retention, and a stack that keeps raw points for a
different time opens the dashboard with ``var-raw_retention=<duration>``. Logged scalars
(``log_*``) stay in raw only (see :mod:`gpulse.influx.downsample`), so the Loss panel of an old run is empty.
"""

from __future__ import annotations

import re
from dataclasses import replace

from gpulse.dashboards.builder import Panel, Query, Setting
from gpulse.dashboards.influxql import references
from gpulse.influx.tiers import RAW, RAW_RETENTION
from gpulse.schema import MEASUREMENTS

RAW_RETENTION_SETTING = Setting("raw_retention", "Raw retention", RAW_RETENTION)
TIME_FILTER = "$timeFilter"
SPLIT = {
    RAW: f"{TIME_FILTER} AND time > now() - ${RAW_RETENTION_SETTING.name}",
    "1m": f"{TIME_FILTER} AND time <= now() - ${RAW_RETENTION_SETTING.name}",
}
_FROM = re.compile(r'\bFROM "(\w+)"')
_EXTREME = re.compile(r'\b(max|min)\("(\w+)"\)')


def _extreme(measurements: set[str], m: re.Match[str]) -> str:
    fn, name = m.group(1), m.group(2)
    gauge = any((f := MEASUREMENTS[x].by_name.get(name)) is not None and f.downsample == "mean" for x in measurements)
    return f'{fn}("{name}_{fn}")' if gauge else m.group(0)


def in_tier(query: Query, tier: str) -> Query:
    """``query`` (written for the raw tier, every time bound ``$timeFilter``) restricted to its part in ``tier``."""
    if query.tier != RAW or TIME_FILTER not in query.sql:
        raise ValueError(f"a split query reads raw and is bounded by {TIME_FILTER}: {query.sql}")
    sql = query.sql.replace(TIME_FILTER, SPLIT[tier])
    if tier != RAW:
        measurements = {m for m in _FROM.findall(sql) if m in MEASUREMENTS}
        sql = _FROM.sub(lambda m: f'FROM "{tier}"."{m.group(1)}"' if m.group(1) in MEASUREMENTS else m.group(0), sql)
        sql = _EXTREME.sub(lambda m: _extreme(measurements, m), sql)
    return replace(query, sql=sql, tier=tier)


def both_tiers(*queries: Query) -> list[Query]:
    """Each query as its raw part and its 1m part, in that order."""
    return [in_tier(q, tier) for q in queries for tier in (RAW, "1m")]


def downsampled(query: Query) -> bool:
    """Whether the 1m tier holds what the query reads: its measurements and the fields it names."""
    names = _FROM.findall(query.sql)
    if not names or not all(MEASUREMENTS[n].downsampled for n in names):
        return False
    idents = references(query.sql).identifiers
    kept = {f.name for n in names for f in MEASUREMENTS[n].fields if f.downsample}
    tags = {t for n in names for t in MEASUREMENTS[n].all_tags}
    open_fields = {i for i in idents if any(MEASUREMENTS[n].field_type(i) for n in names)} - kept - tags
    return not open_fields


def split_panels(panels: list[Panel]) -> None:
    """Make every panel whose queries all read what the 1m tier keeps read both tiers (the others read raw)."""
    for p in panels:
        if p.queries and all(downsampled(q) for q in p.queries):
            p.queries = both_tiers(*p.queries)
