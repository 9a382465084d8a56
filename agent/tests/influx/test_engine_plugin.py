"""Downsampling on InfluxDB 3's processing engine: the plugin is generated from the schema, and its SQL,
run on DataFusion (the engine 3.x queries with), gives every tier value the 1.x continuous queries give
on a real InfluxDB 1.6.7 from the same points, late points included."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from support.engine_v3 import Engine, InvalidLineError, LineBuilder, QueryError, load_plugin
from support.fake_influx_v3 import running
from support.fixtures import REPO
from support.influxd import InfluxDB1

from gpulse.influx import engine_plugin
from gpulse.influx.connection import Connection
from gpulse.influx.downsample import TIERS, downsampled_measurements, influxql_select, parse_duration, pipelines
from gpulse.influx.engine_plugin import (
    PLUGIN_PATH,
    Edition,
    database_name,
    engine_tiers,
    files_per_block,
    generated_files,
    readable_range_ns,
    triggers,
)
from gpulse.influx.setup.v1 import setup_v1

MINUTE, HOUR = 60 * 10**9, 3600 * 10**9
PLUGIN = REPO / "influxdb" / PLUGIN_PATH


@pytest.fixture(scope="module")
def plugin():
    return load_plugin(PLUGIN)


# -- the generated file ---------------------------------------------------------------------------------
def test_the_checked_in_plugin_equals_the_generator_output():
    for rel, text in generated_files().items():
        assert (REPO / "influxdb" / rel).read_text(encoding="utf-8") == text, f"influxdb/{rel}: run make generate"
    r = subprocess.run(
        [sys.executable, "-m", "gpulse.influx.engine_plugin", "--check", str(REPO / "influxdb")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_the_check_mode_reports_a_stale_plugin(tmp_path):
    subprocess.run([sys.executable, "-m", "gpulse.influx.engine_plugin", "--write", str(tmp_path)], check=True)
    (tmp_path / PLUGIN_PATH).write_text((tmp_path / PLUGIN_PATH).read_text() + "# edited by hand\n")
    r = subprocess.run(
        [sys.executable, "-m", "gpulse.influx.engine_plugin", "--check", str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 1 and PLUGIN_PATH in r.stderr


def test_the_plugin_writes_the_same_fields_as_the_continuous_queries_and_flux_tasks(plugin):
    for tier in TIERS:
        written = {m: {out for _, _, out in aggs} for m, aggs in plugin.TIERS[tier.name]["aggregates"].items()}
        by_cqs = {
            m.name: {out for p in pipelines(tier) for _, out in p.outputs(m.name)} for m in downsampled_measurements()
        }
        assert written == {m: names for m, names in by_cqs.items() if names}, tier.name


def test_gauges_are_averaged_and_counters_take_their_last_value_in_time_order(plugin):
    aggs = {out: (fn, src) for fn, src, out in plugin.TIERS["1h"]["aggregates"]["gpu"]}
    assert aggs["util_gpu_pct"] == ("avg", "util_gpu_pct")
    assert aggs["util_gpu_pct_max"] == ("max", "util_gpu_pct_max")  # the 1h tier reads the 1m tier's extremes
    assert aggs["energy_mj"] == ("last_value", "energy_mj")
    assert plugin.aggregate("last_value", "energy_mj") == (
        'last_value("energy_mj" ORDER BY time) FILTER (WHERE "energy_mj" IS NOT NULL)'
    )


# -- triggers and look-backs ------------------------------------------------------------------------------
def test_each_tier_runs_on_a_cron_trigger_at_the_2x_tasks_moments_and_recompute_is_a_request_trigger():
    specs = {t.name: t.specification for t in triggers(Edition.CORE)}
    assert specs == {
        "gpulse_1m": "cron:0 1/10 * * * *",  # seconds first (the cron crate): every 10 min at minute 1, 11, ...
        "gpulse_1h": "cron:0 5 * * * *",
        "gpulse_recompute": "request:gpulse_recompute",
    }
    assert {t.arguments["edition"] for t in triggers(Edition.ENTERPRISE)} == {"enterprise"}


def test_each_tier_is_a_database_named_as_influxdb_3_names_a_retention_policy():
    assert [database_name("gpulse", t) for t in ("raw", "1m", "1h")] == ["gpulse", "gpulse/1m", "gpulse/1h"]


def test_enterprise_keeps_the_1x_2x_lookbacks_and_core_keeps_few_parquet_files_per_block():
    assert [t.lookback for t in engine_tiers(Edition.ENTERPRISE)] == [t.lookback for t in TIERS]
    core = engine_tiers(Edition.CORE)
    assert [files_per_block(t) for t in core] == [2, 2]
    assert [readable_range_ns(t) // HOUR for t in core] == [36, 216]
    enterprise = engine_tiers(Edition.ENTERPRISE)
    assert [files_per_block(t) for t in enterprise] == [36, 8]  # what Core would collect without compaction
    assert [readable_range_ns(t) // HOUR for t in enterprise] == [2, 54]


def test_the_readme_states_the_file_arithmetic_the_module_computes():
    readme = (REPO / "influxdb" / "README.md").read_text(encoding="utf-8")
    for t in (*engine_tiers(Edition.CORE), *engine_tiers(Edition.ENTERPRISE)):
        per_day = files_per_block(t) * (24 * HOUR // max(parse_duration(t.window), 10 * MINUTE))
        row = f"| {t.name} | {t.lookback} | {files_per_block(t)} | {per_day} | {readable_range_ns(t) // HOUR} h |"
        assert row in readme, row


def test_a_core_lookback_that_would_read_unfinished_minutes_is_refused(monkeypatch):
    monkeypatch.setitem(engine_plugin.LOOKBACK, Edition.CORE, {"1m": "20m", "1h": "1h"})
    with pytest.raises(ValueError, match="ends before tier 1m is final"):
        engine_tiers(Edition.CORE)


# -- the plugin on the engine --------------------------------------------------------------------------
def test_a_scheduled_run_rewrites_whole_windows_of_its_lookback_ending_at_the_scheduled_time(plugin):
    engine = Engine()
    h0 = 1_800_000_000 * 10**9 // HOUR * HOUR
    engine.write("gpulse", "".join(gpu(h0 + m * MINUTE + 30 * 10**9, util=float(m)) for m in range(-30, 30)))
    engine.run_schedule(plugin, "gpulse", h0 + 21 * MINUTE, {"tier": "1m", "edition": "core"})  # tick 20 + 1 min
    minutes = [r["time"] for r in engine.rows("gpulse/1m", "gpu")]
    assert minutes == [h0 + m * MINUTE for m in range(0, 20)]  # [20 - 20 min, 20): the Core look-back
    assert engine.logs[-1] == ("INFO", f"gpulse 1m: 20 points for [{h0}, {h0 + 20 * MINUTE})")


def test_a_window_with_no_value_of_a_field_writes_the_others_and_a_counter_skips_points_without_it(plugin):
    engine = Engine()
    t = 1_800_000_000 * 10**9 // HOUR * HOUR
    engine.write("gpulse", gpu(t, util=5.0, energy=100) + gpu(t + 10**9, util=7.0) + gpu(t + MINUTE, util=1.0))
    engine.run_request(plugin, "gpulse", {"tier": "1m", "start": str(t), "stop": str(t + 2 * MINUTE)}, {})
    first, second = engine.rows("gpulse/1m", "gpu")
    assert first["energy_mj"] == 100 and first["util_gpu_pct"] == 6.0  # last non-null, not the later null
    assert "energy_mj" not in second and second["util_gpu_pct_max"] == 1.0


def test_recompute_answers_400_with_what_to_send_and_writes_nothing(plugin):
    engine = Engine()
    status, body = engine.run_request(plugin, "gpulse", {"tier": "1m", "start": "yesterday"}, {})
    assert status == 400 and "Unix nanoseconds" in body["error"]
    status, body = engine.run_request(plugin, "gpulse", {"start": "1", "stop": "2"}, {})
    assert status == 400 and "tier=''" in body["error"]
    assert engine.databases == {}


def test_a_trigger_without_a_known_tier_fails_with_the_argument_to_set(plugin):
    with pytest.raises(ValueError, match="tier='3m'"):
        Engine().run_schedule(plugin, "gpulse", 10**18, {"tier": "3m"})


def test_the_stand_in_refuses_what_the_engine_refuses():
    with pytest.raises(QueryError, match="executing query on gpulse"):
        Engine().sql("gpulse", "SELECT nope FROM gpu")
    with pytest.raises(InvalidLineError, match="At least one field"):
        LineBuilder("gpu").tag("host", "a").build()
    assert LineBuilder("gpu").tag("host", "a b").float64_field("x", 2.0).time_ns(5).build() == "gpu,host=a\\ b x=2.0 5"


# -- the same tiers as InfluxDB 1.x's continuous queries ------------------------------------------------------
def gpu(ts: int, *, util: float, gpu_id: str = "0", energy: int | None = None, run: str | None = None) -> str:
    tags = f"gpu,host=node1,gpu={gpu_id},uuid=GPU-{gpu_id},model=H100" + (f",run={run}" if run else "")
    fields = f"util_gpu_pct={util},mem_used_bytes={int(util * 1e6)}i,clk_idle={int(util) % 2}i"
    return f"{tags} {fields}{f',energy_mj={energy}i' if energy is not None else ''} {ts}\n"


def points(rng: random.Random, start: int, stop: int, step: int) -> str:
    """Every downsampled measurement: GPUs (one with a run tag part of the time, counters every third point),
    NVLink links, GPU processes (the pid, an info field, stays raw), the agent, training steps (a free-form
    user tag on some, an open log_ field that stays raw); and a measurement that is never downsampled."""
    lines, energy = [], 0
    for i, ts in enumerate(range(start, stop, step)):
        energy += rng.randrange(1000, 5000)
        for gpu_id in "01":
            run = "r1" if gpu_id == "1" and (ts // (20 * MINUTE)) % 2 else None
            util = round(rng.uniform(0, 100), 3)
            lines.append(
                gpu(ts + rng.randrange(step), util=util, gpu_id=gpu_id, energy=energy if i % 3 == 0 else None, run=run)
            )
        for link in "01":
            nvlink = f"gpu_nvlink,host=node1,gpu=0,uuid=GPU-0,model=H100,link={link}"
            lines.append(f"{nvlink} tx_kib={energy * 3 + int(link)}i,active={int(rng.random() < 0.9)}i {ts}\n")
        lines.append(
            f"gpu_process,host=node1,gpu=0,uuid=GPU-0,model=H100 pid={4000 + i % 2}i,"
            f"mem_used_bytes={rng.randrange(10**9)}i,sm_util_pct={rng.uniform(0, 100)} {ts + 1}\n"
        )
        lines.append(f"agent,host=node1 cycle_ms={rng.uniform(1, 9)},samples={i}i,gpus=2i {ts}\n")
        exp = ",exp=a" if i % 4 == 0 else ""
        lines.append(
            f"train_step,host=node1,run=r1,rank=0,local_rank=0,world_size=1{exp} step={i}i,"
            f"step_time_s={rng.uniform(0.1, 0.5)},tokens={rng.randrange(1000, 2000)}i,log_loss={rng.random()} {ts}\n"
        )
    lines.append(f'gpu_info,host=node1,gpu=0,uuid=GPU-0,model=H100 name="H100" {start}\n')
    return "".join(lines)


def v1_rows(server: InfluxDB1, rp: str, measurement: str) -> list[dict]:
    rows = server.rows(f'SELECT * FROM "gpulse"."{rp}"."{measurement}" GROUP BY *', epoch="ns")
    return [
        {k: v for k, v in r.items() if v not in (None, "") and k != "_measurement"} for r in rows
    ]  # "": no such tag


def series_key(row: dict) -> list[tuple[str, str]]:
    """Tags (the str values) and time: what identifies a point."""
    return sorted((k, v) for k, v in row.items() if isinstance(v, str)) + [("time", str(row["time"]))]


def assert_same_tier(engine: Engine, server: InfluxDB1, tier: str) -> int:
    """Every measurement's points of ``tier``: the same series, times, fields and values (floats to rounding)."""
    compared = 0
    for m in downsampled_measurements():
        ours = sorted(engine.rows(database_name("gpulse", tier), m.name), key=series_key)
        theirs = sorted(v1_rows(server, tier, m.name), key=series_key)
        assert [series_key(r) for r in ours] == [series_key(r) for r in theirs], f"{tier} {m.name}: series differ"
        for a, b in zip(ours, theirs, strict=True):
            assert a.keys() == b.keys(), f"{tier} {m.name} {a['time']}: fields differ"
            fields = [f for f, v in a.items() if not isinstance(v, str)]
            assert [a[f] for f in fields] == pytest.approx([b[f] for f in fields], rel=1e-12, abs=0), series_key(a)
        compared += len(ours)
        if ours:  # JSON spells a float 1.0 as 1: the types come from the stores
            v1_types = server.rows(f'SHOW FIELD KEYS FROM "gpulse"."{tier}"."{m.name}"')
            table = engine.databases[database_name("gpulse", tier)][m.name]
            assert {
                f: str(t).replace("double", "float").replace("int64", "integer") for f, t in table.types.items()
            } == {r["fieldKey"]: r["fieldType"] for r in v1_types}
    return compared


