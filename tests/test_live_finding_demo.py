"""``scripts/live-finding-demo.sh`` (the README's command) runs as written and shows what it says:
the change, the agent's log line of the raise, ``gpulse status`` and ``gpulse status --json`` listing
the open finding while the run goes, then the clear, each stamped in UTC and in that order."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
from support.fixtures import REPO

pytestmark = pytest.mark.slow  # a real agent and a training run of some 650 steps: not for the fast lane

STAMP = r"(\d\d:\d\d:\d\d\.\d{3}) UTC"


def at(out: str, pattern: str) -> str:
    """The UTC stamp of the first line matching ``pattern`` (HH:MM:SS.mmm, which sorts as time does)."""
    m = re.search(rf"^{STAMP}  {pattern}", out, re.M)
    assert m is not None, (pattern, out)
    return m.group(1)


def test_the_demo_shows_a_live_finding_raised_listed_and_cleared(clean_env: dict[str, str]) -> None:
    env = {**clean_env, "PY": sys.executable, "PYTHONPATH": os.pathsep.join([str(REPO / "agent" / "src"), clean_env.get("PYTHONPATH", "")])}  # fmt: skip
    # a directory of its own, not pytest's tmp_path: a minute and a half is long enough for another
    # pytest session of the same user to prune this one's base directory
    with tempfile.TemporaryDirectory(prefix="gpulse-live-demo-") as d:
        done = subprocess.run(
            ["scripts/live-finding-demo.sh", f"{d}/demo"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    out = done.stdout
    print(out)
    assert done.returncode == 0, out + done.stderr
    change, raised = at(out, "CHANGE at step 100"), at(out, "the agent's log:\n    .* WARNING .*data_loading raised at")
    status, back = at(out, r"gpulse status:\n(?:.*\n)*?    Open findings:\n      run \S+: data_loading since step"), at(out, "CHANGE at step 350")  # fmt: skip
    cleared, after = at(out, "the agent's log:\n    .* INFO .*data_loading cleared"), at(out, "gpulse status, after the clear:\n    Open findings: none")  # fmt: skip
    ended = at(out, "training run ended")
    assert change < raised <= status < back < cleared <= after < ended
    # the JSON listing, as printed: the run's open data_loading finding with its case and figures
    block = out.split("gpulse status --json (its findings):\n", 1)[1]
    listing = json.loads(block[: block.index("\n    }\n") + 6])
    [(run, [finding])] = listing.items()
    assert finding["rule"] == "data_loading" and finding["state"] == "raised" and finding["run"] == run
    assert finding["case"] and finding["figure_ratio"] > 0.15
    # the CPU-only run is listed among the agent's runs while it goes (its start point named its process)
    assert f"    Runs: {run} (1 rank, no GPU registered)\n" in out
    # the run heard of it, and the window its raise asked for is in its report
    assert re.search(r"^    data_loading cleared, held steps \d+-\d+$", out, re.M)
    assert re.search(r"^    trace .*\.pt\.trace\.json\.gz$", out, re.M)
