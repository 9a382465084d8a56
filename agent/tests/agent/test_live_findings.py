"""Rolling findings with a real agent beside real training loops (issue 28 item 1).

The agent (``gpulse agent --record``, short windows) receives a real loop's steps through the
training channel (``live_loop.py``, its own process, the real training library). Ground truth comes
from around the loop: the wall-clock time at which its ``Dataset.__getitem__`` turned slow and fast
again, or a rank began to straggle. The raises and clears are read from the agent's recording
(``train_finding`` points), while the run is going from ``gpulse status --json``, and from the
run's own ``metrics_report.json`` (``live_findings``, told by the agent). Each test
prints the times of the change and of the raise/clear.

The window is 30 steps or 2.5 s, whichever holds more; "within two windows" is judged in seconds
against twice the longer of the two at the pace the loop measured after the change, plus the time
steps take to reach the agent (the training worker sends once a second) and one evaluation and one
sampling interval of the agent (when the evaluation can next run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from agentproc import AgentProc
from support.cgroup_limits import SlowDisk
from support.fixtures import gpulse_cmd
from support.waiting import wait_until

from gpulse.report.load import read_points

HERE = Path(__file__).parent
TESTS = HERE.parent
WINDOW_STEPS, WINDOW_S, EVERY_S, INTERVAL_S = 30, 2.5, 0.25, 0.2
#: the training library's worker sends its steps once a second (``Run(tick_s=1.0)``, the default)
TICK_S = 1.0


class Watch:
    """``gpulse status --json`` every half second while the loop runs: the open findings seen, with when."""

    def __init__(self, sock: Path, env: dict[str, str]) -> None:
        self.sock, self.env = sock, env
        self.seen: list[tuple[int, str, str]] = []  # (ns, run, rule)
        self.text: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            cmd = gpulse_cmd("status", "--json", "--socket", str(self.sock))
            res = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=30)
            if res.returncode == 0:
                for run, open_ in (json.loads(res.stdout).get("findings") or {}).items():
                    self.seen += [(time.time_ns(), run, f["rule"]) for f in open_]
                if '"findings": {}' not in res.stdout:
                    plain = subprocess.run(
                        gpulse_cmd("status", "--socket", str(self.sock)), env=self.env, capture_output=True, text=True
                    )
                    self.text.append(plain.stdout)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def run_beside_agent(
    tmp: Path, env: dict[str, str], *loop: str, prefix: list[str] | None = None, agent_flags: tuple[str, ...] = ()
) -> tuple[list[dict], list[dict], Watch, str]:
    """Run ``live_loop.py`` beside a real agent (``prefix``: a command that runs it in a cgroup):
    (train_finding rows, truths, the status watch, agent log)."""
    sock, record = tmp / "sock" / "agent.sock", tmp / "agent.lp"
    flags = ["--simulate", "1", "--interval", str(INTERVAL_S), "--record", str(record), "--socket", str(sock)]
    live = ["--live-window-steps", str(WINDOW_STEPS), "--live-window-s", str(WINDOW_S), "--live-every-s", str(EVERY_S)]
    agent = AgentProc([*flags, *live, *agent_flags, "--spool-dir", str(tmp / "spool")], env, tmp)
    out = tmp / "out"
    try:
        wait_until(sock.exists, what="the agent's socket")
        watch = Watch(sock, env)
        path = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
        cmd = [*(prefix or []), sys.executable, str(HERE / "live_loop.py"), str(out), str(sock), *loop]
        try:
            subprocess.run(cmd, env={**env, "PYTHONPATH": path}, check=True, timeout=600)
        finally:
            watch.stop()
    finally:
        assert agent.stop() == 0
    rows, bad = read_points([record])
    assert bad == []
    truths = [json.loads(p.read_text()) for p in sorted(out.glob("truth*.json"))]
    findings = sorted(rows.get("train_finding", []), key=lambda r: r["time"])
    for f in findings:
        print(f"{f['time']} {f['rule']} {f['state']} steps {f['first_step']}-{f['last_step']}: {f['evidence']}")
    return findings, truths, watch, agent.stderr


def within_two_windows(change_ns: int, at_ns: int, slow_step_s: float) -> bool:
    window_s = max(WINDOW_S, WINDOW_STEPS * slow_step_s)
    return 0 < at_ns - change_ns <= (2 * window_s + TICK_S + EVERY_S + INTERVAL_S) * 1e9


def show(what: str, change_ns: int, at_ns: int) -> None:
    print(f"{what}: change at {change_ns} ns, finding at {at_ns} ns, {(at_ns - change_ns) / 1e9:.2f} s later")


def raised_then_cleared(tmp: Path, findings: list[dict], truth: dict, watch: Watch, log: str) -> dict:
    """A run whose loader turned slow at ``change_ns`` and fast again at ``back_ns`` (the truth): its
    ``data_loading`` finding was raised within two windows of the change, while the run went on, and
    cleared within two windows of the end of it; ``gpulse status`` (JSON and text) listed it while it
    was open, the agent logged both, and the run lists it in ``metrics_report.json``. The raise."""
    states = [(f["rule"], f["state"]) for f in findings]
    assert states == [("data_loading", "raised"), ("data_loading", "cleared")], states
    raised, cleared = findings
    assert raised["run"] == truth["run"] and raised["figure_ratio"] > 0.15 and raised["action"]
    show("turned data-bound", truth["change_ns"], raised["time"])
    show("back to fast", truth["back_ns"], cleared["time"])
    assert within_two_windows(truth["change_ns"], raised["time"], truth["slow_step_s"])
    assert within_two_windows(truth["back_ns"], cleared["time"], truth["fast_step_s"])
    assert cleared["time"] < truth["end_ns"], "cleared only after the run ended"
    assert any(truth["change_ns"] < t < truth["back_ns"] + 4e9 and r == truth["run"] for t, r, _ in watch.seen)
    assert any("data_loading since step" in t for t in watch.text)
    assert "data_loading raised at step" in log and "data_loading cleared" in log
    # the run heard of it from the agent and lists it, with the steps it held, in metrics_report.json
    (entry,) = json.loads((tmp / "out" / "metrics_report.json").read_text())["live_findings"]
    assert entry["rule"] == "data_loading" and entry["state"] == "cleared"
    assert (entry["first_step"], entry["last_step"]) == (cleared["first_step"], cleared["last_step"])
    assert truth["profile_requests"] == ["data_loading"]  # the raise asked for the profiler window, once
    return raised


def test_a_run_turning_data_bound_raises_data_loading_live_as_cpu_bound_workers_and_clears_after(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    findings, (truth,), watch, log = run_beside_agent(tmp_path, clean_env, "shift", "400", "80", "200")
    raised = raised_then_cleared(tmp_path, findings, truth, watch, log)
    assert 80 <= raised["first_step"] < raised["last_step"] <= 200 + 2 * WINDOW_STEPS
    # the case, from the host beside the steps: the workers were on (or waiting for) a CPU
    assert raised["case"] == "cpu_bound_workers" and raised["evidence"].count("CPU-bound workers:") == 1
    assert raised["figure_workers"] == 2 and raised["figure_loader_running_ratio"] >= 0.5
    assert raised["figure_loader_disk_sleep_ratio"] < 0.2


def test_a_run_turning_data_bound_on_a_slow_disk_raises_data_loading_live_as_io_bound_and_clears_after(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """The same run, its slow items each one O_DIRECT read of a loop device the kernel throttles
    (blkio / io.max) for the loop's cgroup: the workers wait in state D, the disk is the limit."""
    rate = 1 << 20  # 32 reads/s: 8 steps/s at most, while the loop alone runs at about 20
    disk = SlowDisk(tmp_path, read_bytes_per_s=rate)
    try:
        loop = ("io", "400", "80", "200", disk.device, str(disk.size))
        findings, (truth,), watch, log = run_beside_agent(tmp_path, clean_env, *loop, prefix=disk.prefix())
    finally:
        disk.close()
    raised = raised_then_cleared(tmp_path, findings, truth, watch, log)
    assert 80 <= raised["first_step"] < raised["last_step"] <= 200 + 2 * WINDOW_STEPS
    assert raised["case"] == "io_bound" and raised["evidence"].count("I/O-bound:") == 1
    assert raised["figure_workers"] == 2 and raised["figure_loader_disk_sleep_ratio"] >= 0.5
    # what the workers read, by the agent's samples, against the throttle the kernel held them to
    assert 0.5 * rate <= raised["figure_loaders_read_bytes_per_s"] <= 1.5 * rate
    assert "Storage is the limit" in raised["action"] and "num_workers=" not in raised["action"]


