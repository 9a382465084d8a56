"""``gpulse report --run`` reads the tier that covers the run, a day at a time, every query bounded (real InfluxDB 1.6.7).

The database is made by ``gpulse setup --api v1 --raw-retention 1h``. A run of three days ago is in
the 1m tier only (:mod:`support.old_run`); a run of now is in raw. The queries the loader sends
are recorded: each names a time range, and no read of points spans more than a day.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support.fixtures import gpulse_cmd
from support.old_run import NS, run_points, setup_v1, write_to_1m_only

from gpulse.influx.connection import Connection
from gpulse.influx.query import InfluxQL
from gpulse.report.load import DAY_NS, list_runs_influx, load_influx, run_span

pytestmark = pytest.mark.influxdb

OLD, NEW, HOST = "old-run", "new-run", "node-a"
OLD_STEPS = 300


@pytest.fixture(scope="module")
def db(influxdb_module: Any) -> dict[str, Any]:

    influx = influxdb_module
    setup_v1(influx.url, raw_retention="1h")
    now = time.time_ns()
    old_start = now - 3 * DAY_NS
    write_to_1m_only(influx, run_points(OLD, HOST, old_start, OLD_STEPS), old_start, now)
    influx.write(run_points(NEW, HOST, now - 300 * NS, 120))
    return {"influx": influx, "old_start": old_start, "now": now}


class Recorded:
    """An :class:`InfluxQL` whose queries are kept, to check what the loader asks."""

    def __init__(self, url: str) -> None:
        self.q = InfluxQL(Connection(url=url, api="v1", bucket="gpulse"))
        self.sent: list[str] = []
        rows = self.q.rows

        def recording(query: str, *a: Any, **kw: Any) -> list[dict[str, Any]]:
            self.sent.append(query)
            return rows(query, *a, **kw)

        self.q.rows = recording  # type: ignore[method-assign]


def _bounds(query: str) -> tuple[int, int] | None:
    m = re.search(r"time >= (\d+) AND time (<|<=) (\d+)", query)
    return (int(m.group(1)), int(m.group(3))) if m else None


def test_a_run_older_than_raw_retention_is_read_from_the_1m_tier_a_day_at_a_time(db: dict[str, Any]) -> None:
    rec = Recorded(db["influx"].url)
    span = run_span(rec.q, OLD)
    assert span is not None and span.tier == "1m"
    assert db["old_start"] - 60 * NS < span.start_ns <= db["old_start"] + 60 * NS
    data = load_influx(rec.q, OLD)
    # per-minute means per rank: 300 one-second steps are 5 or 6 minutes, the steps' own figures kept
    assert {r["rank"] for r in data.steps} == {"0", "1"} and 10 <= len(data.steps) <= 12
    assert {round(r["step_time_s"], 3) for r in data.steps} == {0.5, 0.6}
    assert max(r["mem_peak_bytes_max"] for r in data.steps) == 32 << 30
    assert data.gpu and {r["gpu"] for r in data.gpu} == {"0", "1"}
    assert data.runs == [] and data.events == [] and data.tier == "1m"  # records and events: raw only
    reads = [q for q in rec.sent if q.startswith("SELECT *")]
    assert reads and all('"gpulse"."1m".' in q for q in reads)
    for q in rec.sent:
        bounds = _bounds(q)
        assert bounds is not None, f"unbounded: {q}"
        if q.startswith("SELECT *"):
            assert bounds[1] - bounds[0] <= DAY_NS, q


def test_a_current_run_is_read_from_raw_with_its_records(db: dict[str, Any]) -> None:
    rec = Recorded(db["influx"].url)
    data = load_influx(rec.q, NEW)
    assert run_span(rec.q, NEW).tier == "raw"  # type: ignore[union-attr]
    assert len(data.steps) == 2 * 120 and len(data.runs) == 2 and len(data.gpu) == 2 * 120
    assert all(_bounds(q) is not None for q in rec.sent), rec.sent


def test_both_runs_are_offered_and_a_run_in_neither_tier_is_not_found(db: dict[str, Any]) -> None:
    rec = Recorded(db["influx"].url)
    assert list_runs_influx(rec.q) == [NEW, OLD]
    assert all(_bounds(q) is not None for q in rec.sent), rec.sent
    assert run_span(rec.q, "no-such-run") is None and load_influx(rec.q, "no-such-run").empty


def test_gpulse_report_of_a_run_older_than_raw_retention(db: dict[str, Any], tmp_path: Path, clean_env: Any) -> None:
    res = subprocess.run(
        gpulse_cmd("report", "--url", db["influx"].url, "--api", "v1", "--bucket", "gpulse", "--run", OLD,
                   "--out", str(tmp_path), "--json"),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"run '{OLD}' is no longer in the raw points: read from the 1m tier" in res.stderr
    report = json.loads((tmp_path / "metrics_report.json").read_text())
    assert report["run"]["id"] == OLD and {g["gpu"] for g in report["per_gpu"]} == {"0", "1"}
