"""The connection settings every command shares: no credentials in URLs, private token files."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd

from gpulse.agent.connection_config import read_token_file, resolve_connection
from gpulse.influx.connection import ConfigError

SECRET_URL = "http://admin:S3cret-pw@127.0.0.1:8086"


@pytest.mark.parametrize(
    "command",
    [["agent", "--simulate", "1"], ["setup"], ["upload", "FILE"], ["report", "--run", "r"], ["demo"], ["doctor"]],
)
def test_every_command_refuses_credentials_in_the_url_and_points_to_the_token_file(command, tmp_path, clean_env):
    """Before: accepted, never sent, and the password echoed in logs, `status`, `doctor`, `--check` and `ps`."""
    f = tmp_path / "r.lp"
    f.write_text("")
    args = [str(f) if a == "FILE" else a for a in command]
    r = subprocess.run(
        gpulse_cmd(*args, "--url", SECRET_URL), env=clean_env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr
    assert "credentials in the URL are refused" in r.stderr and "--token-file" in r.stderr
    assert "S3cret-pw" not in r.stdout + r.stderr


def test_the_url_from_the_environment_or_a_config_file_is_refused_alike():
    with pytest.raises(ConfigError, match="credentials in the URL are refused") as e:
        resolve_connection(None, {"GPULSE_URL": SECRET_URL})
    assert "S3cret" not in str(e.value)
    with pytest.raises(ConfigError, match="credentials in the URL are refused"):
        resolve_connection(None, {}, {"url": "https://token@influx.example.com"})
    with pytest.raises(ConfigError) as e:
        resolve_connection(None, {"GPULSE_URL": "ftp://admin:S3cret@host"})
    assert "S3cret" not in str(e.value)
    assert resolve_connection(None, {"GPULSE_URL": "https://influx.example.com:8086/"}).url == (
        "https://influx.example.com:8086"
    )


@pytest.mark.parametrize(
    ("mode", "warning"),
    [(0o600, None), (0o400, None), (0o640, "readable by its group (mode 0640)"), (0o644, "readable by other users")],
)
def test_a_token_file_readable_by_anyone_but_its_owner_is_warned_about(tmp_path: Path, caplog, mode, warning):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(mode)
    caplog.set_level(logging.WARNING, logger="gpulse")
    assert read_token_file(token) == "s3cret"
    logged = [r.getMessage() for r in caplog.records]
    if warning is None:
        assert logged == []
    else:
        assert len(logged) == 1 and warning in logged[0] and "chmod 600" in logged[0] and "s3cret" not in logged[0]


def test_every_setting_follows_one_rule_flags_then_environment_then_config_file_then_defaults(tmp_path: Path):
    import argparse

    from gpulse.agent.config import load_connection
    from gpulse.agent.connection_config import add_connection_flags

    cfg = tmp_path / "gpulse.toml"
    cfg.write_text('[connection]\nurl = "http://file:8086"\norg = "file-org"\nbucket = "file-bucket"\n')
    parser = argparse.ArgumentParser()
    add_connection_flags(parser)
    env = {"GPULSE_CONFIG": str(cfg), "GPULSE_ORG": "env-org", "GPULSE_BUCKET": "env-bucket"}
    conn = load_connection(parser.parse_args(["--bucket", "flag-bucket"]), env)
    assert (conn.url, conn.org, conn.bucket, conn.api) == ("http://file:8086", "env-org", "flag-bucket", "v2")
    assert conn.config_path == str(cfg)
    other = tmp_path / "other.toml"
    other.write_text('[connection]\nurl = "http://other:8086"\n')
    assert load_connection(parser.parse_args(["--config", str(other)]), env).url == "http://other:8086"
    assert load_connection(parser.parse_args([]), {}).url == "http://127.0.0.1:8086"
