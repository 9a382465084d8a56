"""Late points reach the 1m and 1h tiers: proven on a real InfluxDB 1.x, and the 2.x tasks re-read the same span.

No InfluxDB 2 runs here, so the proof runs the aggregation the way a 1.x continuous query does on the
real influxd: each run executes the continuous query's own ``SELECT ... INTO`` over the range the
1.x continuous-query service computes for it (:func:`cq_range`). The span each run re-reads is taken
from the generated Flux task's AST, so the 2.x task and the 1.x query are held to the same look-back.
Then ``gpulse recompute`` (v1 on the real server, v2 against the 2.9.1 stand-in) and the advice
``gpulse upload`` prints for what is older than the look-back, run as printed.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import time
from statistics import mean

import pytest
from support import flux_parser
from support.fake_influx_v2_admin import FakeInfluxV2Admin
from support.fixtures import REPO, gpulse_cmd
from support.influxd import InfluxDB1

from gpulse.cli.commands.recompute import chunks, parse_time
from gpulse.influx.connection import Connection
from gpulse.influx.downsample import (
    TIERS,
    covered_since,
    downsampled_measurements,
    flux_query,
    flux_task,
    influxql_select,
    lookback_advice,
    parse_duration,
)
from gpulse.influx.setup.v1 import setup_v1

pytestmark = pytest.mark.influxdb
MINUTE, HOUR = 60 * 10**9, 3600 * 10**9


@pytest.fixture
def server(tmp_path):
    s = InfluxDB1(tmp_path / "influxd").start()
    setup_v1(Connection(url=s.url, api="v1", bucket="gpulse"))
    yield s
    s.stop()


def task_lookback(tier) -> int:
    """The span a 2.x task run re-reads, from its Flux: ``start = date.sub(d: L, from: stop)``."""
    bounds = flux_parser.assignments(flux_parser.parse(flux_task(tier)))
    (sub,) = [c for c in flux_parser.calls({"body": [bounds["start"]]}, "date.sub")]
    return parse_duration(flux_parser.source(sub["d"]))


def cq_range(tier, now: int, *, resample_for: int) -> tuple[int, int]:
    """The range InfluxDB 1.x's continuous-query service runs a query over at ``now``, when it is due
    (``services/continuous_querier/service.go`` ``ExecuteContinuousQuery``, v1.6.6: with the GROUP BY
    interval below RESAMPLE EVERY, ``startTime = truncate(nextRun + interval - for - 1)`` and
    ``endTime = truncate(now)``, both to the interval; ``nextRun`` is ``now`` for a run on time)."""
    interval = parse_duration(tier.window)
    start = (now + interval - resample_for - 1) // interval * interval
    return start, now // interval * interval


def run_cq(server: InfluxDB1, tier, now: int, *, resample_for: int | None = None) -> None:
    """One run of every continuous query of ``tier`` at ``now``: the query's own SELECT over its range."""
    start, end = cq_range(tier, now, resample_for=task_lookback(tier) if resample_for is None else resample_for)
    for m in downsampled_measurements():
        server.query(influxql_select(tier, m.name, "gpulse", start, end), db="gpulse")


def gpu_line(ts: int, util: float, gpu: str = "0") -> str:
    return f"gpu,host=node1,gpu={gpu},uuid=GPU-{gpu},model=H100 util_gpu_pct={util} {ts}\n"


def tier_row(server: InfluxDB1, rp: str, ts: int) -> dict:
    rows = server.rows(f'SELECT * FROM "gpulse"."{rp}"."gpu" WHERE time = {ts} GROUP BY *', epoch="ns")
    assert len(rows) == 1, rows
    return rows[0]


