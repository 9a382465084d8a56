"""The downsampling plan is derived from the schema, and the 2.x tasks and 1.x continuous queries agree on it."""

from __future__ import annotations

import re

import pytest
from support import flux_parser

from gpulse import schema
from gpulse.influx import downsample
from gpulse.influx.downsample import (
    TIERS,
    align,
    continuous_queries,
    flux_query,
    flux_task,
    influxql_select,
    lookback_ns,
    parse_duration,
    pipelines,
    window_ns,
)


def expected_outputs() -> dict[str, set[str]]:
    """What the schema says each downsampled measurement keeps, worked out here independently."""
    out: dict[str, set[str]] = {}
    for m in schema.MEASUREMENTS.values():
        if not m.downsampled:
            continue
        names: set[str] = set()
        for f in m.fields:
            if f.type not in ("float", "int") or f.kind == "info":
                continue
            names |= {f.name} if f.kind == "counter" else {f.name, f.name + "_max", f.name + "_min"}
        if names:
            out[m.name] = names
    return out


def cq_outputs(statements: list[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in statements:
        m = re.search(r'INTO "[^"]+"\."[^"]+"\."([^"]+)"', s)
        assert m, s
        out.setdefault(m.group(1), set()).update(re.findall(r'\) AS "([^"]+)"', s))
    return out


def flux_outputs(text: str) -> dict[str, set[str]]:
    """Fields a task writes, read back from its Flux: each pipeline's field regexes plus its rename suffix."""
    out: dict[str, set[str]] = {}
    for block in re.split(r"\n(?=\w+ = \(\) =>)", text)[1:]:
        suffix = re.search(r'_field: r\._field \+ "(\w+)"', block)
        for measurement, fields in re.findall(r'r\._measurement == "(\w+)" and r\._field =~ /\^\(([^)]*)\)\$/', block):
            out.setdefault(measurement, set()).update(
                f + (suffix.group(1) if suffix else "") for f in fields.split("|")
            )
    return out


def tier_outputs(tier) -> dict[str, set[str]]:
    """measurement -> the fields one tier's continuous queries write (the same as its task: tested below)."""
    return cq_outputs(
        [q for name, q in continuous_queries("gpulse").items() if name.startswith(f"gpulse_{tier.name}_")]
    )


def test_gauges_become_mean_max_min_and_counters_last_for_every_downsampled_measurement():
    assert tier_outputs(TIERS[0]) == expected_outputs()
    assert {"gpu", "agent", "train_step"} <= set(expected_outputs())


def test_string_info_and_non_downsampled_fields_are_never_aggregated():
    written = {(m, f) for m, fields in tier_outputs(TIERS[0]).items() for f in fields}
    for m in schema.MEASUREMENTS.values():
        for f in m.fields:
            if f.type == "str" or f.kind == "info" or not m.downsampled:
                assert (m.name, f.name) not in written, f"{m.name}.{f.name} must stay in raw only"
    assert "gpu_info" not in tier_outputs(TIERS[0]) and "train_run" not in tier_outputs(TIERS[0])


def test_the_hourly_tier_writes_the_same_fields_as_the_minute_tier():
    assert tier_outputs(TIERS[1]) == tier_outputs(TIERS[0])


def test_continuous_queries_and_flux_tasks_write_exactly_the_same_fields():
    for tier in TIERS:
        assert tier_outputs(tier) == flux_outputs(flux_task(tier)) == expected_outputs(), tier.name


def test_the_hourly_tier_reads_the_minute_tier_and_reaggregates_its_extremes():
    cq = influxql_select(TIERS[1], "gpu", "gpulse")
    assert 'FROM "gpulse"."1m"."gpu"' in cq and 'INTO "gpulse"."1h"."gpu"' in cq
    assert 'max("util_gpu_pct_max") AS "util_gpu_pct_max"' in cq
    assert 'min("util_gpu_pct_min") AS "util_gpu_pct_min"' in cq
    assert 'last("energy_mj") AS "energy_mj"' in cq
    flux = flux_task(TIERS[1])
    assert 'from(bucket: "gpulse_1m")' in flux and 'to(bucket: "gpulse_1h")' in flux


def test_every_task_run_reaggregates_the_same_lookback_as_the_continuous_query():
    """Read through the Flux parser's AST: the span each run rewrites, where it ends, how it is windowed."""
    for tier in TIERS:
        tree = flux_parser.parse(flux_task(tier))
        assert flux_parser.syntax_errors(tree) == []
        (task,) = flux_parser.options(tree, "task")
        opts = {k: flux_parser.source(v) for k, v in flux_parser.properties(task).items()}
        assert opts == {"name": f'"gpulse_{tier.source}_to_{tier.name}"', "every": tier.every, "offset": tier.offset}
        bounds = {k: flux_parser.source(v) for k, v in flux_parser.assignments(tree).items()}
        assert bounds["stop"] == f"date.truncate(t: now(), unit: {tier.window})"  # now() = the scheduled time
        assert bounds["start"] == f"date.sub(d: {tier.lookback}, from: stop)"
        ranges = [{k: flux_parser.source(v) for k, v in c.items()} for c in flux_parser.calls(tree, "range")]
        assert ranges == [{"start": "start", "stop": "stop"}] * len(pipelines(tier))
        windows = flux_parser.calls(tree, "aggregateWindow")
        assert {flux_parser.source(w["every"]) for w in windows} == {tier.window}
        assert all(flux_parser.source(w["createEmpty"]) == "false" for w in windows)
        assert all(flux_parser.source(w["timeSrc"]) == '"_start"' for w in windows)
        assert "lastSuccess" not in flux_task(tier)  # 2.9 never injects it (flag injectLatestSuccessTime is off)
        assert "drop(" not in flux_task(tier) and "group(" not in flux_task(tier)  # every tag stays in the group key
        cq = continuous_queries()[f"gpulse_{tier.name}_gpu"]
        assert f"RESAMPLE EVERY {tier.every} FOR {tier.lookback}" in cq
        assert f"GROUP BY time({tier.window}), * fill(none)" in cq


@pytest.mark.parametrize(
    ("minute", "hour", "why"),
    [
        (("1m", "5m", "90s"), ("1h", "5m", "8h"), "whole 1m windows"),
        (("1m", "10m", "5m"), ("1h", "5m", "8h"), ">= 10m"),
        (("1m", "10m", "6h"), ("1h", "5m", "7h"), "ends before tier 1m has finished rewriting it"),
    ],
    ids=["part-window", "shorter-than-every", "hour-tier-reads-unfinished-minutes"],
)
def test_the_plan_refuses_a_lookback_that_skips_windows_or_reads_unfinished_ones(monkeypatch, minute, hour, why):
    (w1, e1, l1), (w2, e2, l2) = minute, hour
    tiers = (
        downsample.Tier("1m", w1, "raw", "400d", every=e1, offset="1m", lookback=l1),
        downsample.Tier("1h", w2, "1m", "INF", every=e2, offset="5m", lookback=l2),
    )
    monkeypatch.setattr(downsample, "TIERS", tiers)
    monkeypatch.setattr(downsample, "TIER_BY_NAME", {t.name: t for t in tiers})
    with pytest.raises(ValueError, match=why):
        flux_task(tiers[0])


def test_the_hourly_tier_rewrites_an_hour_last_after_the_minute_tier_has_finished_it():
    minute, hour = TIERS
    assert lookback_ns(hour) >= lookback_ns(minute) + window_ns(hour) + parse_duration(minute.every)


def test_a_continuous_query_runs_the_same_select_as_a_one_off_backfill():
    for tier in TIERS:
        body = influxql_select(tier, "train_step", "gpulse")
        ranged = influxql_select(tier, "train_step", "gpulse", 1, 2)
        assert body in continuous_queries()[f"gpulse_{tier.name}_train_step"]
        assert re.sub(r" WHERE time >= \d+ AND time < \d+", "", ranged) == body


def test_a_backfill_range_is_widened_to_whole_windows_in_both_generations():
    minute, hour = 60 * 10**9, 3600 * 10**9
    q = influxql_select(TIERS[0], "gpu", "gpulse", 10 * minute + 5, 12 * minute + 1)
    assert f"WHERE time >= {10 * minute} AND time < {13 * minute}" in q
    assert align(TIERS[1], hour + 1, 2 * hour) == (hour, 2 * hour)
    bounds = flux_parser.assignments(flux_parser.parse(flux_query(TIERS[1], "gpulse", hour + 1, 2 * hour + 1)))
    assert flux_parser.source(bounds["start"]) == f"time(v: {hour})"
    assert flux_parser.source(bounds["stop"]) == f"time(v: {3 * hour})"


def test_an_output_name_that_collides_with_another_field_is_refused(monkeypatch):
    bad = schema.Measurement(
        "bad",
        "x",
        ("host",),
        (schema.Field("temp", "float", "C", "t"), schema.Field("temp_max", "float", "C", "t")),
    )
    monkeypatch.setitem(downsample.MEASUREMENTS, "bad", bad)
    with pytest.raises(ValueError, match="temp_max"):
        flux_task(TIERS[0])


@pytest.mark.parametrize(
    ("text", "ns"),
    [("30d", 30 * 86400 * 10**9), ("720h0m0s", 720 * 3600 * 10**9), ("1h30m", 5400 * 10**9), ("INF", 0), ("0s", 0)],
)
def test_durations_parse_in_influxql_and_go_spelling(text, ns):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["30x", "d", "10m garbage", "-5m"])
def test_a_bad_duration_is_refused_with_examples(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
