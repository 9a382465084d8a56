"""A newcomer's first minutes: clone the repository and run the test command the README gives.

The clone is of the committed HEAD (what a newcomer gets), in a temp dir. The full suite is not run
again from inside the suite; instead the README's test command is dry-run (``make -n``) in the clone,
and one real test file runs from the clone with the clone's own package on the path.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FIRST_SCREEN_LINES = 40


@pytest.fixture(scope="module")
def clone(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("clone") / "gpulse"
    subprocess.run(
        ["git", "-c", "safe.directory=*", "clone", "--quiet", str(repo_root), str(dest)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return dest


def first_screen_commands(readme: str) -> list[str]:
    """Shell commands in fenced blocks within the README's first screen."""
    head = "\n".join(readme.splitlines()[:FIRST_SCREEN_LINES])
    commands = []
    for body in re.findall(r"```(?:bash|sh|console)[^\n]*\n(.*?)```", head, flags=re.S):
        for line in body.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                commands.append(line)
    return commands


def test_the_readme_first_screen_gives_make_up_and_make_test(clone: Path) -> None:
    commands = first_screen_commands((clone / "README.md").read_text(encoding="utf-8"))
    assert commands[:2] == ["make up", "make test"], commands


def test_the_readme_test_command_resolves_in_a_fresh_clone(clone: Path) -> None:
    """``make -n test`` plans the lint and the whole pytest run without executing anything."""
    venv = Path(sys.executable).parent.parent
    out = subprocess.run(
        ["make", "-n", "test", f"VENV={venv}"], cwd=clone, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "ruff check" in out.stdout
    assert re.search(r"-m pytest\b", out.stdout), out.stdout


def test_a_test_file_passes_from_the_clone_with_the_clone_s_own_code(clone: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULSE_", "PYTEST_"))}
    env["PYTHONPATH"] = str(clone / "agent" / "src")
    where = subprocess.run(
        [sys.executable, "-c", "import gpulse; print(gpulse.__file__)"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).resolve().is_relative_to(clone.resolve())
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "agent/tests/test_schema.py"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout), run.stdout[-2000:]
