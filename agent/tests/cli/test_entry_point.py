"""The ``gpulse`` entry point: what every command shares (flags, a closed pipe, exit statuses)."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd

from gpulse.cli import configdoc, exit_codes
from gpulse.cli import main as cli


def test_a_reader_that_goes_away_ends_the_command_quietly(clean_env: dict[str, str]) -> None:
    """``gpulse schema | head -2``: the reader closes the pipe before the command writes."""
    p = subprocess.Popen(gpulse_cmd("schema"), env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # before the interpreter has even started: every write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == exit_codes.PIPE_CLOSED
    assert err == "", err  # no BrokenPipeError traceback, no "Exception ignored"


def test_status_piped_into_head_shows_its_first_lines_and_no_traceback(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    r = subprocess.run(
        f"{' '.join(gpulse_cmd('status', '--json', '--socket', str(tmp_path / 'none.sock')))} | head -1",
        shell=True,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout == "{\n" and "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_works_before_and_after_the_command(clean_env: dict[str, str], tmp_path: Path, where: str) -> None:
    args = ["status", "--socket", str(tmp_path / "none.sock")]
    argv = ["-v", *args] if where == "before" else [*args, "-v"]
    r = subprocess.run(gpulse_cmd(*argv), env=clean_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "unrecognized arguments" not in r.stderr
    assert "no agent socket" in r.stderr


def test_doctor_takes_v_after_its_name_as_before_it(clean_env: dict[str, str], tmp_path: Path) -> None:
    env = {**clean_env, "GPULSE_URL": "http://127.0.0.1:9", "XDG_STATE_HOME": str(tmp_path / "state")}
    args = ["--simulate", "1", "--socket", str(tmp_path / "s.sock"), "--skip", "containers"]
    after, before = (
        subprocess.run(gpulse_cmd(*argv), env=env, capture_output=True, text=True, timeout=120)
        for argv in (["doctor", "-v", *args], ["-v", "doctor", *args])
    )
    assert "unrecognized arguments" not in after.stderr
    assert after.returncode == before.returncode == 1  # nothing listens on port 9
    assert after.stdout == before.stdout and "✘ database" in after.stdout


def _returned_codes(func: Callable[..., object]) -> set[int]:
    """The integer literals ``func`` returns (``EXIT_*`` constants of its module resolved)."""
    module = inspect.getmodule(func)
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    codes: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        for sub in ast.walk(node.value):
            if isinstance(sub, ast.Constant) and type(sub.value) is int:
                codes.add(sub.value)
            elif isinstance(sub, ast.Name) and sub.id.startswith("EXIT_"):
                codes.add(getattr(module, sub.id))
    return codes


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_exit_status_of_every_command_is_in_its_help_and_in_the_configuration_reference(name: str) -> None:
    module = cli.command_module(name)
    listed = {c.code for c in module.EXIT_CODES}
    assert 0 in listed
    assert _returned_codes(module.run) <= listed, f"gpulse {name} returns a status its EXIT_CODES do not list"
    helptext = cli.command_parser(name).format_help()
    doc = configdoc.render().split(f"### `gpulse {name}`", 1)[1].split("### ", 1)[0]
    for c in exit_codes.all_codes(module.EXIT_CODES):
        assert f"{c.code:>3}  {c.meaning}" in helptext
        assert f"| {c.code} | {c.meaning} |" in doc


def test_the_agent_and_its_check_return_only_listed_statuses() -> None:
    from gpulse.agent import loop
    from gpulse.cli import agent_check

    listed = {c.code for c in cli.command_module("agent").EXIT_CODES}
    returned = set().union(
        *map(_returned_codes, (loop.Agent.run, loop.Agent._run_alone, agent_check.run, agent_check.invalid_config))
    )
    assert returned <= listed and {0, 1, 3, 4} <= returned


def test_status_json_without_an_agent_prints_json(clean_env: dict[str, str], tmp_path: Path) -> None:
    sock = tmp_path / "none.sock"
    t0 = time.monotonic()
    r = subprocess.run(
        gpulse_cmd("status", "--json", "--socket", str(sock)), env=clean_env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and time.monotonic() - t0 < 60
    got = json.loads(r.stdout)
    assert got["socket"] == str(sock) and "no agent socket" in got["error"]