def test_the_continuous_queries_on_the_server_resample_the_span_the_flux_tasks_reread(server):
    cqs = {
        r["name"]: r["query"] for r in server.rows("SHOW CONTINUOUS QUERIES", db="") if r["name"].startswith("gpulse_")
    }
    for tier in TIERS:
        every, lookback = tier.every, tier.lookback
        for name, q in cqs.items():
            if name.startswith(f"gpulse_{tier.name}_"):
                assert f"RESAMPLE EVERY {every} FOR {lookback}" in q
        assert parse_duration(lookback) == task_lookback(tier)


def test_points_that_arrive_after_their_window_ran_reach_the_1m_and_1h_tiers(server):
    h0 = (time.time_ns() // HOUR - 4) * HOUR  # four hours ago: inside the raw retention, windows all past
    minute, hour = TIERS
    server.write("".join(gpu_line(h0 + 3 * MINUTE + s * 10**9, 10.0) for s in range(0, 60, 10)))
    run_cq(server, minute, h0 + 10 * MINUTE)
    assert tier_row(server, "1m", h0 + 3 * MINUTE)["util_gpu_pct"] == 10.0

    server.write("".join(gpu_line(h0 + 3 * MINUTE + s * 10**9, 100.0) for s in (5, 15, 25)))  # late: after the run

    # What a 2.9 task without the look-back does (lastSuccess falls back to -every): the minute is missed.
    run_cq(server, minute, h0 + 20 * MINUTE, resample_for=parse_duration(minute.every))
    assert tier_row(server, "1m", h0 + 3 * MINUTE)["util_gpu_pct"] == 10.0

    run_cq(server, minute, h0 + 20 * MINUTE)  # the next run re-reads its look-back
    late_mean = mean([10.0] * 6 + [100.0] * 3)
    row = tier_row(server, "1m", h0 + 3 * MINUTE)
    assert row["util_gpu_pct"] == pytest.approx(late_mean) and row["util_gpu_pct_max"] == 100.0

    run_cq(server, hour, h0 + HOUR)
    row = tier_row(server, "1h", h0)
    assert row["util_gpu_pct"] == pytest.approx(late_mean) and row["util_gpu_pct_max"] == 100.0

    # Later still: an hour after the 1h tier ran, a replayed spool brings another minute of the same hour.
    server.write("".join(gpu_line(h0 + 5 * MINUTE + s * 10**9, 50.0) for s in range(0, 60, 10)))
    run_cq(server, minute, h0 + 2 * HOUR)
    run_cq(server, hour, h0 + 3 * HOUR)
    assert tier_row(server, "1m", h0 + 5 * MINUTE)["util_gpu_pct"] == 50.0
    row = tier_row(server, "1h", h0)
    assert row["util_gpu_pct"] == pytest.approx(mean([late_mean, 50.0]))  # mean of the minute means
    assert row["util_gpu_pct_min"] == 10.0 and row["util_gpu_pct_max"] == 100.0


def test_a_minute_outside_the_lookback_is_not_rewritten_by_the_next_runs(server):
    """The limit the advice and `gpulse recompute` are for: a point older than the look-back stays out."""
    minute = TIERS[0]
    now = (time.time_ns() // HOUR) * HOUR
    old = now - parse_duration(minute.lookback) - 30 * MINUTE
    server.write(gpu_line(old, 42.0))
    run_cq(server, minute, now)
    assert server.rows(f'SELECT * FROM "gpulse"."1m"."gpu" WHERE time = {old // MINUTE * MINUTE}') == []
    assert old < covered_since(now)


# -- gpulse recompute ---------------------------------------------------------------------------------
def test_recompute_fills_both_tiers_of_an_old_range_on_influxdb_1(server, clean_env):
    day0 = (time.time_ns() // (24 * HOUR) - 3) * 24 * HOUR  # three days ago: older than any look-back
    lines = [
        gpu_line(day0 + h * HOUR + m * MINUTE, float(h * 10 + m), gpu) for h in (1, 2) for m in (0, 1) for gpu in "01"
    ]
    server.write("".join(lines))
    start, stop = day0 + HOUR, day0 + 3 * HOUR
    r = subprocess.run(
        gpulse_cmd(
            "recompute", "--api", "v1", "--url", server.url, "--bucket", "gpulse",
            "--start", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start // 10**9)),
            "--stop", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stop // 10**9)), "--chunk", "1h",
        ),
        env=clean_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "(1/2)" in r.stdout and "(2/2)" in r.stdout and "2 range(s) recomputed" in r.stdout
    minutes = server.rows('SELECT * FROM "gpulse"."1m"."gpu" GROUP BY *', epoch="ns")
    assert {(m["gpu"], m["time"]) for m in minutes} == {
        (g, day0 + h * HOUR + m * MINUTE) for h in (1, 2) for m in (0, 1) for g in "01"
    }
    hours = {(r["gpu"], r["time"]): r for r in server.rows('SELECT * FROM "gpulse"."1h"."gpu" GROUP BY *', epoch="ns")}
    assert set(hours) == {(g, day0 + h * HOUR) for h in (1, 2) for g in "01"}
    assert hours[("0", day0 + 2 * HOUR)]["util_gpu_pct"] == pytest.approx(20.5)
    assert hours[("0", day0 + 2 * HOUR)]["util_gpu_pct_max"] == 21.0


def test_recompute_on_influxdb_2_runs_the_task_pipelines_a_chunk_at_a_time_minute_tier_first(tmp_path, clean_env):
    with FakeInfluxV2Admin() as fake:
        fake.add_bucket("gpulse_1m")  # the 1h pipeline reads it: a Flux from() of a missing bucket is 404
        token = tmp_path / "token"
        token.write_text(fake.state.operator_token + "\n")
        token.chmod(0o600)
        day = 24 * HOUR
        start = (time.time_ns() // day - 10) * day + 90 * MINUTE  # widened to the hour before
        r = subprocess.run(
            gpulse_cmd(
                "recompute", "--url", fake.url, "--token-file", str(token), "--start",
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start // 10**9)), "--stop",
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((start + day) // 10**9)),
            ),
            env=clean_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        pieces = chunks(start, start + day, day)
        assert pieces == [
            (start - 30 * MINUTE, start - 30 * MINUTE + day),
            (start - 30 * MINUTE + day, start + day + 30 * MINUTE),
        ]
        assert fake.state.queries == [flux_query(t, "gpulse", a, b) for a, b in pieces for t in TIERS]
        queries = [c for c in fake.requests if c.path == "/api/v2/query"]
        assert all(c.params == {"org": "gpulse"} and c.status == 200 for c in queries)


@pytest.mark.parametrize(
    ("text", "want"),
    [("2026-01-05T10:30:00Z", 1767609000 * 10**9), ("2026-01-05", 1767571200 * 10**9), ("3d", 10**18 - 3 * 24 * HOUR)],
)
def test_recompute_reads_rfc3339_dates_and_durations_ago(text, want):
    assert parse_time(text, 10**18) == want


# -- the advice gpulse upload prints ------------------------------------------------------------------
def test_points_within_the_lookback_need_no_advice_older_ones_get_the_command():
    conn = Connection(url="http://db:8086", api="v2", org="ml", bucket="gpu", token="t", token_source="file /etc/t")
    now = 1_800_000_000 * 10**9
    assert lookback_advice(now - HOUR, now, conn, now_ns=now) is None
    assert lookback_advice(covered_since(now), now, conn, now_ns=now) is None
    advice = lookback_advice(now - 30 * HOUR - 1, now - 29 * HOUR, conn, now_ns=now)
    assert advice is not None and "older than the 6h the downsampling re-aggregates by itself" in advice
    command = advice.splitlines()[-1].strip()
    assert shlex.split(command) == [
        "gpulse", "recompute", "--start", "2027-01-14T01:00:00Z", "--stop", "2027-01-14T04:00:00Z",
        "--url", "http://db:8086", "--org", "ml", "--bucket", "gpu", "--token-file", "/etc/t",
    ]  # fmt: skip
    from_file = dataclasses.replace(conn, config_path="/etc/gpulse.toml")  # the settings came from a config file
    command = lookback_advice(now - 30 * HOUR, now, from_file, now_ns=now).splitlines()[-1].strip()
    assert shlex.split(command)[6:8] == ["--config", "/etc/gpulse.toml"]


def test_the_recompute_commands_the_influxdb_readme_shows_run_as_shown(server, tmp_path, clean_env):
    text = (REPO / "influxdb" / "README.md").read_text()
    block = text[text.index("```sh\ngpulse recompute") + len("```sh\n") :]
    lines = [ln.split("#")[0].strip() for ln in block[: block.index("```")].splitlines() if ln.strip()]
    assert len(lines) == 2 and all(ln.startswith("gpulse recompute ") for ln in lines)
    with FakeInfluxV2Admin() as fake:  # the stack `make up` started: its admin token in secrets/
        fake.add_bucket("gpulse_1m")  # made by the stack's `gpulse setup`
        (tmp_path / "secrets").mkdir()
        (tmp_path / "secrets" / "influxdb-admin-token").write_text(fake.state.operator_token + "\n")
        (tmp_path / "secrets" / "influxdb-admin-token").chmod(0o600)
        v2 = subprocess.run(
            gpulse_cmd(*shlex.split(lines[0])[1:]), cwd=tmp_path, env=clean_env | {"GPULSE_URL": fake.url},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert v2.returncode == 0, v2.stderr
        day = 24 * HOUR
        jan5 = parse_time("2026-01-05", 0)
        assert fake.state.queries == [flux_query(t, "gpulse", a, a + day) for a in (jan5, jan5 + day) for t in TIERS]
    v1 = subprocess.run(
        gpulse_cmd(*shlex.split(lines[1])[1:]), env=clean_env | {"GPULSE_URL": server.url},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert v1.returncode == 0, v1.stderr
    assert "(4/4)" in v1.stdout or "(3/3)" in v1.stdout  # 72 h and the hours the range is widened to


def test_upload_of_an_old_recording_prints_the_recompute_command_and_it_fills_both_tiers(server, tmp_path, clean_env):
    old = (time.time_ns() // HOUR - 50) * HOUR  # two days ago: past every look-back, inside the raw retention
    recording = tmp_path / "node.lp"
    recording.write_text(
        "".join(gpu_line(old + m * MINUTE + s * 10**9, float(m), "0") for m in range(3) for s in (0, 30))
    )
    up = subprocess.run(
        gpulse_cmd("upload", str(recording), "--api", "v1", "--url", server.url, "--bucket", "gpulse"),
        env=clean_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert "older than the 6h the downsampling re-aggregates by itself" in up.stdout
    command = up.stdout.strip().splitlines()[-1].strip()
    assert command.startswith("gpulse recompute ")
    assert server.rows('SELECT * FROM "gpulse"."1m"."gpu"') == []  # no continuous query reaches that far back
    r = subprocess.run(
        gpulse_cmd(*shlex.split(command)[1:]), env=clean_env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    minutes = server.rows('SELECT "util_gpu_pct" FROM "gpulse"."1m"."gpu"', epoch="ns")
    assert [(m["time"], m["util_gpu_pct"]) for m in minutes] == [(old + m * MINUTE, float(m)) for m in range(3)]
    assert server.rows('SELECT "util_gpu_pct" FROM "gpulse"."1h"."gpu"', epoch="ns")[0]["util_gpu_pct"] == 1.0

    recent = tmp_path / "recent.lp"
    recent.write_text(gpu_line(time.time_ns() - 10 * MINUTE, 5.0))
    quiet = subprocess.run(
        gpulse_cmd("upload", str(recent), "--api", "v1", "--url", server.url, "--bucket", "gpulse"),
        env=clean_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert quiet.returncode == 0 and "recompute" not in quiet.stdout
