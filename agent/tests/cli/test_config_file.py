"""The config file works for every command that talks to a database (``--config`` or ``GPULSE_CONFIG``),
with one precedence rule, flags > environment > config file > defaults, and advice that names the file again.

Before: ``gpulse setup --config f.toml`` failed with "unrecognized arguments", ``GPULSE_CONFIG=f.toml
gpulse setup`` silently went to 127.0.0.1:8086, and ``gpulse report`` advised "run `gpulse setup --api v1`
with the same connection flags", which with the settings in a file cannot work.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd
from support.influxd import free_port

pytestmark = pytest.mark.influxdb


def config_file(tmp_path: Path, url: str, *, bucket: str = "gpulse", api: str = "v1") -> Path:
    path = tmp_path / "gpulse.toml"
    path.write_text(f'[connection]\nurl = "{url}"\napi = "{api}"\nbucket = "{bucket}"\n')
    return path


def run(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpulse_cmd(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def databases(server) -> set[str]:
    return {r["name"] for r in server.rows("SHOW DATABASES", db="")}


def test_setup_takes_the_connection_from_config(tmp_path: Path, influxdb_module, clean_env):
    cfg = config_file(tmp_path, influxdb_module.url, bucket="from_flag_file")
    r = run(clean_env, "setup", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert f"gpulse setup: {influxdb_module.url} api=v1" in r.stdout
    assert "from_flag_file" in databases(influxdb_module)


def test_setup_takes_the_connection_from_gpulse_config(tmp_path: Path, influxdb_module, clean_env):
    cfg = config_file(tmp_path, influxdb_module.url, bucket="from_env_file")
    r = run(clean_env | {"GPULSE_CONFIG": str(cfg)}, "setup")
    assert r.returncode == 0, r.stderr
    assert "from_env_file" in databases(influxdb_module)


COMMANDS = [
    ["agent", "--check", "--simulate", "1"],
    ["setup"],
    ["doctor", "--simulate", "1", "--skip", "containers"],
    ["report", "--run", "r1"],
    ["demo", "--hours", "0.1"],
    ["upload", "FILE"],
    ["recompute", "--start", "1h"],
]


@pytest.mark.parametrize("source", ["--config", "GPULSE_CONFIG"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_database_command_goes_where_the_config_file_says(command, source, tmp_path: Path, clean_env):
    """Nothing listens at the file's URL: each command names that URL, never the default."""
    url = f"http://127.0.0.1:{free_port()}"
    cfg = config_file(tmp_path, url)
    recording = tmp_path / "r.lp"
    recording.write_text("gpu,host=h,gpu=0,uuid=GPU-0,model=H100 util_gpu_pct=1 1700000000000000000\n")
    args = [str(recording) if a == "FILE" else a for a in command]
    env = clean_env | {"XDG_STATE_HOME": str(tmp_path / "state")}
    if source == "--config":
        r = run(env, *args, "--config", str(cfg), cwd=tmp_path)
    else:
        r = run(env | {"GPULSE_CONFIG": str(cfg)}, *args, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert "unrecognized arguments" not in out
    assert r.returncode != 0 and url in out, out
    assert "127.0.0.1:8086" not in out


def test_report_advises_setup_with_the_config_file_and_the_advice_works(tmp_path: Path, influxdb_module, clean_env):
    cfg = config_file(tmp_path, influxdb_module.url, bucket="advised")
    r = run(clean_env, "report", "--run", "r1", "--config", str(cfg))
    assert r.returncode == 1
    assert "database 'advised' does not exist" in r.stderr
    (advice,) = re.findall(r"run `(gpulse setup [^`]*)`", r.stderr)
    assert shlex.split(advice)[:4] == ["gpulse", "setup", "--config", str(cfg)]
    followed = run(clean_env, *shlex.split(advice)[1:])
    assert followed.returncode == 0, followed.stderr
    assert "advised" in databases(influxdb_module)
    again = run(clean_env, "report", "--run", "r1", "--config", str(cfg))
    assert "does not exist" not in again.stderr and "no points for run 'r1'" in again.stderr
