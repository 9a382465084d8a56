"""A training environment installs only what the training library uses: ``pip install gpulse`` (the
README's ``pip install ./agent``) brings nothing but gpulse; the agent's dependencies are the
``agent`` extra, and the commands that need them say so when they are missing.

The package is built from this checkout as pip builds it (a wheel, the same metadata), installed with
``pip install --no-index`` (which could fetch nothing, so a dependency would fail the install) into a
folder, and run by an interpreter without site-packages (``python -S``): the standard library and
that folder, as in a training environment that has nothing else.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from gpulse.cli.main import AGENT_EXTRA_MODULES

AGENT = Path(__file__).resolve().parents[2]
README = AGENT.parent / "README.md"
#: What the agent needs and a training process must not be made to install.
AGENT_ONLY = ("pynvml", "tenacity", "docker", "psutil", "requests", "urllib3")

TRAINING_LOOP = """
import os, sys, tempfile
from gpulse.training import Run
with tempfile.TemporaryDirectory() as tmp:
    run = Run(name="bare", output_dir=tmp, socket_path=os.path.join(tmp, "none", "a.sock"))
    for batch in run.wrap_loader(range(3)):
        with run.step(samples=1):
            with run.phase("forward"):
                pass
        run.log(loss=0.5)
    run.finish()
    print(run.stats()["steps_sent"], sorted(os.listdir(tmp)))
print(sorted(m for m in {agent_only!r} if m in sys.modules))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into), built from a copy of ``agent/`` (no build
    files left in the checkout)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "agent"
    shutil.copytree(AGENT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(AGENT / name, src / name)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp / "whl"), str(src)],
                           env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp / "whl").glob("gpulse-*.whl")
    site = tmp / "site"
    done = subprocess.run([*pip, "install", "--no-index", "--target", str(site), str(wheel)],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]  # nothing else to fetch
    return wheel, site


def bare_python(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -S`` (no site-packages) that sees only the standard library and ``site``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULSE_", "PYTHON"))}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-S", *args], env=env, capture_output=True, text=True, timeout=120)


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as whl:
        (name,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        meta = HeaderParser().parsestr(whl.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def test_the_package_requires_nothing_and_its_agent_extra_carries_the_agent_s_dependencies(
    installed: tuple[Path, Path],
) -> None:
    wheel, _site = installed
    reqs = requirements(wheel)
    assert [r for r in reqs if "extra ==" not in r] == []  # what `pip install gpulse` brings: nothing
    agent = {re.split(r"[<>=;\s\[]", r, maxsplit=1)[0] for r in reqs if re.search(r"extra\s*==\s*['\"]agent['\"]", r)}
    assert agent == {"nvidia-ml-py", "tenacity", "docker", "psutil", "tomli"}
    assert set(AGENT_EXTRA_MODULES) == {"pynvml", "tenacity", "docker", "psutil"}  # the CLI's check names the same
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith((".so", ".c", ".h", ".pyd"))]  # pure Python


def test_a_training_environment_without_the_agent_s_dependencies_runs_a_training_loop(
    installed: tuple[Path, Path],
) -> None:
    _wheel, site = installed
    ran = bare_python(site, "-c", TRAINING_LOOP.format(agent_only=AGENT_ONLY))
    assert ran.returncode == 0, ran.stderr[-3000:]
    sent, loaded = ran.stdout.strip().splitlines()
    steps, files = sent.split(" ", 1)
    assert steps == "3" and "gpulse-records.rec" in files and "metrics_report.json" in files
    assert loaded == "[]"
    assert bare_python(site, "-c", "import pynvml").returncode != 0  # the agent's dependencies are not there


def test_the_agent_s_commands_without_its_dependencies_fail_at_once_naming_the_install(
    installed: tuple[Path, Path],
) -> None:
    _wheel, site = installed
    for command in ("agent", "setup", "doctor", "upload"):
        ran = bare_python(site, "-m", "gpulse", command, "--help")
        assert ran.returncode == 2, (command, ran.stdout, ran.stderr)
        assert "pip install 'gpulse[agent]'" in ran.stderr and "pynvml" in ran.stderr, ran.stderr
    schema = bare_python(site, "-m", "gpulse", "schema")  # the data model needs nothing more
    assert schema.returncode == 0 and "train_step" in schema.stdout, schema.stderr[-2000:]


def test_the_readme_s_training_install_is_the_package_without_extras() -> None:
    """The command the README shows for a training environment is the install tested above."""
    text = README.read_text(encoding="utf-8")
    assert "`pip install ./agent`" in text and "`pip install './agent[agent]'`" in text
