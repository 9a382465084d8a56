"""A server that trickles or floods cannot hold a write, the agent's shutdown, or its memory (issue 15, item 3).

Before: a server that sent headers and then one byte every 5 s stalled delivery with nothing logged
and SIGTERM never completed (the sink's close waited on a thread blocked in ``resp.read()``); a 200
with a 400 MB body took the agent to 430 MiB. The servers are tiny socket servers
(``support/rawhttp.py``); the agent is the real ``gpulse agent`` process.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from agentproc import AgentProc
from support.rawhttp import RawHTTPServer, huge_body, respond, silent, trickle_body
from support.waiting import wait_until

from gpulse.sinks.errors import ErrorKind, WriteError
from gpulse.sinks.influx_v1 import InfluxV1Sink

LINES = [f"m,host=h v={i}i {1_700_000_000_000_000_000 + i}\n" for i in range(10)]
#: ``Delivery.close`` joins a sink thread still in a write for up to this long before closing the sinks
DELIVERY_JOIN_S = 2.0
#: starting and stopping a Python process on a loaded 2-core machine
PROCESS_SLACK_S = 1.5


def rss_peak_mib(pid: int) -> float:
    """The process's peak resident memory (``VmHWM``), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc")


def agent(server: RawHTTPServer, tmp_path: Path, clean_env: dict[str, str], *extra: str) -> AgentProc:
    args = ["--simulate", "2", "--interval", "0.2", "--api", "v1", "--url", server.url, "--bucket", "gpulse"]
    args += ["--no-socket", "--spool-dir", str(tmp_path / "spool"), *extra]
    return AgentProc(args, clean_env, tmp_path)


def writes(server: RawHTTPServer) -> int:
    return sum(r.path.startswith("/write") for r in server.requests)


def test_a_trickling_server_does_not_hold_the_agents_exit(tmp_path, clean_env):
    with RawHTTPServer(trickle_body(5.0)) as server:
        a = agent(server, tmp_path, clean_env, "--shutdown-timeout", "1")
        try:
            wait_until(lambda: writes(server) >= 1, 30, every=0.05)
            time.sleep(0.5)  # the write is in flight, one byte every 5 s: far from its 10 s deadline
            t0 = time.monotonic()
            rc = a.stop(signal.SIGTERM, timeout=60)
            took = time.monotonic() - t0
        finally:
            a.stop(signal.SIGKILL)
    assert rc == 0, a.stderr[-2000:]
    assert took < 1 + DELIVERY_JOIN_S + PROCESS_SLACK_S, f"exit took {took:.1f} s"
    s = a.summary()
    assert s["lines_written"] == 0 and s["lines_spooled"] == s["lines_submitted"] > 0  # kept for the next start


def test_a_huge_answer_to_every_write_leaves_the_agents_memory_flat(tmp_path, clean_env):
    with RawHTTPServer(huge_body(400 * 1024 * 1024)) as server:
        a = agent(server, tmp_path, clean_env, "--flush-interval", "0.5")
        try:
            wait_until(lambda: writes(server) >= 4, 30, every=0.05)
            peak = rss_peak_mib(a.pid)
            t0 = time.monotonic()
            rc = a.stop(signal.SIGTERM, timeout=60)
            took = time.monotonic() - t0
        finally:
            a.stop(signal.SIGKILL)
    assert rc == 0
    assert peak < 100, f"peak RSS {peak:.0f} MiB"  # each answer read up to 64 KiB, not 400 MB
    assert server.sent < writes(server) * 16 * 1024 * 1024  # the agent hung up on each: no 400 MB went out
    assert took < 5 + PROCESS_SLACK_S
    s = a.summary()
    assert s["lines_written"] == s["lines_submitted"]  # a 2xx is a write, whatever its body


def test_a_slow_write_is_logged_with_its_duration(caplog):
    def slow(sock, req, server):
        time.sleep(0.7)
        return respond()(sock, req, server)

    caplog.set_level(logging.WARNING, logger="gpulse")
    with RawHTTPServer(slow) as server:
        sink = InfluxV1Sink(server.url, "gpulse", timeout_s=1.0)
        sink.write(LINES)
        sink.close()
    slow_logs = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert len(slow_logs) == 1
    took = re.search(r": a write of 10 lines took (\d+\.\d) s \(deadline 1 s\)$", slow_logs[0])
    assert took and 0.7 <= float(took.group(1)) < 1.0, slow_logs[0]  # the server waited 0.7 s


def test_a_write_ends_at_its_deadline_whatever_the_server_does():
    with RawHTTPServer(trickle_body(0.2)) as server:
        sink = InfluxV1Sink(server.url, "gpulse", timeout_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(WriteError) as e:
            sink.write(LINES)
        assert time.monotonic() - t0 < 2.5
    assert e.value.kind is ErrorKind.TRANSIENT and "no complete answer within 1 s" in e.value.describe()


def test_closing_a_sink_aborts_its_write_in_flight_and_never_blocks():
    with RawHTTPServer(silent) as server:
        sink = InfluxV1Sink(server.url, "gpulse", timeout_s=60)
        errors: list[WriteError] = []

        def write() -> None:
            try:
                sink.write(LINES)
            except WriteError as e:
                errors.append(e)

        t = threading.Thread(target=write)
        t.start()
        wait_until(lambda: writes(server) == 1, 10, every=0.01)
        t0 = time.monotonic()
        sink.close()
        assert time.monotonic() - t0 < 0.1
        t.join(2)
    assert not t.is_alive() and errors[0].kind is ErrorKind.TRANSIENT and "closed" in errors[0].message
