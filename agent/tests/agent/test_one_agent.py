"""One agent per node and destination (:mod:`gpulse.agent.instance`), with real agents and a real InfluxDB.

Before: while one agent ran, a second ``gpulse agent --duration 5`` with the same settings logged
"another gpulse agent is listening", then sampled and wrote anyway and exited 0: its ``agent``
points carried the same ``host`` tag and overwrote the first's, its GPU samples duplicated the
first's. Now the second exits 4 at start, naming the running one (PID, socket), having opened and
written nothing; ``agent --check`` and ``doctor`` name it too.
"""

from __future__ import annotations

import grp
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from agentproc import AgentProc, points_in
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1
from support.waiting import wait_until

from gpulse.agent.loop import EXIT_ANOTHER_AGENT

pytestmark = pytest.mark.influxdb


def _args(server: InfluxDB1, sock: Path, tmp_path: Path, name: str) -> list[str]:
    return [
        "--simulate", "2", "--interval", "0.5", "--api", "v1", "--url", server.url, "--bucket", "gpulse",
        "--socket", str(sock), "--spool-dir", str(tmp_path / f"spool-{name}"),
    ]  # fmt: skip


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpulse_cmd(*args), env=env, capture_output=True, text=True, timeout=120)


def test_a_second_agent_for_the_same_socket_or_destination_is_refused_naming_the_first(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    sock = tmp_path / "run" / "gpulse" / "agent.sock"
    first = AgentProc(_args(influxdb, sock, tmp_path, "first"), clean_env, tmp_path, "first")
    try:
        wait_until(lambda: points_in(influxdb, "agent") >= 1, what="the first agent's health point")
        # the same settings, as in the issue
        same = _run(clean_env, "agent", *_args(influxdb, sock, tmp_path, "second"), "--duration", "5")
        assert same.returncode == EXIT_ANOTHER_AGENT, same.stderr
        assert f"another gpulse agent already runs for socket {sock} (pid {first.pid}, socket {sock}" in same.stderr
        assert f"fix: one agent per node and destination: stop that one first (`kill {first.pid}`)" in same.stderr
        assert "agent on" not in same.stderr  # it never started: no sampling, no writing
        # another socket, the same database: refused by the destination's lock
        other_sock = tmp_path / "other" / "agent.sock"
        dest = _run(clean_env, "agent", *_args(influxdb, other_sock, tmp_path, "third"), "--duration", "5")
        assert dest.returncode == EXIT_ANOTHER_AGENT, dest.stderr
        assert f"already runs for {influxdb.url} api=v1" in dest.stderr and f"pid {first.pid}" in dest.stderr
        assert "give this one another destination" in dest.stderr and not other_sock.exists()
        # --check and doctor say the same
        check = _run(clean_env, "agent", "--check", *_args(influxdb, sock, tmp_path, "second"))
        assert check.returncode == 1
        assert f"FAIL agent: this agent would not start: another gpulse agent already runs for socket {sock}" in (
            check.stdout
        )
        assert f"(pid {first.pid}," in check.stdout
        doctor = _run(
            clean_env, "doctor", "--simulate", "2", "--api", "v1", "--url", influxdb.url, "--socket", str(sock),
            "--spool-dir", str(tmp_path / "spool-first"), "--skip", "containers",
        )  # fmt: skip
        assert f"✔ agent: an agent runs for socket {sock}: pid {first.pid}, socket {sock}, writing to" in doctor.stdout
    finally:
        assert first.stop() == 0
    summary = first.summary()
    # the database holds the first agent's points only: every health point is its own
    assert points_in(influxdb, "agent") == summary["points"]["agent"]
    assert points_in(influxdb, "gpu") == summary["points"]["gpu"]
    # once it is gone, an agent starts there again
    again = _run(clean_env, "agent", *_args(influxdb, sock, tmp_path, "again"), "--duration", "1")
    assert again.returncode == 0, again.stderr


def test_a_killed_agent_leaves_no_stale_lock(influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path) -> None:
    sock = tmp_path / "s" / "agent.sock"
    first = AgentProc(_args(influxdb, sock, tmp_path, "first"), clean_env, tmp_path, "first")
    wait_until(sock.exists, what="the socket")
    first.stop(sig=signal.SIGKILL)
    locks = list((Path(clean_env["XDG_RUNTIME_DIR"]) / "gpulse-locks").glob("agent-*.lock"))
    assert (
        sock.exists() and len(locks) == 2
    )  # what a crash leaves behind: the socket, the socket's and database's locks
    second = _run(clean_env, "agent", *_args(influxdb, sock, tmp_path, "second"), "--duration", "1")
    assert second.returncode == 0, second.stderr
    assert f"training channel listening on {sock}" in second.stderr


def test_agents_with_their_own_socket_and_destination_run_side_by_side(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    procs = [
        AgentProc(
            [
                "--simulate",
                "1",
                "--interval",
                "0.2",
                "--duration",
                "3",
                "--record",
                str(tmp_path / f"{n}.lp"),
                "--socket",
                str(tmp_path / n / "agent.sock"),
                "--spool-dir",
                str(tmp_path / f"spool-{n}"),
            ],
            clean_env,
            tmp_path,
            n,
        )
        for n in ("a", "b")
    ]
    for p in procs:
        p.proc.wait(timeout=60)
        assert p.stop() == 0, p.stderr
        assert p.summary()["samples"] > 0


def test_the_locks_leave_the_socket_directory_to_the_channel(clean_env: dict[str, str], tmp_path: Path) -> None:
    """The channel creates the socket's directory 0750 for ``--socket-group``; a lock made there first
    (0700) would lock the group out."""
    group = grp.getgrgid(os.getgid()).gr_name
    sock = tmp_path / "shared" / "agent.sock"
    agent = AgentProc(
        ["--simulate", "1", "--record", str(tmp_path / "r.lp"), "--socket", str(sock), "--socket-group", group],
        clean_env,
        tmp_path,
    )
    try:
        wait_until(sock.exists, what="the socket")
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o750 and os.listdir(sock.parent) == ["agent.sock"]
    finally:
        assert agent.stop() == 0, agent.stderr
