"""The real agent process against a real InfluxDB 1.x: exact counts, outages, SIGKILL, a full spool.

Every test runs ``gpulse agent --simulate 8 --interval 0.2 --api v1`` as a subprocess (the same
command a user runs) and compares what InfluxDB holds with the agent's final JSON summary.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest
from agentproc import AgentProc, agent_args, gpu_timestamps, points_in
from support.influxd import InfluxDB1, free_port
from support.waiting import wait_until

pytestmark = [pytest.mark.influxdb, pytest.mark.slow]

INTERVAL_NS = 200_000_000
FLUSH_S = 1.0


def assert_counts_match(server: InfluxDB1, summary: dict, gpus: int = 8) -> None:
    """Every point the agent produced is in the database, no more, no less."""
    points = summary["points"]
    assert points["gpu"] == summary["samples"] * gpus
    assert points["gpu_info"] == gpus
    for measurement, n in points.items():
        assert points_in(server, measurement) == n, measurement
    assert summary["lines_written"] == summary["lines_submitted"] == sum(points.values())
    assert summary["lines_dropped"] == summary["lines_rejected"] == 0


def assert_no_gaps(ts: list[int], skipped: int) -> None:
    """Consecutive samples are one interval apart, except for the cycles the agent says it skipped."""
    assert all(t % INTERVAL_NS == 0 for t in ts)
    missing = sum((b - a) // INTERVAL_NS - 1 for a, b in itertools.pairwise(ts))
    assert missing == skipped


def test_every_point_reaches_influxdb_exactly_and_the_token_stays_secret(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    token = "gpulse-user:Sup3r-s3cret-pa55word"
    env = {**clean_env, "GPULSE_TOKEN": token}  # influxd runs without auth: the credentials are ignored
    agent = AgentProc(agent_args(influxdb, "--spool-dir", str(tmp_path / "spool")), env, tmp_path, verbose=True)
    try:
        wait_until(lambda: points_in(influxdb, "gpu") >= 8 * 10, what="2 s of samples in InfluxDB")
        with open(f"/proc/{agent.pid}/cmdline", "rb") as f:
            assert token.encode() not in f.read()
    finally:
        rc = agent.stop()
    assert rc == 0
    summary = agent.summary()
    assert summary["reason"] == "SIGTERM"
    print(f"normal run: {summary['lines_submitted']} lines submitted, {summary['lines_written']} written")
    assert_counts_match(influxdb, summary)
    assert_no_gaps(gpu_timestamps(influxdb), summary["cycles_skipped"])
    assert token not in agent.stderr and "Sup3r" not in agent.stderr
    assert "token from GPULSE_TOKEN" in agent.stderr  # where it came from is logged, never what it is


def test_influxd_down_for_ten_seconds_mid_run_loses_nothing(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    agent = AgentProc(agent_args(influxdb, "--spool-dir", str(tmp_path / "spool")), clean_env, tmp_path)
    try:
        wait_until(lambda: points_in(influxdb, "gpu") >= 8 * 5, what="first samples in InfluxDB")
        influxdb.stop()
        time.sleep(10)
        assert agent.alive()
        influxdb.start()
        before = points_in(influxdb, "gpu")
        # back: the spooled 10 s arrive, and new samples keep flowing
        wait_until(lambda: points_in(influxdb, "gpu") >= before + 8 * 50, timeout=60, what="the outage replayed")
    finally:
        rc = agent.stop()
    assert rc == 0
    summary = agent.summary()
    assert summary["lines_spooled"] > 0 and summary["lines_replayed"] > 0
    assert_counts_match(influxdb, summary)
    assert_no_gaps(gpu_timestamps(influxdb), summary["cycles_skipped"])
    print(f"outage 10 s: {summary['points']['gpu']} gpu points expected, {points_in(influxdb, 'gpu')} written")


def test_sigkill_while_the_database_is_down_then_a_restart_replays_the_spool(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    spool = str(tmp_path / "spool")
    first = AgentProc(agent_args(influxdb, "--spool-dir", spool), clean_env, tmp_path, name="first")
    wait_until(lambda: points_in(influxdb, "gpu") >= 8 * 5, what="first samples in InfluxDB")
    influxdb.stop()
    time.sleep(3)  # samples pile up in the spool
    killed_at = time.time_ns()
    first.stop(signal.SIGKILL)
    influxdb.start()
    second = AgentProc(agent_args(influxdb, "--spool-dir", spool), clean_env, tmp_path, name="second")
    try:
        wait_until(
            lambda: points_in(influxdb, "gpu", f"time > {killed_at}") >= 8 * 10, what="the second agent's samples"
        )
        replayed = f"time <= {killed_at}"
        wait_until(
            lambda: points_in(influxdb, "gpu", replayed) == (time.sleep(1) or points_in(influxdb, "gpu", replayed)),
            what="the spool replay to finish",
        )
    finally:
        assert second.stop() == 0
    summary = second.summary()
    assert summary["lines_replayed"] > 0

    ts = gpu_timestamps(influxdb)
    before_kill = [t for t in ts if t <= killed_at]
    after = [t for t in ts if t > killed_at]
    # The killed agent's samples are all there, up to one flush interval (+ one sample) before the kill.
    bound_ns = FLUSH_S * 1e9 + INTERVAL_NS + 0.3e9  # + scheduling slack on a busy 2-core machine
    gaps = [b - a for a, b in itertools.pairwise(before_kill)]
    assert max(gaps) <= bound_ns, "a gap inside the first agent's run"
    lost_ns = killed_at - before_kill[-1]
    assert lost_ns <= bound_ns, f"{lost_ns / 1e9:.2f}s lost at SIGKILL"
    assert points_in(influxdb, "gpu", f"time <= {killed_at}") == 8 * len(before_kill)  # all 8 GPUs of each cycle
    # Every sample of the second agent is there too.
    assert len(after) == summary["samples"]
    assert points_in(influxdb, "gpu", f"time > {killed_at}") == summary["points"]["gpu"]
    print(f"SIGKILL: {lost_ns / 1e9:.2f}s of samples lost before the kill; {summary['lines_replayed']} lines replayed")


def test_a_tiny_spool_fills_up_and_the_agent_keeps_running_and_counts_drops(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """Nothing listens on the URL's port: every batch goes to a 64 KiB spool that overflows within a second."""
    spool = tmp_path / "spool"
    url = f"http://127.0.0.1:{free_port()}"
    args = ["--simulate", "8", "--interval", "0.1", "--api", "v1", "--url", url, "--no-socket"]
    args += [
        "--spool-dir",
        str(spool),
        "--spool-max-bytes",
        "64KiB",
        "--flush-interval",
        "0.2",
        "--shutdown-timeout",
        "1",
    ]
    agent = AgentProc(args, clean_env, tmp_path)
    try:
        time.sleep(4)
        assert agent.alive()
    finally:
        rc = agent.stop()
    assert rc == 0
    summary = agent.summary()
    assert summary["lines_written"] == 0
    assert summary["lines_dropped"] > 0
    assert summary["lines_spooled"] == summary["lines_submitted"]  # every line reached the spool ...
    assert summary["lines_spooled"] > summary["lines_dropped"]  # ... which kept the newest and dropped the oldest
    size = sum(f.stat().st_size for f in spool.rglob("*") if f.is_file())
    print(
        f"tiny spool: {summary['lines_spooled']} lines spooled, {summary['lines_dropped']} dropped, {size} bytes on disk"
    )
    assert size <= 64 * 1024 + 16 * 1024, f"spool holds {size} bytes, over its 64 KiB cap"
    assert all(os.stat(d).st_mode & 0o077 == 0 for d in [spool, *spool.iterdir()] if d.is_dir())
