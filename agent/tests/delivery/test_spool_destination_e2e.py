"""A spool belongs to its destination (issue 14, item 8), with the real agent and a real InfluxDB 1.x.

An agent that spooled while its database was unreachable is restarted against another server: the
old data is kept, not written there; the agent logs what it found and the flag that replays it, and
``gpulse status`` shows it. Restarted with that flag, the agent replays it into the new server.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from agentproc import AgentProc, points_in
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1, free_port
from support.waiting import wait_until

pytestmark = [pytest.mark.influxdb, pytest.mark.slow]

FLAG = "--replay-spool-to-new-destination"


def agent_to(url: str, tmp_path: Path, *extra: str) -> list[str]:
    sock = str(tmp_path / "sock" / "agent.sock")
    return [
        *("--simulate", "1", "--interval", "0.1", "--api", "v1", "--url", url, "--bucket", "gpulse"),
        *("--spool-dir", str(tmp_path / "spool"), "--socket", sock, "--flush-interval", "0.2"),
        *extra,
    ]


def test_data_spooled_for_one_server_is_not_replayed_into_another_unless_asked(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    first = AgentProc([*agent_to(unreachable, tmp_path), "--duration", "1.5"], clean_env, tmp_path, "first")
    assert first.proc.wait(timeout=60) == 0
    spooled = first.summary()["lines_spooled"]
    assert spooled > 0

    old = f"time < {time.time_ns()}"  # the first agent's samples
    second = AgentProc(agent_to(influxdb.url, tmp_path), clean_env, tmp_path, "second")
    try:
        wait_until(lambda: points_in(influxdb, "gpu") > 0, what="the new agent's own samples")
        status = subprocess.run(
            gpulse_cmd("status", "--socket", str(tmp_path / "sock" / "agent.sock")),
            env=clean_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        assert second.stop() == 0
    assert points_in(influxdb, "gpu") > 0 and points_in(influxdb, "gpu", old) == 0  # nothing of the first agent's
    kept = [line for line in second.stderr.splitlines() if "kept, not replayed" in line]
    assert len(kept) == 1 and unreachable in kept[0] and FLAG in kept[0]
    assert f"Spool kept, not replayed: {spooled} lines" in status.stdout and FLAG in status.stdout

    third = AgentProc([*agent_to(influxdb.url, tmp_path), FLAG, "--duration", "1"], clean_env, tmp_path, "third")
    assert third.proc.wait(timeout=60) == 0, third.stderr[-2000:]
    assert third.summary()["lines_replayed"] >= spooled
    assert points_in(influxdb, "gpu", old) == first.summary()["points"]["gpu"]  # all of it, once
    assert [p.name for p in (tmp_path / "spool").iterdir() if p.is_dir()] == ["influx"]
