"""A newcomer's first minutes: clone the repository and run the test command the README gives.

The clone is of the committed HEAD (what a newcomer gets), in a temp dir. The full suite is not run
again from inside the suite; instead the README's test command is dry-run (``make -n``) in the clone,
and one real test file runs from the clone with the clone's own package on the path.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.influxd import free_port

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


def test_the_readme_s_recording_example_leaves_no_untracked_file_in_the_clone(clone: Path) -> None:
    """Issue 14 item 8: `gpulse agent --record node.lp` in the repository root left an untracked file.
    The README's example records into out/ (git-ignored); run as written in the clone's root."""
    from test_readme import BLOCKS

    (record,) = [b for b in BLOCKS if b.id == "record"]
    agent_line = next(line for line in record.body.splitlines() if line.startswith("gpulse agent"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULSE_", "PYTEST_"))}
    env.update(GPULSE_SIMULATE="2", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    run = subprocess.run(["bash", "-c", agent_line], cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert any(p.stat().st_size for p in (clone / "out").glob("*.lp"))
    status = subprocess.run(
        ["git", "-c", "safe.directory=*", "status", "--porcelain"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout == "", status.stdout


STUB_PYTHON = """#!/usr/bin/env bash
# Stands in for the virtualenv's python: pip installs are logged, not run; other calls go to the real one.
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> "$PIP_LOG"; exit 0; fi
for a in "$@"; do case "$a" in *"import torch"*) echo "torch 2.13.0 (stub)"; exit 0;; esac; done
exec {python} "$@"
"""


def _venv_sh(clone: Path, tmp_path: Path, index: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    base = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter without this venv's packages (no torch)
    (venv / "bin" / "python").write_text(STUB_PYTHON.format(python=base))
    (venv / "bin" / "python").chmod(0o755)
    log = tmp_path / "pip.log"
    env = dict(os.environ, VENV=str(venv), GPULSE_TORCH_INDEX=index, PIP_LOG=str(log))
    out = subprocess.run(
        ["bash", str(clone / "scripts" / "venv.sh")], cwd=clone, env=env, capture_output=True, text=True, timeout=120
    )
    return out, log.read_text().splitlines() if log.exists() else []


def test_make_venv_takes_torch_s_cpu_build_where_its_index_answers(clone: Path, tmp_path: Path) -> None:
    """Issue 14 item 6: `pip install torch==2.13.0` pulls the CUDA build (2.9 GB of wheels) from PyPI on an
    ordinary Linux machine. A local HTTP server stands in for the CPU index (only its /torch/ page is asked)."""
    import http.server
    import threading

    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu</a>")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "index"), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}"
        out, pips = _venv_sh(clone, tmp_path, index)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stdout + out.stderr
    assert pips[0] == f"-m pip install --progress-bar on --index-url {index} torch==2.13.0"
    assert pips[1] == "-m pip install --progress-bar on -e agent[agent,kubernetes,test,train]"
    assert f"== make venv: PyTorch 2.13.0, CPU build, from {index}" in out.stdout


def test_make_venv_falls_back_to_the_configured_index_and_says_what_that_means(clone: Path, tmp_path: Path) -> None:
    """Where only the configured index is reachable (this machine reaches only its own PyPI mirror)."""
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out, pips = _venv_sh(clone, tmp_path, closed)
    assert out.returncode == 0, out.stdout + out.stderr
    assert pips[0] == "-m pip install --progress-bar on torch==2.13.0"
    assert f"{closed} cannot be reached" in out.stdout
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        assert "2.9 GB" in out.stdout
