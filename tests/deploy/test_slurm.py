"""deploy/slurm/README.md as a site follows it: every block it shows is run or read here.

The ``install`` block runs as written, with ``/etc/slurm`` moved under a test directory (as the
systemd test points ``ExecStart`` at this checkout); the ``slurm.conf`` lines are expanded as slurmd
expands them (``glob(3)`` on each ``Prolog``/``Epilog`` value: ``src/plugins/prep/script/prep_script_slurmd.c``,
``_script_list_create``), and the copies they find run as slurmd runs them; the ``toml`` block is
the agent's configuration, loaded by the agent's own loader.
"""

from __future__ import annotations

import argparse
import glob
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support import slurm_scripts as slurm
from support.fixtures import REPO

from gpulse.agent.config import load_config
from gpulse.cli.commands import agent as agent_cmd

README = REPO / "deploy" / "slurm" / "README.md"
_FENCE = re.compile(r"^```(?P<lang>\w+)(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
JOB = slurm.Job("21", "erin", 1004, "vision", "gpu", (0, 2))


def blocks() -> dict[str, tuple[str, str]]:
    """id -> (language, body) of every fenced block; each must be marked ``runnable id=NAME``."""
    out = {}
    for m in _FENCE.finditer(README.read_text()):
        info = m.group("info").split()
        assert "runnable" in info, f"deploy/slurm/README.md: a ```{m.group('lang')} block no test runs"
        (name,) = [w.split("=", 1)[1] for w in info if w.startswith("id=")]
        out[name] = (m.group("lang"), m.group("body"))
    return out


def slurm_conf() -> dict[str, str]:
    lang, body = blocks()["slurm.conf"]
    assert lang == "conf"
    return dict(line.split("=", 1) for line in body.splitlines() if line.strip())


def default_dir(script: Path) -> str:
    (found,) = re.findall(r"^dir=\$\{GPULSE_SLURM_JOB_DIR:-([^}]+)\}$", script.read_text(), re.M)
    return found


def test_every_block_of_the_readme_is_one_this_file_runs():
    assert {k: v[0] for k, v in blocks().items()} == {"install": "bash", "slurm.conf": "conf", "agent": "toml"}


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The root the README's install block ran against (its ``/etc/slurm`` is ``<root>/etc/slurm``)."""
    lang, body = blocks()["install"]
    assert lang == "bash" and "/etc/slurm" in body
    root = tmp_path / "root"
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", body.replace("/etc/slurm", f"{root}/etc/slurm")],
                       cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert (r.returncode, r.stderr) == (0, "")
    return root


def scripts(root: Path, key: str) -> list[str]:
    """What slurmd runs for ``key`` (``Prolog``/``Epilog``): every file the configured glob matches."""
    return sorted(glob.glob(str(root) + slurm_conf()[key]))


def test_the_installed_copies_are_the_scripts_and_slurmd_finds_them_through_slurm_conf(installed):
    (prolog,) = scripts(installed, "Prolog")
    (epilog,) = scripts(installed, "Epilog")
    assert Path(prolog).read_bytes() == slurm.PROLOG.read_bytes()
    assert Path(epilog).read_bytes() == slurm.EPILOG.read_bytes()
    assert all(Path(p).stat().st_mode & 0o777 == 0o755 for p in (prolog, epilog))


def test_the_installed_prolog_and_epilog_map_a_job_and_unmap_it(installed, tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    (prolog,) = scripts(installed, "Prolog")
    (epilog,) = scripts(installed, "Epilog")
    r = slurm.run(Path(prolog), slurm.environment(JOB, "prolog_slurmd", job_dir))
    assert (r.returncode, r.stderr) == (0, "")
    assert slurm.files(job_dir) == {
        "0": "21\n",
        "2": "21\n",
        "job_21": "SLURM_JOB_USER=erin\nSLURM_JOB_UID=1004\nSLURM_JOB_ACCOUNT=vision\nSLURM_JOB_PARTITION=gpu\n",
    }
    r = slurm.run(Path(epilog), slurm.environment(JOB, "epilog_slurmd", job_dir))
    assert (r.returncode, r.stderr) == (0, "") and slurm.files(job_dir) == {}


def test_the_prolog_runs_at_allocation():
    """So that a GPU allocated to a job with no step on it yet shows its job (the README's reason)."""
    assert "Alloc" in slurm_conf()["PrologFlags"].split(",")


def test_the_agent_reads_the_directory_both_scripts_write(tmp_path):
    lang, body = blocks()["agent"]
    assert lang == "toml"
    (tmp_path / "gpulse.toml").write_text(body)
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    cfg = load_config(parser.parse_args(["--config", str(tmp_path / "gpulse.toml"), "--record", "x.lp"]), env={})
    assert cfg.slurm_job_dir == default_dir(slurm.PROLOG) == default_dir(slurm.EPILOG) == "/run/gpulse/slurm-jobs"


def test_the_scripts_are_posix_sh():
    """They run under ``/bin/sh`` (dash on Debian); bash's own syntax would fail there."""
    if shutil.which("dash") is None:
        pytest.skip("dash is not installed (apt-get install dash)")
    for script in (slurm.PROLOG, slurm.EPILOG):
        assert script.read_text().startswith("#!/bin/sh\n")
        r = subprocess.run(["dash", "-n", str(script)], capture_output=True, text=True)
        assert (r.returncode, r.stderr) == (0, "")
