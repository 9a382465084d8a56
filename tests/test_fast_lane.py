"""The fast lane (``make test-fast``): what stays out of it, read from what a test file uses, and a
slow program started from it anyway fails the test instead of slowing the lane down unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import REPO
from support.lanes import lane

TORCH = "torch"  # samples name it through an f-string, so that this file's own literals hold no torch program
SLOW = {
    "the browser": "from support.chromium import layout\n",
    "the Grafana types harness (Node)": "from grafana_ts import tsc\n",
    "the Flux parser (Node)": "def parse(src):\n    from support import flux_parser\n",
    "gloo ranks": f"import {TORCH}.distributed as dist\n",
    "torch processes": f"import {TORCH}.multiprocessing as mp\n",
    "the multi-rank scenarios": "from ranks_truth import run_torchrun\n",
    "Lightning": "import pytorch_lightning as pl\n",
    "a spawned training process": f'import subprocess, sys\nCODE = """\nimport {TORCH}\nprint(torch.ones(1))\n"""\n',
    "a wheel build": 'def make():\n    return ["python", "-m", "pip", "wheel", "."]\n',
    "a fresh clone": 'import pytest\n\n@pytest.fixture\ndef clone():\n    return ["git", "clone", "."]\n',
    "the demo": 'from support.fixtures import gpulse_cmd\n\nCMD = gpulse_cmd("demo", "--hours", "1")\n',
    "the real agent": "from agentproc import AgentProc\n",
    "the InfluxDB 2 stand-in (Node)": "from support.fake_influx_v2_admin import FakeInfluxV2Admin\n",
    "Node by name": 'import subprocess\n\ndef check():\n    subprocess.run(["node", "-e", "1"])\n',
    "a module-level mark": "import pytest\n\npytestmark = [pytest.mark.influxdb, pytest.mark.slow]\n",
}
FAST = {
    "plain": "from gpulse.delivery.spool import Spool\n\ndef test_x():\n    assert Spool\n",
    "torch in one process": f"import {TORCH}\n\ndef test_x():\n    assert torch.ones(1).sum() == 1\n",
    "a process name in a string": 'CMD = b"python\\0-m\\0torch.distributed.run\\0"  # what /proc shows\n',
    "one test marked slow": "import pytest\n\n@pytest.mark.slow\ndef test_x():\n    pass\n",
}


@pytest.mark.parametrize("source", SLOW.values(), ids=SLOW.keys())
def test_a_file_that_uses_a_slow_thing_is_outside_the_fast_lane(tmp_path: Path, source: str) -> None:
    (tmp_path / "test_it.py").write_text(source)
    assert lane(tmp_path / "test_it.py").file


@pytest.mark.parametrize("source", FAST.values(), ids=FAST.keys())
def test_other_files_are_in_it(tmp_path: Path, source: str) -> None:
    (tmp_path / "test_it.py").write_text(source)
    assert lane(tmp_path / "test_it.py").file is None and not lane(tmp_path / "test_it.py").tests


def test_a_slow_thing_inside_one_test_puts_only_that_test_out(tmp_path: Path) -> None:
    (tmp_path / "test_it.py").write_text(
        "def test_short():\n    pass\n\n"
        "def test_with_the_stand_in():\n    from support.fake_influx_v2_admin import FakeInfluxV2Admin\n\n"
        "class TestBuild:\n    def test_wheel(self):\n        return ['pip', 'wheel', '.']\n"
    )
    found = lane(tmp_path / "test_it.py")
    assert found.file is None
    assert found.tests == {
        "test_with_the_stand_in": "imports support.fake_influx_v2_admin",
        "test_wheel": "builds a wheel",
    }
    assert found.reason("test_short") is None and found.reason("test_wheel") == "builds a wheel"


def test_make_test_fast_runs_pytest_in_the_fast_lane() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}  # also when make runs us
    plan = subprocess.run(
        ["make", "-n", "--no-print-directory", "test-fast"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    workers = 2 * len(os.sched_getaffinity(0))  # two a CPU (nproc): the lane mostly waits on servers and subprocesses
    assert plan.stdout.splitlines()[-1].endswith(f"-m pytest --fast -q -n {workers} --dist worksteal"), plan.stdout


def pytest_in(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on ``directory`` with the repository's conftest (its options, marks and lane) as a plugin."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-c", str(REPO / "pytest.ini"), "--rootdir", str(directory)]
        + ["-p", "no:cacheprovider", "-q", *args, str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_the_lane_leaves_slow_files_unimported_deselects_slow_tests_and_fails_a_slow_program_started_anyway(
    tmp_path: Path, workers: list[str]
) -> None:
    """The same in pytest-xdist's workers (``make test-fast`` runs the lane with two workers a CPU)."""
    (tmp_path / "test_browser.py").write_text("from support.chromium import layout\n\ndef test_page():\n    pass\n")
    (tmp_path / "test_mixed.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_long():\n    pass\n\ndef test_short():\n    pass\n\n"
        "def test_clone():\n    return ['git', 'clone', '.']\n"
    )
    (tmp_path / "helper.py").write_text(
        "import subprocess\n\ndef check_with_node():\n    subprocess.run(['node', '--version'])\n"
    )
    (tmp_path / "test_uses_helper.py").write_text(
        "from helper import check_with_node\n\ndef test_checks_with_node():\n    check_with_node()\n"
    )
    fast = pytest_in(tmp_path, "--fast", "-rA", *workers)
    ran = set(re.findall(r"^(?:PASSED|FAILED) \S+::(\w+)", fast.stdout, re.M))
    assert ran == {"test_short", "test_checks_with_node"}, fast.stdout  # not test_page, test_long, test_clone
    assert "1 failed, 1 passed" + ("" if workers else ", 2 deselected") in fast.stdout  # workers deselect on their own
    assert "the fast lane (pytest --fast) started 'node': that test is slow" in fast.stdout
    assert "pytestmark = pytest.mark.slow" in fast.stdout
