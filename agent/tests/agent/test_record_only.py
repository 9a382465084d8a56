"""Recording is recording: ``--record FILE`` writes FILE, and a database only when ``--url`` says so.

Before: with ``GPULSE_URL`` exported (as the README's database section does), ``gpulse agent --record
out/node.lp --duration 3`` also wrote to that URL, logged "CONFIGURATION ERROR … asks for
credentials" and spooled what it could not send; the doctor then failed on the spool.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agentproc import AgentProc, points_in
from support.influxd import InfluxDB1

from gpulse.lineprotocol.parse import read_lines

pytestmark = pytest.mark.influxdb


def _record_points(path: Path, measurement: str) -> int:
    return sum(1 for _n, _raw, p in read_lines(path) if getattr(p, "measurement", None) == measurement)


def _agent(env: dict[str, str], tmp_path: Path, *extra: str) -> AgentProc:
    args = ["--simulate", "2", "--interval", "0.5", "--duration", "3", "--no-socket"]
    return AgentProc([*args, "--spool-dir", str(tmp_path / "spool"), *extra], env, tmp_path)


def test_with_gpulse_url_exported_record_writes_only_the_file_and_says_the_url_is_unused(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**clean_env, "GPULSE_URL": influxdb.url, "GPULSE_API": "v1"}
    record = tmp_path / "out" / "node.lp"
    record.parent.mkdir()
    agent = _agent(env, tmp_path, "--record", str(record))
    agent.proc.wait(timeout=60)  # --duration 3
    assert agent.stop() == 0, agent.stderr
    summary = agent.summary()
    assert summary["lines_spooled"] == 0 and summary["lines_written"] == summary["lines_submitted"] > 0
    assert _record_points(record, "gpu") == summary["points"]["gpu"] > 0
    assert points_in(influxdb, "gpu") == points_in(influxdb, "agent") == 0  # nothing reached the database
    assert f"recording only: GPULSE_URL={influxdb.url} is not used; add --url to send there too" in agent.stderr
    assert "-> no database, recording to" in agent.stderr
    assert "CONFIGURATION ERROR" not in agent.stderr and "WARNING" not in agent.stderr


def test_record_with_url_on_the_command_line_writes_both(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    record = tmp_path / "node.lp"
    agent = _agent(clean_env, tmp_path, "--record", str(record), "--url", influxdb.url, "--api", "v1")
    agent.proc.wait(timeout=60)
    assert agent.stop() == 0, agent.stderr
    n = agent.summary()["points"]["gpu"]
    assert _record_points(record, "gpu") == points_in(influxdb, "gpu") == n > 0
    assert "not used" not in agent.stderr
