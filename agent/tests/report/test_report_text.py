"""The text report as a user reads it: a figure a run does not have is ``n/a``, never ``None``."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

from support.fixtures import gpulse_cmd

from gpulse.channel.protocol import RECORD_FILE
from gpulse.report.model import build_report
from gpulse.report.records import Finding
from gpulse.report.text import render_summary
from gpulse.training import Run


def test_a_cpu_run_s_text_report_says_n_a_for_allocator_retries_and_none_of_its_lines_says_none(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """What a user saw: ``allocator retries None`` for a run without CUDA."""
    out = tmp_path / "out"
    run = Run(name="cpu", output_dir=out, socket_path=str(tmp_path / "none.sock"), write_report=False)
    for _ in range(4):
        with run.step(samples=2):
            pass
    run.finish()
    report = subprocess.run(
        gpulse_cmd("report", "--from-file", str(out / RECORD_FILE), "--out", str(tmp_path / "report")),
        env=clean_env, capture_output=True, text=True,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert "allocator retries n/a" in report.stdout
    assert "None" not in report.stdout, report.stdout


def _report_with(findings: int, partial_reason: str | None = None):
    steps = [
        {"run": "r1", "rank": "0", "world_size": "1", "step": i, "step_time_s": 0.1, "data_wait_s": 0.1,
         "forward_s": 0.06, "samples": 4, "time": (i + 1) * 200_000_000}
        for i in range(10)
    ]  # fmt: skip
    report = build_report(steps, [], [], [], partial_reason=partial_reason)
    found = [Finding(f"rule{i}", f"title {i}", "evidence", "threshold", f"do {i}", {}) for i in range(findings)]
    return replace(report, diagnosis=found)


def test_the_end_of_run_summary_names_at_most_four_findings_and_stays_short() -> None:
    lines = render_summary(
        _report_with(6, "rank(s) 1 did not finish within 3 s"), ["out/metrics_report.json"]
    ).splitlines()
    assert len(lines) <= 15
    assert lines[0].startswith("gpulse: run r1 ") and " 10 steps in " in lines[0]
    assert lines[1] == "  time per step 0.2 s (data wait included): data_wait 50%, forward 30%, other 20%"
    assert "  partial: rank(s) 1 did not finish within 3 s" in lines
    assert [x for x in lines if x.startswith("     action: ")] == [f"     action: do {i}" for i in range(4)]
    assert "  ... and 2 more finding(s) in the report" in lines
    assert lines[-1] == "  report: out/metrics_report.json"


def test_a_summary_without_findings_says_so() -> None:
    assert "  no bottleneck found" in render_summary(_report_with(0), []).splitlines()
