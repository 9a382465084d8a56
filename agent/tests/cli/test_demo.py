"""``gpulse demo``: a simulated 8-GPU node and training run fill every dashboard, and the run's diagnosis
names what the scenario planted.

The demo runs as a user runs it (``gpulse demo --api v1 --url ...``, a subprocess) against a real
InfluxDB 1.x that ``gpulse setup --api v1`` prepared. Every panel, variable and annotation query of
every dashboard is then run over the dashboard's own default time range, with Grafana's macro and
variable substitution reproduced by :func:`support.grafana_interpolate.interpolate` (no Grafana
server runs here), reusing the dashboards' own query test helpers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import gpulse_cmd
from support.grafana_queries import panel_queries, panel_rows, resolve_variables
from support.influxd import InfluxDB1

from gpulse.dashboards import dashboards
from gpulse.lineprotocol.parse import read_lines
from gpulse.report.phases import PARTS
from gpulse.sources import scenario

pytestmark = pytest.mark.influxdb


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    env["XDG_STATE_HOME"] = str(tmp / "state")
    return env


@pytest.fixture(scope="module")
def demo_run(influxdb_module: InfluxDB1, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("demo")
    env = _env(work)
    setup = subprocess.run(
        gpulse_cmd("setup", "--api", "v1", "--url", influxdb_module.url, "-q"),
        env=env, cwd=work, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert setup.returncode == 0, setup.stdout + setup.stderr
    out = subprocess.run(
        gpulse_cmd("demo", "--api", "v1", "--url", influxdb_module.url, "--out", str(work / "report")),
        env=env, cwd=work, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    print(out.stdout)
    run_id = re.search(r"training run (demo-\d{8}-\d{4})", out.stdout).group(1)
    return {"influx": influxdb_module, "stdout": out.stdout, "run": run_id, "report": work / "report"}


def test_the_demo_prints_its_story_the_grafana_links_and_the_diagnosis_of_the_planted_problems(demo_run: dict) -> None:
    out = demo_run["stdout"]
    run = demo_run["run"]
    for text in ("data-loading bottleneck", "power-capped", "thermal throttling", "checkpoint", "XID 31 on GPU 6"):
        assert text in out, text
    assert re.search(r"wrote \d+ points in [\d.]+ s", out)
    for d in dashboards():
        assert f"/d/{d.uid}" in out
    assert "/d/gpulse-training-run?from=" in out and f"var-run={run}" in out
    assert "DIAGNOSIS:" in out
    report = json.loads((demo_run["report"] / "metrics_report.json").read_text())
    found = {f["id"] for f in report["diagnosis"]}
    assert {"data_loading", "throttling", "rank_imbalance"} <= found, found
    straggler = next(f for f in report["diagnosis"] if f["id"] == "rank_imbalance")
    assert straggler["data"]["ranks"] == [3]
    assert report["train_steps"] > 500 and report["run"]["world_size"] == 8
    assert (demo_run["report"] / "metrics_report.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_the_demo_fills_the_last_hours_with_every_planted_event(demo_run: dict) -> None:
    influx = demo_run["influx"]
    run = demo_run["run"]
    host = f"\"host\" = '{scenario.DEMO_HOST}'"
    per_gpu = influx.rows(f'SELECT count("util_gpu_pct") FROM "gpu" WHERE {host} AND time > now() - 4h GROUP BY "gpu"')
    assert len(per_gpu) == 8 and all(r["count"] >= 3 * 360 - 2 for r in per_gpu), per_gpu
    (xid,) = influx.rows(f'SELECT "xid", "kind" FROM "gpu_event" WHERE {host} GROUP BY "gpu"')
    assert (xid["xid"], xid["kind"], xid["gpu"]) == (31, "xid", "6")
    events = influx.rows(f'SELECT "kind" FROM "train_event" WHERE "run" = \'{run}\'')
    assert sorted(e["kind"] for e in events).count("checkpoint") == 3
    starts = influx.rows(f'SELECT "event" FROM "train_run" WHERE "run" = \'{run}\' GROUP BY "rank"')
    assert sorted(r["event"] for r in starts) == ["end"] * 8 + ["start"] * 8
    throttled = influx.rows(f'SELECT max("throttled") FROM "gpu" WHERE {host} GROUP BY "gpu"')
    assert all(r["max"] == 1 for r in throttled)
    starved = influx.rows(f'SELECT min("util_gpu_pct") FROM "gpu" WHERE {host} AND "run" = \'{run}\'')
    assert starved[0]["min"] < 30  # the GPUs waited for data during the bottleneck
    for rp in ("1m", "1h"):
        rows = influx.rows(f'SELECT count("util_gpu_pct_max") FROM "gpulse"."{rp}"."gpu" WHERE {host}')
        assert rows and rows[0]["count"] > 0, rp


@pytest.mark.parametrize("dashboard", dashboards(), ids=lambda d: d.slug)
def test_after_the_demo_every_panel_of_a_dashboard_shows_data_over_its_default_range(
    demo_run: dict, dashboard: Any
) -> None:
    influx = demo_run["influx"]
    dash = dashboard.to_json()
    # the host and run a user picks: the demo's
    assert scenario.DEMO_HOST in {r["value"] for r in influx.rows('SHOW TAG VALUES FROM "gpu" WITH KEY = "host"')}
    counts = panel_rows(influx, dash, dash["time"]["from"], {"host": scenario.DEMO_HOST, "run": demo_run["run"]})
    print(f"\n{dashboard.title}: {sum(1 for n in counts.values() if n)}/{len(counts)} panels and annotations with data")
    assert [title for title, n in counts.items() if n == 0] == []


def test_the_step_time_panel_stacks_the_report_s_parts_of_a_step_and_they_add_up(demo_run: dict) -> None:
    """The Training run dashboard's phase panel, as Grafana sends it over the demo run: the parts the
    report defines (``gpulse.report.phases``), and in every interval with steps they add up to the
    panel's line (data wait + step) within 1%, with backward's compute shown and never equal to comm."""
    influx = demo_run["influx"]
    dash = next(d for d in dashboards() if d.uid == "gpulse-training-run").to_json()
    time_from = dash["time"]["from"]
    variables = resolve_variables(influx, dash, time_from, {"host": scenario.DEMO_HOST, "run": demo_run["run"]})
    queries = [q for p, t, q in panel_queries(dash, variables, time_from) if p["title"] == "Step time by phase"]
    raw = [q for q in queries if '"1m".' not in q]
    assert len(raw) == 2, queries
    parts, line = (_series(influx, q) for q in raw)
    names = [c for c in next(iter(parts.values()))]
    assert names == [*PARTS, "other"]
    busy = {t: row for t, row in parts.items() if line[t]["step"]}
    assert len(busy) > 20
    for t, row in busy.items():
        assert sum(row.values()) == pytest.approx(line[t]["step"], rel=0.01), (t, row)
        assert row["backward"] > 0 and row["comm"] > 0 and row["other"] != pytest.approx(row["comm"], rel=0.05), row


def _series(influx: InfluxDB1, query: str) -> dict[str, dict[str, float]]:
    """One query's rows by time: column -> value (one series, no tags)."""
    ((res,),) = [influx.query(query, db="gpulse")["results"]]
    ((series,),) = [res["series"]]
    cols = series["columns"]
    return {v[0]: dict(zip(cols[1:], v[1:], strict=True)) for v in series["values"]}


