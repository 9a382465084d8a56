"""End to end: a training run while the database is down and the agent's spool disk is full (issue 15, item 1).

The agent is the real ``gpulse agent`` process, its spool on a real 64 KiB tmpfs (``support/tmpfs.py``:
a private mount namespace, as root or as a user); the database a real InfluxDB 1.x, stopped while
training runs. The client may be acknowledged only for what the agent delivered or fsynced: every step ends up in the
database or in the client's recording file, and after ``gpulse upload`` of that file the database
holds each step exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from agentproc import AgentProc, agent_args, points_in
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1
from support.tmpfs import on_tmpfs
from support.waiting import wait_until

from gpulse.channel.protocol import RECORD_FILE
from gpulse.channel.recording import read_records
from gpulse.cli.commands.status import query_status
from gpulse.training import Run

pytestmark = [pytest.mark.influxdb, pytest.mark.slow]

STEPS = 150
DISK = "64k"


def steps_in(server: InfluxDB1, run_id: str) -> list[int]:
    return sorted(int(r["step"]) for r in server.rows(f"SELECT step FROM train_step WHERE \"run\" = '{run_id}'"))


def test_a_full_disk_under_a_training_run_with_the_database_down_loses_no_step_and_doubles_none(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    sock = str(tmp_path / "run" / "gpulse" / "agent.sock")
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    args = [a for a in agent_args(influxdb, gpus=8, interval=0.1) if a != "--no-socket"]
    args += ["--socket", sock, "--spool-dir", str(spool), "--spool-max-bytes", "1MiB", "--flush-interval", "0.2"]
    agent = AgentProc(args, clean_env, tmp_path, prefix=on_tmpfs(spool, DISK))
    out = tmp_path / "out"
    try:
        wait_until(lambda: points_in(influxdb, "gpu") >= 8 * 5, what="the agent writing")
        influxdb.stop()
        wait_until(lambda: "No space left on device" in agent.stderr, timeout=60, what="the spool's disk to fill")

        run = Run(name="full-disk", output_dir=out, socket_path=sock, ack_timeout=1.0)
        for i in range(STEPS):
            with run.step(samples=2, tokens=64):
                time.sleep(0.01)
            run.log(loss=1.0 / (i + 1))
        run.finish()
        assert agent.alive()

        influxdb.start()
        wait_until(lambda: query_status(sock)["spool_bytes"] == 0, timeout=60, what="the spool replayed")
        wait_until(lambda: query_status(sock)["buffer_lines"] < 100, timeout=60, what="memory delivered")
    finally:
        rc = agent.stop(signal.SIGTERM)
    assert rc == 0, agent.stderr[-3000:]
    in_db = steps_in(influxdb, run.run_id)
    recorded = out / RECORD_FILE
    assert recorded.exists(), "the client recorded nothing: every step was acknowledged although the disk was full"
    in_file = [int(p.fields["step"]) for _, _, p in read_records(recorded) if p.measurement == "train_step"]
    assert in_file
    assert set(in_db) | set(in_file) == set(range(1, STEPS + 1))  # every step somewhere
    assert agent.summary()["lines_dropped"] == 0  # the agent lost nothing: what the disk refused waited in memory

    up = subprocess.run(
        gpulse_cmd("upload", "--api", "v1", "--url", influxdb.url, "--bucket", "gpulse", str(recorded)),
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stderr
    assert steps_in(influxdb, run.run_id) == list(range(1, STEPS + 1))  # each step once: same series both ways
