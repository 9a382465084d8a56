"""``make gpu-check``: what can be proven without a GPU.

This machine has no NVIDIA GPU, so the check itself cannot pass here. What runs here: it fails
with one sentence without a driver or without a CUDA torch, and its assertions judge a record
that the real agent wrote from the NVML stand-in (``support.fake_pynvml``) under a scripted load:
they pass on busy GPUs and fail on idle ones, without the load, and without CUDA-event steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import pytest
from support.fake_pynvml import FakeNvml, busy, h100, h200
from support.fixtures import REPO

from gpulse.agent.config import load_config
from gpulse.agent.loop import Agent
from gpulse.cli.commands import agent as agent_cmd
from gpulse.sources.nvml.source import NvmlSource

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
_spec.loader.exec_module(gpu_check)  # type: ignore[union-attr]
pytestmark = pytest.mark.slow  # the check script, the agent and torch in child processes: not for the fast lane

MIB = 1 << 20


def test_without_a_gpu_it_says_so_in_one_sentence_and_fails(clean_env: dict[str, str]) -> None:
    """``make gpu-check`` on this machine: the real pynvml finds no driver."""
    r = subprocess.run(
        ["make", "-s", "gpu-check"], cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0
    assert "gpu-check: no NVIDIA driver is usable on this machine (NVML: NVML Shared Library Not Found); " \
        "nothing to check (run this on a machine with an NVIDIA GPU)." in r.stderr.splitlines()  # fmt: skip
    assert "Traceback" not in r.stderr


def test_a_cpu_build_of_torch_is_refused_as_no_load(clean_env: dict[str, str]) -> None:
    problem = gpu_check.cuda_torch_problem(sys.executable, clean_env)  # the project's venv: CPU torch
    assert problem is not None and "CPU build" in problem and "PY=" in problem


def record_of_a_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: list) -> tuple:
    """The real agent on the stand-in for a few seconds; (record, final summary, baseline used)."""
    fake = FakeNvml.install(monkeypatch, gpus=gpus)
    baseline = {g.index: 1 * MIB for g in gpus}  # memory used before the load (the captures' idle 1 MiB)
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    args = parser.parse_args(["--record", str(tmp_path / "r.lp"), "--no-socket", "--interval", "0.5",
                              "--duration", "4.2", "--self-metrics-interval", "1", "--spool-dir",
                              str(tmp_path / "spool"), "--host", "gpu-check"])  # fmt: skip
    agent = Agent(load_config(args), source=NvmlSource(events=False), stream=io.StringIO(), tty=False)
    assert agent.run() == 0
    fake.check()
    return gpu_check.read_record(tmp_path / "r.lp"), agent.summary(), baseline


def loads_of(gpus: list) -> dict:
    """What each load process would report: its pid and torch's reserved memory (context: 500 MiB)."""
    return {g.index: gpu_check.Load(g.index, pid, mem - 500 * MIB) for g in gpus for pid, mem in g.compute_procs}


def statuses(checks: list) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def test_the_assertions_pass_on_busy_gpus(tmp_path, monkeypatch):
    gpus = [busy(h100(0)), busy(h200(1))]
    rec, final, baseline = record_of_a_node(tmp_path, monkeypatch, gpus)
    checks = gpu_check.analyse(rec, 2, loads_of(gpus), baseline, final, 0.5, None)
    got = statuses(checks)
    assert got.pop("training_step") == "fail"  # no CUDA-event steps here (see the next test)
    got.pop("skipped_cycles")  # a loaded 2-core machine may skip a 0.5 s cycle; judged below on its own
    assert got == dict.fromkeys(got, "pass"), [c for c in checks if c.status != "pass"]
    figures = {c.name: c.figures for c in checks}
    assert figures["memory"]["memory"][0]["context"] == 500 * MIB
    assert figures["cycle_time"]["cycle_ms_per_gpu_median"] > 0
    assert figures["energy"]["energy"][1]["from_energy_w"] == pytest.approx(609.0, rel=0.05)  # 0.87 x 700 W


def test_idle_gpus_or_a_missing_load_fail(tmp_path, monkeypatch):
    gpus = [h100(0)]  # idle, as captured
    rec, final, baseline = record_of_a_node(tmp_path, monkeypatch, gpus)
    got = statuses(gpu_check.analyse(rec, 1, {}, baseline, final, 0.5, None))
    assert got["load"] == "fail" and got["utilisation"] == "fail"
    assert got["metrics_seen"] == "pass" and got["nvml_errors"] == "pass"


def test_memory_that_does_not_add_up_with_torchs_fails(tmp_path, monkeypatch):
    gpus = [busy(h100(0))]
    rec, final, baseline = record_of_a_node(tmp_path, monkeypatch, gpus)
    pid, mem = gpus[0].compute_procs[0]
    wrong = {0: gpu_check.Load(0, pid, mem + 1 * (1 << 30))}  # torch claims more than the process holds
    checks = {c.name: c for c in gpu_check.analyse(rec, 1, wrong, baseline, final, 0.5, None)}
    assert checks["memory"].status == "fail" and "torch reserved" in checks["memory"].detail
    assert checks["load_process"].status == "fail"


def test_skipped_cycles_nvml_errors_and_training_steps_are_judged_from_the_record():
    def rec(points: dict) -> object:
        return gpu_check.Recorded(points, 0)

    agent_pt = ({"host": "h"}, {"nvml_errors_timeout": 2, "nvml_errors_other": 0, "cycle_ms": 3.0}, 1)
    step = ({"run": "r1", "host": "h"}, {"forward_gpu_s": 0.01, "backward_gpu_s": 0.02}, 2)
    gpu_pt = ({"gpu": "0", "run": "r1"}, {"util_gpu_pct": 99.0}, 3)
    points = {"agent": [agent_pt], "train_step": [step] * 3, "gpu": [gpu_pt]}
    got = {c.name: c for c in gpu_check.analyse(rec(points), 1, {}, {}, {"cycles_skipped": 1}, 0.5, {"run_id": "r1"})}
    assert got["skipped_cycles"].status == "fail" and got["nvml_errors"].status == "fail"
    assert "2 failed NVML call(s): timeout" in got["nvml_errors"].detail
    assert got["training_step"].status == "pass" and got["cycle_time"].status == "pass"
    cpu_steps = {"train_step": [({"run": "r1"}, {"forward_s": 0.01}, 2)], "gpu": [gpu_pt]}
    got = {
        c.name: c for c in gpu_check.analyse(rec(cpu_steps), 1, {}, {}, {"cycles_skipped": 0}, 0.5, {"run_id": "r1"})
    }
    assert got["training_step"].status == "fail" and got["skipped_cycles"].status == "pass"


def test_the_pcie_unit_is_measured_against_the_byte_counter(monkeypatch, clean_env):
    """The arithmetic and the call path, on the stand-in (which models KiB: the unit itself needs a GPU)."""
    FakeNvml.install(monkeypatch, gpus=[busy(h100(0))])
    monkeypatch.setattr(
        gpu_check, "COPY", "import sys, time; print('ready', flush=True); time.sleep(float(sys.argv[1]))"
    )
    got = gpu_check.pcie_unit(clean_env, seconds=0.5)
    assert got["verdict"] == "KB = 1024 bytes" and got["counter_rx_bytes_per_s"] == pytest.approx(1.0e9, rel=0.01)
    FakeNvml.install(monkeypatch, gpus=[busy(h100(0, pcie_counters=False))])
    assert "no PCIe byte counters" in gpu_check.pcie_unit(clean_env, seconds=0.5)["skipped"]
