"""`gpulse setup --api v1` against a real InfluxDB 1.x (Debian's influxd), and the downsampling it installs."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import defaultdict
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from statistics import mean

import pytest
from support.fixtures import REPO, gpulse_cmd
from support.influxd import InfluxDB1

from gpulse.influx.connection import Connection
from gpulse.influx.downsample import TIERS, continuous_queries, parse_duration, pipelines
from gpulse.influx.setup.common import shard_group_seconds
from gpulse.influx.setup.v1 import downsample_now, setup_v1
from gpulse.lineprotocol.encode import Encoder

pytestmark = pytest.mark.influxdb
MINUTE = 60 * 10**9


@pytest.fixture
def server(tmp_path):
    """A real InfluxDB 1.x with no database at all: setup has to create everything."""
    s = InfluxDB1(tmp_path / "influxd").start()
    yield s
    s.stop()


def snapshot(s: InfluxDB1) -> tuple:
    rps = s.query('SHOW RETENTION POLICIES ON "gpulse"')["results"][0]["series"][0]["values"]
    cqs = s.query("SHOW CONTINUOUS QUERIES")["results"][0]["series"]
    dbs = s.query("SHOW DATABASES")["results"][0]["series"][0]["values"]
    return rps, cqs, dbs


def run_setup(s: InfluxDB1, clean_env, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpulse_cmd("setup", "--api", "v1", "--url", s.url, *extra),
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_setup_creates_database_retention_policies_and_continuous_queries_once(server, clean_env):
    first = run_setup(server, clean_env)
    assert first.returncode == 0, first.stderr
    rps = {r[0]: r for r in snapshot(server)[0]}
    assert rps["raw"][1:] == ["720h0m0s", "24h0m0s", 1, True]
    assert rps["1m"][1] == "9600h0m0s" and rps["1m"][4] is False
    assert rps["1h"][1] == "0s" and rps["1h"][4] is False
    names = {row[0] for series in snapshot(server)[1] if series["name"] == "gpulse" for row in series["values"]}
    assert names == set(continuous_queries("gpulse"))
    assert "created   continuous query gpulse_1m_gpu" in first.stdout

    before = snapshot(server)
    second = run_setup(server, clean_env)
    assert second.returncode == 0, second.stderr
    assert snapshot(server) == before
    assert "created" not in second.stdout and "updated" not in second.stdout
    assert f"{len(continuous_queries()) + 4} unchanged" in second.stdout


def test_a_changed_retention_is_altered_and_a_changed_continuous_query_replaced(server):
    conn = Connection(url=server.url, api="v1", bucket="gpulse")
    setup_v1(conn)
    server.query('DROP CONTINUOUS QUERY "gpulse_1h_agent" ON "gpulse"')
    server.query(
        'CREATE CONTINUOUS QUERY "gpulse_1h_agent" ON "gpulse" BEGIN SELECT mean("cycle_ms") AS "cycle_ms" '
        'INTO "gpulse"."1h"."agent" FROM "gpulse"."1m"."agent" GROUP BY time(1h), * END'
    )
    server.query(
        'CREATE CONTINUOUS QUERY "gpulse_1m_retired" ON "gpulse" BEGIN SELECT mean("x") INTO "gpulse"."1m"."old" FROM "old" GROUP BY time(1m) END'
    )

    report = setup_v1(conn, raw_retention="7d")
    assert sorted(report.changed()) == [
        "deleted continuous query gpulse_1m_retired (no longer in the schema)",
        "updated continuous query gpulse_1h_agent",
        "updated retention policy gpulse.raw (7d, default)",
    ]
    rows = {r["name"]: r["query"] for r in server.rows("SHOW CONTINUOUS QUERIES")}
    assert "RESAMPLE EVERY 1h FOR 8h" in rows["gpulse_1h_agent"] and "gpulse_1m_retired" not in rows
    assert setup_v1(conn, raw_retention="7d").changed() == []


def test_a_retention_shortened_below_its_shard_duration_gets_a_new_shard_duration(server):
    """1.x refuses ``ALTER ... DURATION 12h`` on a 30 d policy (1 d shards); setup sends SHARD DURATION too."""
    conn = Connection(url=server.url, api="v1", bucket="gpulse")
    setup_v1(conn)
    with pytest.raises(RuntimeError, match="retention policy duration must be greater than the shard duration"):
        server.query('ALTER RETENTION POLICY "raw" ON "gpulse" DURATION 12h')  # what setup sent before

    report = setup_v1(conn, raw_retention="12h", minute_retention="3d")
    assert sorted(report.changed()) == [
        "updated retention policy gpulse.1m (3d)",
        "updated retention policy gpulse.raw (12h, default)",
    ]
    rps = {
        r["name"]: (r["duration"], r["shardGroupDuration"]) for r in server.rows('SHOW RETENTION POLICIES ON "gpulse"')
    }
    assert rps["raw"] == ("12h0m0s", "1h0m0s") and rps["1m"] == ("72h0m0s", "24h0m0s")
    assert rps["1h"] == ("0s", "168h0m0s")  # untouched
    assert setup_v1(conn, raw_retention="12h", minute_retention="3d").changed() == []


def test_the_shard_duration_setup_sends_is_the_one_influxdb_gives_a_new_policy(server):
    server.create_database("rules")
    durations = ["1h", "12h", "47h", "2d", "30d", "179d", "180d", "400d", "INF"]
    for i, d in enumerate(durations):
        server.query(f'CREATE RETENTION POLICY "p{i}" ON "rules" DURATION {d} REPLICATION 1')
    got = {r["name"]: r["shardGroupDuration"] for r in server.rows('SHOW RETENTION POLICIES ON "rules"')}
    for i, d in enumerate(durations):
        assert parse_duration(got[f"p{i}"]) // 10**9 == shard_group_seconds(parse_duration(d) // 10**9), d


def test_an_existing_database_keeps_its_data_and_gets_raw_as_default(server):
    server.create_database("gpulse")  # with InfluxDB's own default policy autogen
    server.write("gpu,host=a,gpu=0 util_gpu_pct=5 1000000000")
    report = setup_v1(Connection(url=server.url, api="v1", bucket="gpulse"))
    assert ("unchanged", "database gpulse") in report.actions
    rps = {r["name"]: r["default"] for r in server.rows('SHOW RETENTION POLICIES ON "gpulse"')}
    assert rps == {"autogen": False, "raw": True, "1m": False, "1h": False}
    assert server.count("gpu", "util_gpu_pct", where="time >= 0") == 0  # default rp is raw now
    assert server.rows('SELECT "util_gpu_pct" FROM "gpulse"."autogen"."gpu"')[0]["util_gpu_pct"] == 5


def test_wrong_credentials_give_a_clear_error(tmp_path, clean_env):
    s = InfluxDB1(tmp_path / "influxd", auth=True).start()
    try:
        s.query("CREATE USER admin WITH PASSWORD 'right' WITH ALL PRIVILEGES")
        creds = tmp_path / "creds"
        creds.write_text("admin:N0t-The-Pa55word\n")
        creds.chmod(0o600)
        bad = run_setup(s, clean_env, "--token-file", str(creds))
        assert bad.returncode == 1
        assert "refused the credentials" in bad.stderr and "401" in bad.stderr and "N0t-The-Pa55word" not in bad.stderr
        creds.write_text("admin:right\n")
        good = run_setup(s, clean_env, "--token-file", str(creds))
        assert good.returncode == 0, good.stderr
    finally:
        s.stop()


def test_a_server_that_is_not_influxdb_gives_a_clear_error(tmp_path, clean_env):
    web = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: SimpleHTTPRequestHandler(*a, directory=str(tmp_path)))
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        for api in ("v1", "v2"):
            r = subprocess.run(
                gpulse_cmd("setup", "--api", api, "--url", f"http://127.0.0.1:{web.server_address[1]}"),
                env=clean_env | {"GPULSE_TOKEN": "x:y"},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 1
            assert "not InfluxDB" in r.stderr and "X-Influxdb-Version" in r.stderr, r.stderr
    finally:
        web.shutdown()
        web.server_close()


def test_influxdb_1x_asked_for_the_v2_setup_says_to_use_api_v1(server, clean_env):
    r = subprocess.run(
        gpulse_cmd("setup", "--url", server.url),
        env=clean_env | {"GPULSE_TOKEN": "t"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "use --api v1" in r.stderr


# -- the downsampling itself, on the real server -----------------------------------------------------
def raw_points(t0: int) -> tuple[str, list[dict]]:
    """Two GPUs over three minutes, uneven sampling, slow fields on some points; plus a training step series."""
    enc = Encoder()
    lines, points = [], []
    for gpu in ("0", "1"):
        series = enc.series("gpu", {"host": "node1", "gpu": gpu, "uuid": f"GPU-{gpu}", "model": "H100"})
        for i in range(0, 180, 7 if gpu == "0" else 11):
            fields = {
                "util_gpu_pct": float((i * 13 + int(gpu) * 29) % 101),
                "mem_used_bytes": 10**9 + i * 12_345 + int(gpu),
                "energy_mj": 5_000_000 + i * 700,
            }
            if i % 3 == 0:
                fields["temp_gpu_c"] = 40.0 + (i % 17)
            ts = t0 + i * 10**9
            lines.append(enc.line(series, fields, ts))
            points.append({"m": "gpu", "tags": ("node1", gpu), "ts": ts, **fields})
    step = enc.series(
        "train_step", {"host": "node1", "run": "r1", "rank": "0", "local_rank": "0", "world_size": "1", "team": "x"}
    )
    for i in range(0, 150, 5):
        fields = {"step_time_s": 0.2 + (i % 7) / 100, "step": i // 5, "tokens": 4096 + i}
        ts = t0 + i * 10**9
        lines.append(enc.line(step, fields, ts))
        points.append({"m": "train_step", "tags": ("node1", "r1", "x"), "ts": ts, **fields})
    return "".join(lines), points


def expected_1m(points: list[dict], m: str, gauges: list[str], counters: list[str]) -> dict:
    groups: dict = defaultdict(list)
    for p in points:
        if p["m"] == m:
            groups[(p["tags"], p["ts"] // MINUTE * MINUTE)].append(p)
    out = {}
    for key, ps in groups.items():
        row = {}
        for f in gauges:
            vals = [p[f] for p in ps if f in p]
            if vals:
                row |= {f: mean(vals), f + "_max": max(vals), f + "_min": min(vals)}
        for f in counters:
            row[f] = max(ps, key=lambda p: p["ts"])[f]
        out[key] = row
    return out


def test_downsampling_on_the_real_server_matches_values_computed_in_python(server):
    conn = Connection(url=server.url, api="v1", bucket="gpulse")
    setup_v1(conn)
    hour = 60 * MINUTE
    t0 = time.time_ns() // hour * hour - hour  # inside the raw retention, on an hour boundary (for the 1h check)
    text, points = raw_points(t0)
    server.write(text)  # default retention policy: raw

    written = downsample_now(conn, t0, t0 + 3 * MINUTE)
    assert written > 0

    gpu = {
        (("node1", r["gpu"]), r["time"]): r
        for r in server.rows('SELECT * FROM "gpulse"."1m"."gpu" GROUP BY *', epoch="ns")
    }
    want = expected_1m(points, "gpu", ["util_gpu_pct", "mem_used_bytes", "temp_gpu_c"], ["energy_mj"])
    assert set(gpu) == set(want) and len(want) == 6
    for key, row in want.items():
        for f, v in row.items():
            assert gpu[key][f] == pytest.approx(v), (key, f)
        assert {k for k, v in gpu[key].items() if v is not None} - {
            "time",
            "host",
            "gpu",
            "uuid",
            "model",
            "_measurement",
        } == set(row)
    assert all(r["uuid"] == f"GPU-{r['gpu']}" and r["model"] == "H100" for r in gpu.values())  # tags kept

    steps = server.rows('SELECT * FROM "gpulse"."1m"."train_step" GROUP BY *', epoch="ns")
    want_steps = expected_1m(points, "train_step", ["step_time_s", "tokens"], ["step"])
    assert {(("node1", "r1", r["team"]), r["time"]) for r in steps} == set(want_steps)  # user tag kept
    for r in steps:
        exp = want_steps[(("node1", "r1", r["team"]), r["time"])]
        assert r["step"] == exp["step"] and r["step_time_s_max"] == pytest.approx(exp["step_time_s_max"])
        assert r["tokens"] == pytest.approx(exp["tokens"])

    hourly = server.rows('SELECT * FROM "gpulse"."1h"."gpu" GROUP BY *', epoch="ns")
    assert len(hourly) == 2
    for r in hourly:
        minutes = [v for (tags, _), v in want.items() if tags == ("node1", r["gpu"])]
        assert r["time"] == t0
        assert r["util_gpu_pct"] == pytest.approx(mean(m["util_gpu_pct"] for m in minutes))
        assert r["util_gpu_pct_max"] == max(m["util_gpu_pct_max"] for m in minutes)
        assert r["mem_used_bytes_min"] == min(m["mem_used_bytes_min"] for m in minutes)
        assert r["energy_mj"] == max(m["energy_mj"] for m in minutes)

    keys = {r["fieldKey"] for r in server.rows('SHOW FIELD KEYS FROM "gpulse"."1m"."gpu"')}
    assert keys <= {out for p in pipelines(TIERS[0]) for _, out in p.outputs("gpu")}
    types = {r["fieldKey"]: r["fieldType"] for r in server.rows('SHOW FIELD KEYS FROM "gpulse"."1m"."gpu"')}
    assert (
        types["mem_used_bytes"] == "float"
        and types["mem_used_bytes_max"] == "integer"
        and types["energy_mj"] == "integer"
    )


def test_the_repository_names_the_generated_continuous_queries_file():
    path = REPO / "influxdb" / "v1" / "continuous-queries.influxql"
    text = path.read_text()
    assert all(q in text for q in continuous_queries("gpulse").values())
