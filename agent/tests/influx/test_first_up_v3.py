"""`gpulse setup`, the agent, `gpulse doctor`, `gpulse demo` and `gpulse report` end to end against InfluxDB 3 Core.

No InfluxDB 3 can run here: its stand-in (``support.fake_influx_v3``) answers as the 3.10 source does,
and runs the downsampling plugin on DataFusion as the processing engine would. Every command is the
real CLI in a subprocess, with ``--api v3`` and the admin token in a file, as a user would run them.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from support.fake_influx_v3 import running
from support.fixtures import gpulse_cmd
from support.old_run import NS, run_points

from gpulse.influx.connection import Connection
from gpulse.influx.setup import downsample_now
from gpulse.report.load import DAY_NS

TOKEN = "apiv3_the-admin-token"
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def influx3():
    with running(token=TOKEN) as fake:
        yield fake


def gpulse(fake, tmp_path: Path, env, command: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    tokens = tmp_path / "influxdb3-admin-token"
    if not tokens.exists():
        tokens.write_text(TOKEN + "\n")
        tokens.chmod(0o600)
    flags = ("--api", "v3", "--url", fake.url, "--token-file", str(tokens))
    return subprocess.run(gpulse_cmd(command, *flags, *args), env=env, capture_output=True, text=True, timeout=timeout)


def test_setup_twice_then_the_agent_then_the_doctor(influx3, tmp_path, clean_env):
    fake = influx3
    grafana = tmp_path / "secrets" / "grafana-influx-token"
    first = gpulse(fake, tmp_path, clean_env, "setup", "--grafana-token-file", str(grafana))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1].endswith("8 created")
    n = len(fake.requests)
    second = gpulse(fake, tmp_path, clean_env, "setup", "--grafana-token-file", str(grafana))
    assert second.returncode == 0, second.stderr
    assert [r for r in fake.requests[n:] if r[0] in MUTATING] == []

    n = len(fake.requests)
    agent = gpulse(
        fake, tmp_path, clean_env, "agent", "--simulate", "2", "--no-socket", "--duration", "3",
        "--spool-dir", str(tmp_path / "spool"), "--summary-file", str(tmp_path / "summary.json"),
    )  # fmt: skip
    assert agent.returncode == 0, agent.stderr
    final = json.loads((tmp_path / "summary.json").read_text())
    assert final["lines_written"] == final["lines_submitted"] > 0 and final["lines_rejected"] == 0
    writes = [r for r in fake.requests[n:] if r[0] in MUTATING]
    assert writes and set(writes) == {("POST", "/api/v3/write_lp")}
    assert len(fake.engine.rows("gpulse", "gpu")) == final["points"]["gpu"]

    doctor = gpulse(fake, tmp_path, clean_env, "doctor", "--simulate", "2", "--skip", "socket", "--skip", "spool")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    for line in (
        "database: " + fake.url + " answers (InfluxDB 3 Core 3.10.0-nightly)",
        "layout: databases gpulse (30d), gpulse/1m (400d), gpulse/1h (forever)",
        "downsampling: triggers gpulse_1m (cron:0 1/10 * * * *)",
    ):
        assert line in doctor.stdout


def test_the_demo_writes_downsamples_and_reports(influx3, tmp_path, clean_env):
    """The demo against InfluxDB 3 writes, downsamples through the plugin's request trigger and reports
    from the database; that report, and `gpulse report --run` after it, equal the report built from
    the demo's own recording of the same points."""
    fake = influx3
    assert gpulse(fake, tmp_path, clean_env, "setup").returncode == 0
    record = tmp_path / "demo.lp"
    demo = gpulse(
        fake, tmp_path, clean_env, "demo", "--hours", "0.5", "--interval", "60", "--gpus", "2",
        "--record", str(record), "--out", str(tmp_path / "demo"), timeout=300,
    )  # fmt: skip
    assert "downsampled the whole window into the 1m and 1h tiers" in demo.stdout, demo.stderr
    assert fake.engine.rows("gpulse/1m", "gpu") and fake.engine.rows("gpulse/1h", "gpu")
    assert demo.returncode == 0, demo.stderr[-3000:]
    report = json.loads((tmp_path / "demo" / "metrics_report.json").read_text())
    run = report["run"]["id"]
    again = gpulse(fake, tmp_path, clean_env, "report", "--run", run, "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    from_file = subprocess.run(
        gpulse_cmd("report", "--run", run, "--from-file", str(record), "--out", str(tmp_path / "file")),
        env=clean_env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert from_file.returncode == 0, from_file.stderr
    recorded = json.loads((tmp_path / "file" / "metrics_report.json").read_text())
    assert report["train_steps"] > 0 and len(report["per_gpu"]) == 2
    assert report == recorded
    assert json.loads((tmp_path / "again" / "metrics_report.json").read_text()) == recorded


def test_a_run_older_than_raw_retention_is_reported_from_the_1m_database(influx3, tmp_path, clean_env):
    """On 3.x the 1m tier is the database ``gpulse/1m``: `gpulse report --run` finds a run whose raw
    points are gone there, through ``"gpulse"."1m"."<measurement>"``."""
    fake = influx3
    assert gpulse(fake, tmp_path, clean_env, "setup").returncode == 0
    start = time.time_ns() - 40 * DAY_NS  # older than raw's 30 days
    req = urllib.request.Request(
        f"{fake.url}/api/v3/write_lp?db=gpulse&precision=nanosecond",
        data=run_points("old-run", "node-a", start, 300).encode(),
        headers={"Authorization": f"Token {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204
    downsample_now(Connection(url=fake.url, api="v3", bucket="gpulse", token=TOKEN), start - 60 * NS, start + 3600 * NS)
    assert {r["run"] for r in fake.engine.rows("gpulse/1m", "train_step")} == {"old-run"}
    fake.engine.databases["gpulse"].clear()  # what raw retention leaves (the stand-in does not enforce it)
    res = gpulse(fake, tmp_path, clean_env, "report", "--run", "old-run", "--json", "--out", str(tmp_path / "old"))
    assert res.returncode == 0, res.stderr
    assert "run 'old-run' is no longer in the raw points: read from the 1m tier" in res.stderr
    report = json.loads((tmp_path / "old" / "metrics_report.json").read_text())
    assert report["run"]["id"] == "old-run" and {g["gpu"] for g in report["per_gpu"]} == {"0", "1"}
    assert report["train_steps"] > 0