def test_a_healthy_run_raises_nothing(tmp_path: Path, clean_env: dict[str, str]) -> None:
    findings, (truth,), watch, _ = run_beside_agent(tmp_path, clean_env, "healthy", "200")
    assert findings == [] and watch.seen == []
    assert truth["run"]


def test_an_agent_with_no_live_findings_raises_nothing_for_a_run_turning_data_bound(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    findings, (truth,), watch, log = run_beside_agent(
        tmp_path, clean_env, "shift", "300", "60", "180", agent_flags=("--no-live-findings",)
    )
    assert findings == [] and watch.seen == [] and "finding:" not in log
    report = json.loads((tmp_path / "out" / "metrics_report.json").read_text())
    assert report["live_findings"] == []
    assert "data_loading" in [f["id"] for f in report["diagnosis"]]  # the run was data-bound: the rule would hold
    assert truth["profile_requests"] == []


def test_a_straggling_rank_raises_rank_imbalance_live_in_a_gloo_run(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """Only rank_imbalance is asserted: on this CPU gloo's all-reduce is a real share of a 20 ms step,
    so the communication rule may rightly hold too (it shows in the printed findings)."""
    findings, truths, _, _ = run_beside_agent(tmp_path, clean_env, "straggler", "200", "60")
    assert {f["run"] for f in findings} <= {t["run"] for t in truths}
    raised = [f for f in findings if f["rule"] == "rank_imbalance" and f["state"] == "raised"]
    assert len(raised) == 1, [(f["rule"], f["state"]) for f in findings]
    assert "rank 1 " in raised[0]["evidence"] and raised[0]["figure_wait_caused_s"] > 0
    change = min(t["change_ns"] for t in truths)
    show("rank 1 began to straggle", change, raised[0]["time"])
    assert within_two_windows(change, raised[0]["time"], truths[1]["slow_step_s"])
    assert raised[0]["time"] < min(t["end_ns"] for t in truths), "raised only after the run ended"
