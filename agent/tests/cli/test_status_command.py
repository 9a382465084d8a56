"""``gpulse status`` asks the running agent over its socket and prints GPUs, runs, rate, spool, last write."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from agentproc import AgentProc
from support.fixtures import gpulse_cmd
from support.waiting import wait_until

from gpulse.agent.status_line import format_status
from gpulse.cli.commands.status import AgentUnreachable, query_status, render, run_summary


def status_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpulse_cmd("status", *args), env=env, capture_output=True, text=True, timeout=60)


def test_status_prints_the_running_agents_view_as_text_and_as_json(clean_env: dict[str, str], tmp_path: Path) -> None:
    sock = str(tmp_path / "sock" / "agent.sock")
    record = tmp_path / "record.lp"
    args = ["--simulate", "3", "--simulate-model", "A100", "--interval", "0.1", "--record", str(record)]
    agent = AgentProc(
        [*args, "--spool-dir", str(tmp_path / "spool"), "--socket", sock, "--host", "st-node"], clean_env, tmp_path
    )
    try:
        wait_until(lambda: record.exists() and record.stat().st_size > 0, what="the first flush")
        js = status_cli(clean_env, "--json", "--socket", sock)
        assert js.returncode == 0, js.stderr
        status = json.loads(js.stdout)
        assert [g["model"] for g in status["gpus"]] == ["NVIDIA A100-SXM4-80GB"] * 3
        assert status["host"] == "st-node" and status["pid"] == agent.pid and status["samples"] > 0
        assert status["lines_written"] > 0 and status["last_write_unix"] > 0
        # GPULSE_SOCKET points the command at the agent, as it does for training processes
        text = status_cli({**clean_env, "GPULSE_SOCKET": sock})
        assert text.returncode == 0, text.stderr
    finally:
        assert agent.stop() == 0
    out = text.stdout
    assert "gpulse agent 0.1.0 on st-node" in out and "3 GPUs" in out and "lines/s" in out
    assert "Runs: none" in out and f"Recording to: {record}" in out
    assert "Last successful write: 20" in out  # a date, not "never"
    # two status requests came before this one, and no training process ever ran: nothing was received
    assert "Training records: 0 received, 0 rejected" in out
    assert status["records_received"] == 0


def test_status_without_an_agent_says_so_and_exits_1(clean_env: dict[str, str], tmp_path: Path) -> None:
    r = status_cli(clean_env, "--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 1
    assert (
        r.stderr.strip()
        == f"gpulse status: no agent socket at {tmp_path / 'none.sock'}: is 'gpulse agent' running (without --no-socket)?"
    )


def test_a_silent_socket_times_out_with_a_clear_message(tmp_path: Path) -> None:
    path = str(tmp_path / "mute.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mute:
        mute.bind(path)  # bound but never answers
        with pytest.raises(AgentUnreachable, match=r"did not answer within 0\.3s"):
            query_status(path, timeout=0.3)


def test_an_error_reply_is_shown_as_such() -> None:
    assert (
        render({"error": "status unavailable: RuntimeError"})
        == "agent answered with an error: status unavailable: RuntimeError"
    )


def test_an_agent_too_busy_to_take_the_request_is_waited_for_then_named(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    path = str(tmp_path / "run" / "agent.sock")
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as busy,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as flood,
    ):
        busy.bind(path)  # never reads: its queue fills up
        flood.connect(path)
        flood.setblocking(False)
        with pytest.raises(BlockingIOError):
            while True:
                flood.send(b"{}")
        with pytest.raises(AgentUnreachable, match=r"took no request within 0\.3s \(its queue is full\)"):
            query_status(path, timeout=0.3)


def test_status_lists_every_run_it_hears_from_with_its_ranks_and_the_gpus_it_registered() -> None:
    """A CPU-only run (or a GPU run before it registers) is a run too: ``gpulse status`` lists it."""
    status = {
        "training": [
            {"run": "cpu-run", "rank": "0", "pid": 11},
            {"run": "gpu-run", "rank": "0", "pid": 12},
            {"run": "gpu-run", "rank": "1", "pid": 13},
        ],
        "gpus": [{"index": 0, "run": "gpu-run"}, {"index": 1, "run": "gpu-run"}, {"index": 2, "run": None}],
    }
    assert run_summary(status) == "cpu-run (1 rank, no GPU registered); gpu-run (2 ranks, GPU 0, 1)"
    assert run_summary({"gpus": [{"index": 3, "run": "old-agent-run"}]}) == "old-agent-run (GPU 3)"
    assert run_summary({}) == "none"


def test_the_headline_counts_the_runs_the_runs_line_lists() -> None:
    """A CPU-only run is counted in the headline as it is listed below it (they once said 1 and listed 2)."""
    status = {
        "gpus": [{"index": 0, "uuid": "GPU-0", "model": "A100", "lost": False, "run": "g"}],
        "runs": {"GPU-0": "g"},
        "training": [{"run": "cpu", "rank": "0", "pid": 11}, {"run": "g", "rank": "0", "pid": 12}],
        "lines_per_s": 10.0,
    }
    page = render(status)
    print(page)
    headline, runs_line = page.splitlines()[1], next(x for x in page.splitlines() if x.startswith("Runs: "))
    assert headline.startswith("1 GPU, 2 run(s) | ")
    assert runs_line == "Runs: cpu (1 rank, no GPU registered); g (1 rank, GPU 0)"
    assert format_status(status) == headline
