"""A recording without a training run gives a node report: each GPU, its energy and throttling, the events.

What a new user saw: ``make up`` (no Docker) recorded the node and advised
``gpulse report --from-file .gpulse/agent.lp``, which answered "no training run found" (exit 2).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd
from test_report import T0, S, make_gpu

from gpulse.report.model import build_node_report


def test_gpu_samples_alone_give_each_gpu_its_figures_the_events_and_the_gpu_rules() -> None:
    gpu = [{k: v for k, v in r.items() if k != "run"} for r in make_gpu(n=31, util=(90.0, 20.0), throttled_every=2)]
    events = [{"time": T0 + 5 * S, "host": "node1", "gpu": "1", "uuid": "GPU-1", "kind": "xid", "xid": 79,
               "text": "GPU has fallen off the bus"}]  # fmt: skip
    r = build_node_report(gpu, events)
    assert r.hosts == ["node1"] and r.gpus == 2 and r.duration_s == 30.0
    assert [g.key for g in r.per_gpu] == ["GPU-0", "GPU-1"]
    assert r.energy_kwh == pytest.approx(
        2 * 30 * 200 / 3.6e6, rel=1e-6
    )  # 2 GPUs x 30 s x 200 W from the energy counters
    assert r.throttle_time_ratio == 0.5161 and r.gpu_avg_utilization_percent == 55.0
    assert [(e.kind, e.xid, e.gpu) for e in r.events] == [("xid", 79, "1")]
    assert {f.id for f in r.diagnosis} == {
        "gpu_starved",
        "gpu_imbalance",
        "throttling",
    }  # the rules that need only GPUs
    assert r.not_evaluated == []


def test_without_gpu_samples_the_gpu_rules_say_so_once() -> None:
    r = build_node_report([], [])
    assert r.gpus == 0 and r.diagnosis == []
    assert r.not_evaluated == [
        "GPU checks (gpu_starved, launch_bound, gpu_imbalance, throttling): no GPU samples for this recording"
    ]


def test_gpulse_report_on_an_agent_recording_writes_the_node_report(tmp_path: Path, clean_env: dict[str, str]) -> None:
    subprocess.run(
        gpulse_cmd("agent", "--simulate", "2", "--record", "node.lp", "--duration", "3", "--no-socket",
                   "--spool-dir", str(tmp_path / "spool")),
        cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    out = subprocess.run(
        gpulse_cmd("report", "--from-file", "node.lp", "--html", "--out", "rep"),
        cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a node report" in out.stdout and "GPU 0 (GPU-" in out.stdout and "GPU 1 (GPU-" in out.stdout
    assert "energy" in out.stdout and "EVENTS: 0" in out.stdout
    doc = json.loads((tmp_path / "rep" / "node_report.json").read_text())
    assert doc["gpus"] == 2 and len(doc["per_gpu"]) == 2 and doc["energy_kwh"] > 0
    assert (tmp_path / "rep" / "node_report.html").read_text().count("<svg") == 4  # util, memory, power, temperature


def test_a_file_with_neither_a_run_nor_gpu_samples_is_a_clear_error(tmp_path: Path, clean_env: dict[str, str]) -> None:
    (tmp_path / "empty.lp").write_text("agent,host=h samples=1i 1700000000000000000\n")
    out = subprocess.run(
        gpulse_cmd("report", "--from-file", "empty.lp"), cwd=tmp_path, env=clean_env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "no training run and no GPU samples in empty.lp" in out.stderr