def test_without_a_database_the_demo_records_a_file_and_reports_from_it(influxdb: InfluxDB1, tmp_path: Path) -> None:
    """``--record`` records only, even with GPULSE_URL exported (before: the demo went to that URL,
    and failed there); the file is replaced once complete, never appended to."""
    record = tmp_path / "demo.lp"
    record.write_text("previous,host=a value=1i 1\n")
    env = {**_env(tmp_path), "GPULSE_URL": influxdb.url, "GPULSE_API": "v1"}
    out = subprocess.run(
        gpulse_cmd("demo", "--record", str(record), "--hours", "1", "--out", str(tmp_path / "report")),
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"-> {record} only (GPULSE_URL={influxdb.url} is not used with --record" in out.stdout
    assert influxdb.count("gpu", "util_gpu_pct") == 0
    assert not record.read_text().startswith("previous,")
    assert "Grafana" not in out.stdout  # nothing to link to
    assert "DIAGNOSIS:" in out.stdout
    parsed = list(read_lines(record))
    assert parsed and all(not isinstance(p, Exception) for _, _, p in parsed)
    measurements = {p.measurement for _, _, p in parsed}
    assert {
        "gpu",
        "gpu_info",
        "gpu_process",
        "gpu_event",
        "agent",
        "train_step",
        "train_run",
        "train_event",
    } <= measurements
    assert (tmp_path / "report" / "metrics_report.html").exists()


def test_the_demo_refuses_a_database_without_setup_and_names_the_fix(influxdb: InfluxDB1, tmp_path: Path) -> None:
    out = subprocess.run(
        gpulse_cmd("demo", "--api", "v1", "--url", influxdb.url, "--hours", "0.5"),
        env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert "retention policies" in out.stderr and "gpulse setup" in out.stderr
    assert influxdb.count("gpu", "util_gpu_pct") == 0  # nothing half-written


def test_the_scenario_is_a_pure_function_of_its_end_time_and_seed() -> None:
    end = 1_800_000_000 * scenario.NS
    tl = scenario.Timeline.build(end, hours=0.5)
    a, uuids = scenario.gpu_lines(tl, "r", seed=3)
    b, _ = scenario.gpu_lines(tl, "r", seed=3)
    assert a == b
    assert (
        scenario.training_lines(tl, "r", uuids, seed=3).lines == scenario.training_lines(tl, "r", uuids, seed=3).lines
    )
    assert tl.phase(tl.run_start_ns - 1, 0) == "idle" and tl.phase(tl.run_end_ns, 0) == "idle"
    thermal = next(e for e in tl.episodes if e.name == "throttled")
    assert tl.phase(thermal.start_ns, 3) == "throttled"  # throttling shows over the straggler's power cap
    assert tl.slowdown(thermal.start_ns, 3) == pytest.approx(
        scenario.SLOWDOWN["throttled"] * scenario.SLOWDOWN["straggler"]
    )
