"""The text report as a user reads it: a figure a run does not have is ``n/a``, never ``None``."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.fixtures import gpulse_cmd

from gpulse.channel.protocol import RECORD_FILE
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
