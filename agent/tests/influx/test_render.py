"""The checked-in files under influxdb/ are exactly what the generator renders, and its check mode sees a stale one."""

from __future__ import annotations

import subprocess
import sys

from support.fixtures import REPO

from gpulse.influx.render import generated_files


def test_checked_in_files_equal_the_generator_output():
    for rel, text in generated_files().items():
        assert (REPO / "influxdb" / rel).read_text(encoding="utf-8") == text, f"influxdb/{rel}: run make generate"
    r = subprocess.run(
        [sys.executable, "-m", "gpulse.influx.render", "--check", str(REPO / "influxdb")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_the_check_mode_reports_a_stale_file(tmp_path):
    subprocess.run([sys.executable, "-m", "gpulse.influx.render", "--write", str(tmp_path)], check=True)
    task = tmp_path / "tasks" / "gpulse_raw_to_1m.flux"
    task.write_text(task.read_text() + "// edited by hand\n")
    r = subprocess.run(
        [sys.executable, "-m", "gpulse.influx.render", "--check", str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "tasks/gpulse_raw_to_1m.flux" in r.stderr