@pytest.mark.influxdb
@pytest.mark.parametrize("edition", list(Edition), ids=[e.value for e in Edition])
def test_the_plugins_tiers_equal_the_continuous_queries_tiers_on_influxdb_1_late_points_included(
    tmp_path, plugin, edition
):
    server = InfluxDB1(tmp_path / "influxd").start()
    try:
        setup_v1(Connection(url=server.url, api="v1", bucket="gpulse"))
        engine, rng = Engine(), random.Random(29)
        h0 = (time.time_ns() // HOUR - 5) * HOUR  # inside the raw retention, every window already past
        minute, hour = engine_tiers(edition)

        def write(lines: str) -> None:
            server.write(lines)
            engine.write("gpulse", lines)

        def run(tier, scheduled: int) -> None:
            """One run at its scheduled time: the 1.x query over [scheduled - lookback, scheduled) on the
            server, the plugin at its cron tick (scheduled + offset) on the engine."""
            back = parse_duration(tier.lookback)
            for m in downsampled_measurements():
                server.query(influxql_select(tier, m.name, "gpulse", scheduled - back, scheduled), db="gpulse")
            tick = scheduled + parse_duration(tier.offset)
            engine.run_schedule(plugin, "gpulse", tick, {"tier": tier.name, "edition": edition.value})

        write(points(rng, h0, h0 + 2 * HOUR, 20 * 10**9))
        for s in range(h0 + 10 * MINUTE, h0 + 2 * HOUR + 1, 10 * MINUTE):
            run(minute, s)
        run(hour, h0 + 2 * HOUR)
        # Late: points for minutes the 1m tier has already written, inside each edition's look-back.
        late_start = h0 + 2 * HOUR - parse_duration(minute.lookback) + 10 * MINUTE
        write(points(rng, late_start, late_start + 5 * MINUTE, 7 * 10**9))
        for s in range(h0 + 2 * HOUR + 10 * MINUTE, h0 + 3 * HOUR + 1, 10 * MINUTE):
            run(minute, s)
        run(hour, h0 + 3 * HOUR)

        assert assert_same_tier(engine, server, "1m") > 2 * 60 * 3  # every minute of both GPUs, agent, train_step
        assert assert_same_tier(engine, server, "1h") >= 2 * 3
        assert engine.rows("gpulse/1m", "gpu_info") == [] and v1_rows(server, "1m", "gpu_info") == []
        assert all("log_loss" not in r for r in engine.rows("gpulse/1m", "train_step"))
        assert all("pid" not in r for r in engine.rows("gpulse/1m", "gpu_process"))
        assert {r["link"] for r in engine.rows("gpulse/1h", "gpu_nvlink")} == {"0", "1"}
        assert {r.get("exp") for r in engine.rows("gpulse/1h", "train_step")} == {"a", None}
    finally:
        server.stop()


# -- on the InfluxDB 3 stand-in, over HTTP ----------------------------------------------------------------
def http(url: str, method: str, path: str, body: bytes | None = None, **params: str) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"{url}{path}?{urllib.parse.urlencode(params)}",
        data=body,
        method=method,
        headers={"Authorization": "Bearer apiv3_admin-token", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    try:
        return status, json.loads(payload) if payload.strip() else None
    except ValueError:
        return status, payload.decode()


def influxql_util(url: str, q: str) -> list[float]:
    _, body = http(url, "GET", "/query", q=q, db="gpulse", epoch="ns")
    (series,) = body["results"][0]["series"]
    return [row[series["columns"].index("util_gpu_pct")] for row in series["values"]]


def test_set_up_over_http_the_tiers_fill_on_their_ticks_and_recompute_fills_an_old_range():
    """What setup will do on 3.x: databases with retention, the plugin file, the triggers; then the agent's
    writes, the cron ticks, ``gpulse recompute`` through the request trigger, and the tiers read back with
    InfluxQL, where ``FROM "1m"."gpu"`` is the raw table and ``FROM "gpulse"."1m"."gpu"`` the tier."""
    with running(token="apiv3_admin-token") as influx3:
        url = influx3.url
        for db, retention in (("gpulse", "30d"), ("gpulse/1m", "400d"), ("gpulse/1h", None)):
            body = {"db": db} | ({"retention_period": retention} if retention else {})
            assert http(url, "POST", "/api/v3/configure/database", json.dumps(body).encode())[0] == 200
        upload = {"plugin_name": "gpulse_downsample.py", "content": PLUGIN.read_text(encoding="utf-8")}
        assert http(url, "POST", "/api/v3/plugins/files", json.dumps(upload).encode())[0] == 200
        for t in triggers(Edition.CORE):
            trigger = {
                "db": "gpulse",
                "plugin_filename": "gpulse_downsample.py",
                "trigger_name": t.name,
                "trigger_specification": t.specification,
                "trigger_arguments": t.arguments,
                "trigger_settings": {"run_async": False, "error_behavior": "log"},
                "disabled": False,
            }
            assert (
                http(url, "POST", "/api/v3/configure/processing_engine_trigger", json.dumps(trigger).encode())[0] == 200
            )

        h0 = 1_800_000_000 * 10**9 // HOUR * HOUR
        lines = "".join(gpu(h0 + s * 10**9, util=float(s % 60)) for s in range(0, 3600, 10))
        assert http(url, "POST", "/api/v2/write", lines.encode(), bucket="gpulse", precision="ns")[0] == 204
        for scheduled in range(h0 + 10 * MINUTE, h0 + HOUR + 1, 10 * MINUTE):
            influx3.run_trigger("gpulse_1m", scheduled + MINUTE)
        influx3.run_trigger("gpulse_1h", h0 + HOUR + 5 * MINUTE)
        assert influxql_util(url, 'SELECT "util_gpu_pct" FROM "gpulse"."1m"."gpu"') == [25.0] * 60  # mean of 0..50
        assert influxql_util(url, 'SELECT "util_gpu_pct" FROM "gpulse"."1h"."gpu"') == [25.0]
        assert len(influxql_util(url, 'SELECT "util_gpu_pct" FROM "1m"."gpu"')) == 360  # the raw points

        old = h0 - 48 * HOUR  # far outside every look-back
        http(url, "POST", "/api/v2/write", gpu(old + 30 * 10**9, util=7.0).encode(), bucket="gpulse")
        for tier in ("1m", "1h"):  # one tier a request: a call's writes land when it returns
            status, answer = http(
                url, "POST", "/api/v3/engine/gpulse_recompute", tier=tier, start=str(old), stop=str(old + HOUR)
            )
            assert (status, answer) == (200, {"tier": tier, "written": 1})
        q = f'SELECT "util_gpu_pct" FROM "gpulse"."1h"."gpu" WHERE time >= {old} AND time < {old + HOUR}'
        assert influxql_util(url, q) == [7.0]
        assert http(url, "GET", "/api/v3/engine/nothing_here") == (404, '{error: "not found"}')  # sic: not JSON
