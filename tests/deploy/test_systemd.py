"""The systemd unit the README promises: ``gpulse agent`` with no flags, no secret, restarted when that helps.

``systemd-analyze verify`` (systemd's own parser, run on a copy whose ``ExecStart`` points at this
checkout's ``gpulse``) must accept the unit without one warning; the properties the agent relies
on are read from the unit file itself.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import REPO

from gpulse.agent.loop import EXIT_FAILURE, EXIT_NO_DRIVER

UNIT = REPO / "deploy" / "systemd" / "gpulse-agent.service"


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign] # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_systemd_accepts_the_unit_without_a_warning(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    gpulse = Path(sys.executable).parent / "gpulse"
    text = UNIT.read_text().replace("ExecStart=/usr/local/bin/gpulse ", f"ExecStart={gpulse} ")
    assert text != UNIT.read_text()
    (tmp_path / UNIT.name).write_text(text)
    r = subprocess.run([analyze, "verify", str(tmp_path / UNIT.name)], capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, "")


def test_a_misspelt_key_is_what_verify_warns_about(tmp_path: Path):
    """The check above can fail: an unknown key makes verify speak."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    text = UNIT.read_text().replace("ExecStart=/usr/local/bin/gpulse ", "ExecStart=/bin/true ")
    (tmp_path / UNIT.name).write_text(text.replace("RestartSec=", "RestartSecs="))
    r = subprocess.run([analyze, "verify", str(tmp_path / UNIT.name)], capture_output=True, text=True)
    assert "Unknown key 'RestartSecs'" in r.stderr


def test_the_service_runs_gpulse_agent_without_flags_from_the_configuration_file():
    s = service()
    assert s["ExecStart"].split()[1:] == ["agent"]
    assert s["ExecStart"].split()[0].endswith("/gpulse")
    assert s["Environment"] == "GPULSE_CONFIG=/etc/gpulse/gpulse.toml"
    assert s["EnvironmentFile"].startswith("-")  # optional site overrides


def test_no_secret_is_in_the_unit():
    text = UNIT.read_text().lower()
    assert "gpulse_token=" not in text and "--token" not in text and "password" not in text


def test_a_driver_upgrade_restarts_the_agent_and_a_machine_without_a_driver_does_not():
    s = service()
    assert s["Restart"] == "on-failure" and EXIT_FAILURE != 0  # exit 1 after a driver upgrade: restarted
    assert s["RestartPreventExitStatus"] == str(EXIT_NO_DRIVER)


def test_the_readme_configuration_is_what_the_unit_reads():
    """The README's TOML example (``runnable id=toml``) names the token file the unit relies on."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("```toml runnable id=toml", 1)[1].split("```", 1)[0]
    assert 'token_file = "/etc/gpulse/token"' in block
    assert "/etc/gpulse/token" in UNIT.read_text() and "gpulse.toml" in service()["Environment"]
