"""End to end: a training loop → a real ``gpulse agent --simulate`` process → a real InfluxDB 1.x.

Then the agent is killed mid-run: training finishes without an exception, the rest goes to the
recording file, and ``gpulse upload`` brings it in, so InfluxDB holds every step exactly once.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from agentproc import AgentProc, agent_args, points_in
from support.fixtures import gpulse_cmd
from support.waiting import wait_until

from gpulse.training import Run
from gpulse.training.client import RECORD_FILE

STEPS = 30


def test_steps_reach_influxdb_through_the_agent_and_the_rest_through_upload(influxdb, clean_env, tmp_path: Path):
    sock = str(tmp_path / "run" / "gpulse" / "agent.sock")
    args = [a for a in agent_args(influxdb, gpus=1, interval=0.5) if a != "--no-socket"]
    args += ["--socket", sock, "--spool-dir", str(tmp_path / "spool"), "--flush-interval", "0.2"]
    agent = AgentProc(args, clean_env, tmp_path)
    out = tmp_path / "out"
    try:
        wait_until(lambda: Path(sock).exists(), what="the agent's socket")
        run = Run(name="e2e", output_dir=out, socket_path=sock, ack_timeout=1.0)
        for i in range(STEPS):
            with run.step(samples=2, tokens=64):
                with run.phase("forward"):
                    pass
            run.log(loss=1.0 / (i + 1))
            if i == 9:
                wait_until(lambda: points_in(influxdb, "train_step") >= 5, what="steps in InfluxDB")
                agent.stop(signal.SIGKILL)  # no goodbye, no final acks
        run.finish()
    finally:
        agent.stop(signal.SIGKILL)
    live = points_in(influxdb, "train_step", f"\"run\" = '{run.run_id}'")
    assert 5 <= live < STEPS
    assert (out / RECORD_FILE).exists()
    up = subprocess.run(
        gpulse_cmd("upload", "--api", "v1", "--url", influxdb.url, "--bucket", "gpulse", str(out / RECORD_FILE)),
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stderr
    rows = influxdb.rows(f"SELECT step, log_loss FROM train_step WHERE \"run\" = '{run.run_id}'")
    assert sorted(int(r["step"]) for r in rows) == list(range(1, STEPS + 1))  # every step, once
    assert all(r["log_loss"] == 1.0 / r["step"] for r in rows)
    runs = influxdb.rows(f"SELECT event, status FROM train_run WHERE \"run\" = '{run.run_id}'")
    assert sorted((r["event"], r["status"]) for r in runs) == [("end", "finished"), ("start", "running")]
