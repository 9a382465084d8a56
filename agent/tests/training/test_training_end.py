"""The end of a run speaks (issue 27, item 9): rank 0 prints a short summary on stderr as the run
ends, with the same numbers as ``metrics_report.json``; ``Run(quiet=True)`` silences it. And a run
id is a word a command line takes (item 8): never a leading ``-``, and ``gpulse report --run`` takes
one that has it anyway."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd

from gpulse.channel.protocol import RECORD_FILE
from gpulse.training.identity import generate_run_id
from gpulse.training.report import REPORT_FILE

#: A real CPU loop whose loader sleeps (an input bottleneck the report finds), without an agent;
#: ``finish()`` is called twice and again at exit: the summary still comes once.
LOOP = """
import sys, time
from gpulse.training import Run
out, quiet, run_id = sys.argv[1], sys.argv[2] == "quiet", sys.argv[3] or None
run = Run(name="loop", output_dir=out, socket_path=out + "/no-agent.sock", quiet=quiet, run_id=run_id)
def loader():
    for i in range(12):
        time.sleep(0.02)
        yield i
for batch in run.wrap_loader(loader()):
    with run.step(samples=4):
        with run.phase("forward"):
            time.sleep(0.002)
run.finish()
run.finish()
"""


def run_loop(tmp_path: Path, env: dict[str, str], quiet: bool = False, run_id: str = "") -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    args = [sys.executable, "-c", LOOP, str(out), "quiet" if quiet else "", run_id]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)


def summary_of(stderr: str) -> list[str]:
    """The summary's lines: from its first line (``gpulse: run ID STATUS: ...``) to its last (``report:``)."""
    lines = stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if " finished: " in line)
    last = max(i for i, line in enumerate(lines) if line.startswith("  report: "))
    return lines[first : last + 1]


def test_a_run_ends_by_saying_what_its_report_says_once_and_briefly(tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = run_loop(tmp_path, clean_env)
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    said = summary_of(res.stderr)
    assert res.stderr.count(" finished: ") == 1, res.stderr  # finish() twice, and at exit: said once
    assert len(said) <= 15
    head = said[0]
    assert head.startswith(f"gpulse: run {report['run']['id']} finished: {report['train_steps']} steps in ")
    said_rate = float(re.search(r"\(([0-9.,]+) steps/s", head).group(1).replace(",", ""))
    assert said_rate == pytest.approx(report["train_steps_per_second"], abs=1e-3)
    # where the step time went: the report's phases, as shares of their sum
    total = sum(report["phases_s"].values())
    wait = round(100 * report["phases_s"]["data_wait"] / total)
    assert f"data_wait {wait}%" in said[1] and wait > 50
    # every finding, with its action, as the report has them
    assert report["diagnosis"], "the planted input bottleneck is found"
    for i, finding in enumerate(report["diagnosis"], 1):
        n = said.index(f"  {i}. {finding['title']}")
        assert said[n + 1] == f"     action: {finding['action']}"
    assert said[-1] == f"  report: {tmp_path / 'out' / REPORT_FILE}"


def test_quiet_says_nothing_at_the_end_and_still_writes_the_report(tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = run_loop(tmp_path, clean_env, quiet=True)
    assert res.returncode == 0, res.stderr
    assert " finished: " not in res.stderr and "report:" not in res.stderr
    assert json.loads((tmp_path / "out" / REPORT_FILE).read_text())["train_steps"] == 12


def test_a_run_named_after_an_absolute_path_gets_an_id_without_a_leading_dash() -> None:
    """ms-swift names its run after its output directory, an absolute path."""
    rid = generate_run_id("/tmp/swift/output/v0-20261202-085307")
    assert rid.startswith("tmp-swift-output-v0-20261202-085307-")
    assert generate_run_id("/").startswith("run-")


def test_gpulse_report_takes_a_run_id_that_begins_with_a_dash(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """An id given as it is (``Run(run_id=...)``, ``GPULSE_RUN_ID``) may still begin with ``-``."""
    rid = "-tmp-swift-output-v0-20261202"
    assert run_loop(tmp_path, clean_env, quiet=True, run_id=rid).returncode == 0
    record = tmp_path / "out" / RECORD_FILE
    out = tmp_path / "report"
    res = subprocess.run(
        gpulse_cmd("report", "--run", rid, "--from-file", str(record), "--out", str(out), "--json"),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["run"]["id"], doc["train_steps"]) == (rid, 12)
    assert doc["train_tokens"] is None and doc["train_samples"] == 48  # tokens were not counted: unknown


def test_a_missing_run_id_is_still_said_to_be_missing(tmp_path: Path, clean_env: dict[str, str]) -> None:
    res = subprocess.run(
        gpulse_cmd("report", "--run", "--json", "--from-file", str(tmp_path / "none.rec")),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "argument --run: expected one argument" in res.stderr
