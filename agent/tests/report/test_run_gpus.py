"""Which GPUs a run's report credits to it: only those one of its ranks uses.

A rank uses a GPU when it reports that device (``train_run.gpus``: the UUIDs of the CUDA devices it
uses, registered with the agent, which then tags the GPU's points ``run=<id>``) or when NVML lists
one of its processes on that GPU (``gpu_process.pid`` = ``train_run.pid``, same host). A CPU-only run
beside an agent that samples GPUs is credited none of them, in the report built from InfluxDB, from
the agent's recording and by the training process itself (``metrics_report.json``), and all three
name the host the agent tagged the run's points with.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from agentproc import AgentProc
from support.fixtures import gpulse_cmd
from support.waiting import wait_until
from test_diagnose import SlowDataset, train
from test_report import T0, S, _write_recording, make_steps

from gpulse.report.load import load_files, run_window
from gpulse.report.model import build_report
from gpulse.sources.simulated import SimulatedSource

HOST = socket.gethostname()
#: the simulated source lists a process with pid ``base + index`` on each busy GPU
SIM_PID_BASE = 4100


def _report(cmd_args: list[str], env: dict[str, str], out: Path) -> dict:
    res = subprocess.run(
        gpulse_cmd("report", *cmd_args, "--out", str(out), "--html"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return json.loads((out / "metrics_report.json").read_text())


def test_a_cpu_only_run_beside_an_agent_with_eight_simulated_gpus_is_credited_no_gpu(influxdb, clean_env, tmp_path):
    if SIM_PID_BASE <= os.getpid() < SIM_PID_BASE + 8:
        pytest.skip("this test process has a pid the simulated GPUs list as theirs")
    os.environ.pop("GPULSE_RUN_ID", None)
    sock, record = tmp_path / "sock" / "agent.sock", tmp_path / "agent.lp"
    agent = AgentProc(
        ["--simulate", "8", "--interval", "0.2", "--flush-interval", "0.2", "--api", "v1", "--url", influxdb.url,
         "--bucket", "gpulse", "--socket", str(sock), "--spool-dir", str(tmp_path / "spool"), "--record", str(record),
         "--self-metrics-interval", "60"],
        clean_env, tmp_path,
    )  # fmt: skip
    try:
        wait_until(lambda: sock.exists() or not agent.alive(), 30, "the agent's socket")
        wait_until(lambda: influxdb.rows("SELECT count(util_gpu_pct) FROM gpu"), 30, "the first GPU samples")
        local = train(
            tmp_path / "run", torch.utils.data.DataLoader(SlowDataset(240, 0.002), batch_size=8), 30, 64, sock
        )
        run_id = local["run"]["id"]
        q = f"SELECT * FROM train_run WHERE \"run\" = '{run_id}'"
        wait_until(lambda: len(influxdb.rows(q)) == 2, 20, "the run's start and end points")
    finally:
        os.environ.pop("GPULSE_RUN_ID", None)
        agent.stop()
    start, end = (int(r["time"]) for r in sorted(influxdb.rows(q), key=lambda r: r["time"]))
    sampled = influxdb.rows(
        f"SELECT count(util_gpu_pct) FROM gpu WHERE time >= {start} AND time <= {end} GROUP BY uuid"
    )
    assert len(sampled) == 8  # the agent sampled eight GPUs while the run ran
    from_db = _report(["--run", run_id, "--url", influxdb.url, "--api", "v1", "--bucket", "gpulse"], clean_env,
                      tmp_path / "db")  # fmt: skip
    from_file = _report(["--run", run_id, "--from-file", str(record)], clean_env, tmp_path / "file")
    for name, report in (("from InfluxDB", from_db), ("from the recording", from_file), ("metrics_report.json", local)):
        assert report["per_gpu"] == [], name
        assert report["gpu_avg_utilization_percent"] is None and report["gpu_avg_sm_active_percent"] is None, name
        assert report["energy_kwh"] is None and report["gpu_avg_power_w"] is None, name
        assert report["run"]["gpus"] == [] and report["run"]["hosts"] == [HOST], name
        assert report["train_steps"] == 30, name
    assert from_db == from_file
    for out in ("db", "file"):
        page = (tmp_path / out / "metrics_report.html").read_text()
        assert "No GPU samples for this run" in page
        charts = re.findall(r'<svg[^>]* aria-label="([^"]*)"', page)
        assert charts and not [c for c in charts if "GPU" in c], charts  # no GPU chart without GPU samples


def _simulated_gpu_rows(n: int, pid_base: int, t0: int, seconds: int, host: str = "node1") -> dict[str, list[dict]]:
    """``gpu`` and ``gpu_process`` rows as the agent writes them from the simulated source."""
    src = SimulatedSource(n, host_pid_base=pid_base)
    gpus = {g.index: g for g in src.open()}
    out: dict[str, list[dict]] = {"gpu": [], "gpu_process": []}
    for i in range(seconds * 5):
        for r in src.collect(t0 + i * S // 5):
            g = gpus[r.gpu]
            tags = {"host": host, "gpu": str(g.index), "uuid": g.uuid, "model": g.model}
            if r.measurement in out:
                out[r.measurement].append({"time": r.ts_ns, **tags, **r.fields})
    return out


def _run_points(pid: int, gpus: str = "", host: str = "node1") -> list[dict]:
    base = {"run": "r1", "rank": "0", "host": host, "pid": pid, "gpus": gpus}
    return [
        {"time": T0, **base, "event": "start", "status": "running"},
        {"time": T0 + 5 * S, **base, "event": "end", "status": "finished"},
    ]


def test_a_gpu_is_the_runs_when_nvml_lists_a_rank_pid_on_it_or_the_rank_reports_it():
    pid = 31337
    rows = _simulated_gpu_rows(4, pid_base=pid - 2, t0=T0 - 10 * S, seconds=30)  # GPU 2 runs our pid
    uuid = {int(r["gpu"]): r["uuid"] for r in rows["gpu"]}
    steps = [{**r, "run": "r1"} for r in make_steps(ranks=1, n=20, step_s=0.2)]

    def credited(runs: list[dict], host_of_steps: str = "node1") -> list[str]:
        data = load_files(
            {**rows, "train_step": [{**s, "host": host_of_steps} for s in steps], "train_run": runs}, "r1"
        )
        return [g.key for g in build_report(data.steps, data.gpu, data.runs, data.events).per_gpu]

    assert any(p["pid"] == pid for p in rows["gpu_process"])
    assert credited(_run_points(pid)) == [uuid[2]]  # by the pid NVML lists on GPU 2
    assert credited(_run_points(pid, gpus=uuid[1])) == sorted([uuid[1], uuid[2]])  # and the device it reports
    assert credited(_run_points(4242)) == []  # a pid on no GPU: a CPU-only run
    assert credited(_run_points(pid, host="node2"), "node2") == []  # the same pid on another host is not ours


def test_samples_tagged_with_the_run_count_only_within_its_window_as_a_database_read_does():
    """The agent may tag a sample taken after the last step (the run still registered): a database
    read covers only the run's span, so the recording's report leaves such samples out too."""
    rows = _simulated_gpu_rows(2, pid_base=100, t0=T0 - 10 * S, seconds=30)
    tagged = [{**r, "run": "r1"} for r in rows["gpu"]]
    steps = [{**r, "run": "r1"} for r in make_steps(ranks=1, n=20, step_s=0.2)]
    runs = _run_points(4242)
    data = load_files({"gpu": tagged, "train_step": steps, "train_run": runs}, "r1")
    lo, hi = run_window(steps, runs)
    inside = [r for r in tagged if lo <= r["time"] <= hi]
    assert 0 < len(inside) < len(tagged)  # samples before and after the run are tagged too
    assert sorted(r["time"] for r in data.gpu) == sorted(r["time"] for r in inside)


def test_the_report_from_influxdb_credits_the_gpu_nvml_lists_the_rank_pid_on_as_the_recording_does(
    influxdb, clean_env, tmp_path
):
    pid = 31337
    rows = _simulated_gpu_rows(4, pid_base=pid - 2, t0=T0 - 10 * S, seconds=30)
    steps = [{**r, "run": "r1"} for r in make_steps(ranks=1, n=20, step_s=0.2)]
    rec = tmp_path / "rec.lp"
    _write_recording(rec, steps, rows["gpu"], _run_points(pid), gpu_process=rows["gpu_process"])
    influxdb.write(rec.read_text())
    from_db = _report(["--run", "r1", "--url", influxdb.url, "--api", "v1", "--bucket", "gpulse"], clean_env,
                      tmp_path / "db")  # fmt: skip
    from_file = _report(["--run", "r1", "--from-file", str(rec)], clean_env, tmp_path / "file")
    assert [g["gpu"] for g in from_db["per_gpu"]] == ["2"] and from_db["gpu_avg_utilization_percent"] is not None
    assert from_db == from_file
