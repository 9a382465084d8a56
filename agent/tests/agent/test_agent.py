"""The agent loop: one timestamp per cycle on the interval grid, skipped (never bunched) late cycles,
run tags from registered training runs, self-metrics, signals, and the no-driver exit.

In-process tests run :class:`gpulse.agent.loop.Agent` with simulated GPUs and a ``--record`` file (the
real delivery and record sink), then read the file back with the project's line-protocol parser.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

from agentproc import AgentProc
from support.fixtures import gpulse_cmd
from support.waiting import wait_until

from gpulse.agent.config import AgentConfig, load_config
from gpulse.agent.loop import Agent
from gpulse.channel import protocol
from gpulse.cli.commands import agent as agent_cmd
from gpulse.cli.commands.status import query_status
from gpulse.lineprotocol.parse import ParsedLine, parse_line
from gpulse.schema import AGENT, JOB_TAGS, NVML_ERROR_KINDS
from gpulse.sources.simulated import SimulatedSource

NS = 1_000_000_000


def make_cfg(tmp_path: Path, *argv: str) -> AgentConfig:
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    base = ["--record", str(tmp_path / "record.lp"), "--spool-dir", str(tmp_path / "spool"), "--host", "node-t"]
    base += ["--summary-file", str(tmp_path / "summary.json")]
    return load_config(parser.parse_args([*base, *argv]), {})


def run_agent(cfg: AgentConfig, source: SimulatedSource | None = None) -> tuple[dict, list[ParsedLine]]:
    out = io.StringIO()
    agent = Agent(cfg, source=source, stream=out, tty=False)
    assert agent.run() == 0
    assert '"samples"' not in out.getvalue()  # no JSON for people: the counts go to --summary-file
    return final_summary(cfg), read_record(cfg)


def final_summary(cfg: AgentConfig) -> dict:
    """The counts the agent wrote to ``--summary-file`` at exit."""
    assert cfg.summary_file
    return json.loads(Path(cfg.summary_file).read_text())


def read_record(cfg: AgentConfig) -> list[ParsedLine]:
    assert cfg.record
    return [parse_line(line) for line in Path(cfg.record).read_text().splitlines() if line]


def by_measurement(points: list[ParsedLine]) -> dict[str, list[ParsedLine]]:
    out: dict[str, list[ParsedLine]] = defaultdict(list)
    for p in points:
        out[p.measurement].append(p)
    return out


def cycle_gaps(timestamps: list[int], interval_ns: int) -> int:
    """Grid points missing between consecutive cycles."""
    return sum((b - a) // interval_ns - 1 for a, b in itertools.pairwise(timestamps))


def test_all_gpus_of_a_cycle_share_one_timestamp_on_the_interval_grid(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "--simulate", "4", "--interval", "0.1", "--duration", "1.5", "--no-socket")
    summary, points = run_agent(cfg)
    m = by_measurement(points)
    cycles: dict[int, list[str]] = defaultdict(list)
    for p in m["gpu"]:
        cycles[p.ts].append(p.tags["gpu"])
        assert {k: v for k, v in p.tags.items() if k not in JOB_TAGS} == {
            "host": "node-t",
            "gpu": p.tags["gpu"],
            "uuid": p.tags["uuid"],
            "model": "NVIDIA H100 80GB HBM3",
        }
        assert ("job" in p.tags) == (p.tags["gpu"] in ("0", "1"))  # the simulated Slurm job holds the first half
    assert len(cycles) == summary["samples"] >= 10
    assert all(sorted(g) == ["0", "1", "2", "3"] for g in cycles.values())
    assert all(ts % (NS // 10) == 0 for ts in cycles)  # on the 100 ms grid of the wall clock
    assert cycle_gaps(sorted(cycles), NS // 10) == summary["cycles_skipped"]
    assert len(m["gpu_info"]) == 4 and {p.ts for p in m["gpu_info"]} == {min(cycles)}
    assert summary["points"] == {k: len(v) for k, v in m.items()}
    assert summary["lines_submitted"] == summary["lines_written"] == len(points)


def test_self_metrics_are_written_at_start_every_interval_and_at_exit(tmp_path: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        "--simulate",
        "2",
        "--interval",
        "0.1",
        "--duration",
        "1.2",
        "--self-metrics-interval",
        "0.5",
        "--no-socket",
    )
    summary, points = run_agent(cfg)
    agent_points = by_measurement(points)["agent"]
    assert len(agent_points) >= 3  # the first cycle, every 0.5 s, and the exit
    assert all(p.tags == {"host": "node-t"} for p in agent_points)
    first, last = agent_points[0].fields, agent_points[-1].fields
    assert first["samples"] == 1 and last["samples"] == summary["samples"]
    assert last["gpus"] == 2 and last["gpus_lost"] == 0 and last["cycles_skipped"] == summary["cycles_skipped"]
    assert last["lines_written"] > 0 and last["uptime_s"] > 1.0 and last["cycle_ms"] > 0
    assert {f"nvml_errors_{k}" for k in NVML_ERROR_KINDS} <= set(last)
    assert set(last) <= {f.name for f in AGENT.fields}


class OverrunningSource(SimulatedSource):
    """The simulated GPUs, with one cycle that takes 3.5 intervals (as a hung NVML call would)."""

    def __init__(self, n: int, slow_call: int, seconds: float) -> None:
        super().__init__(n)
        self.calls, self.slow_call, self.seconds = 0, slow_call, seconds

    def collect(self, now_ns: int):  # type: ignore[override]
        self.calls += 1
        if self.calls == self.slow_call:
            time.sleep(self.seconds)
        return super().collect(now_ns)


def test_a_cycle_that_overruns_is_followed_by_skipped_cycles_never_by_a_burst(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "--simulate", "2", "--interval", "0.1", "--duration", "1.5", "--no-socket")
    summary, points = run_agent(cfg, OverrunningSource(2, slow_call=5, seconds=0.35))
    ts = sorted({p.ts for p in by_measurement(points)["gpu"]})
    assert summary["cycles_skipped"] >= 3
    assert cycle_gaps(ts, NS // 10) == summary["cycles_skipped"]
    assert len(ts) == summary["samples"]


def test_a_registered_training_run_tags_its_gpus_until_it_unregisters(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "run" / "agent.sock")
    cfg = make_cfg(tmp_path, "--simulate", "3", "--interval", "0.1", "--socket", sock_path)
    uuid = SimulatedSource(3).open()[1].uuid
    agent = Agent(cfg, stream=io.StringIO(), tty=False)
    thread = threading.Thread(target=agent.run)
    thread.start()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(protocol.client_address())
    try:
        wait_until(lambda: os.path.exists(sock_path), what="the agent socket")
        time.sleep(0.5)
        s.sendto(protocol.encode(protocol.Register("run-42", "0", os.getpid(), (uuid,), seq=1)), sock_path)
        status = wait_until(lambda: query_status(sock_path)["runs"], what="the registration")
        assert status == {uuid: "run-42"}
        time.sleep(0.8)
        s.sendto(protocol.encode(protocol.Unregister("run-42", "0", os.getpid(), seq=2)), sock_path)
        wait_until(lambda: not query_status(sock_path)["runs"], what="the unregistration")
        time.sleep(0.3)
    finally:
        s.close()
        agent.request_stop()
        thread.join(timeout=30)
    gpu = by_measurement(read_record(cfg))["gpu"]
    tagged = [p for p in gpu if "run" in p.tags]
    assert tagged and {(p.tags["gpu"], p.tags["run"]) for p in tagged} == {("1", "run-42")}
    gpu1 = sorted((p for p in gpu if p.tags["gpu"] == "1"), key=lambda p: p.ts)
    runs = ["run" in p.tags for p in gpu1]
    first, last = runs.index(True), len(runs) - 1 - runs[::-1].index(True)
    assert not any(runs[:first]) and all(runs[first : last + 1]) and not any(runs[last + 1 :])
    assert last - first >= 5  # tagged for the ~0.8 s it was registered


def test_the_status_snapshot_over_the_socket_lists_gpus_and_delivery(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "agent.sock")
    cfg = make_cfg(tmp_path, "--simulate", "2", "--interval", "0.1", "--socket", sock_path)
    agent = Agent(cfg, stream=io.StringIO(), tty=False)
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        wait_until(lambda: os.path.exists(sock_path), what="the agent socket")
        status = wait_until(lambda: (s := query_status(sock_path))["samples"] >= 5 and s, what="5 samples")
    finally:
        agent.request_stop()
        thread.join(timeout=30)
    assert [g["index"] for g in status["gpus"]] == [0, 1]
    assert status["host"] == "node-t" and status["pid"] == os.getpid() and status["record"] == cfg.record
    assert status["database"] is None and status["spool_dir"] == cfg.spool_dir
    for key in ("lines_per_s", "spool_bytes", "lines_written", "last_write_unix", "cycles_skipped", "training_channel"):
        assert key in status


def test_a_spool_path_that_is_not_a_directory_stops_the_start_with_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "spool").write_text("not a directory")
    cfg = make_cfg(tmp_path, "--simulate", "1", "--no-socket")
    out = io.StringIO()
    assert Agent(cfg, stream=out, tty=False).run() == 1
    assert f"gpulse agent: cannot start: [Errno 17] File exists: '{tmp_path / 'spool'}" in out.getvalue()


def test_without_a_driver_the_agent_says_so_in_one_sentence_and_exits_3(clean_env: dict[str, str]) -> None:
    """The real pynvml on this machine (no NVIDIA driver) raises NVMLError_LibraryNotFound."""
    r = subprocess.run(gpulse_cmd("agent", "--no-socket"), env=clean_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("gpulse agent: ") and "--simulate" in lines[0] and "Traceback" not in r.stderr


def test_sigusr1_flushes_now_and_sigint_stops_cleanly_with_everything_recorded(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    record = tmp_path / "record.lp"
    args = ["--simulate", "8", "--interval", "0.1", "--record", str(record), "--flush-interval", "60"]
    args += ["--spool-dir", str(tmp_path / "spool"), "--no-socket"]
    agent = AgentProc(args, clean_env, tmp_path)
    try:
        wait_until(lambda: "agent on" in agent.stderr, what="the agent to start")
        time.sleep(1.0)
        assert not record.exists() or record.stat().st_size == 0  # a 60 s flush interval: nothing written yet
        agent.proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: record.exists() and record.stat().st_size > 0, timeout=5, what="the flush after SIGUSR1")
        assert agent.alive()
    finally:
        rc = agent.stop(signal.SIGINT)
    assert rc == 0
    summary = agent.summary()
    assert summary["reason"] == "SIGINT"
    lines = record.read_text().splitlines()
    assert len(lines) == summary["lines_written"] == summary["lines_submitted"] == sum(summary["points"].values())
