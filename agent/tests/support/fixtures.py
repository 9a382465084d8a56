"""pytest fixtures shared by agent/tests and tests/ (registered by the root conftest.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .influxd import InfluxDB1

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture
def influxdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB1]:
    """A fresh real InfluxDB 1.x server with database ``gpulse``; stopped after the test."""
    server = InfluxDB1(tmp_path_factory.mktemp("influxd")).start()
    server.create_database("gpulse")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def influxdb_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB1]:
    """One real InfluxDB 1.x server shared by the tests of a module."""
    server = InfluxDB1(tmp_path_factory.mktemp("influxd")).start()
    server.create_database("gpulse")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def influxdb_auth(tmp_path: Path) -> Iterator[InfluxDB1]:
    """A fresh real InfluxDB 1.x with authentication on and one admin user, whose ``user:password`` is in
    ``tmp_path / "admin-token"`` (0600), as ``--token-file`` reads it for ``--api v1``."""
    server = InfluxDB1(tmp_path / "influxd", auth=True).start()
    try:
        server.query("CREATE USER admin WITH PASSWORD 'admin-pw' WITH ALL PRIVILEGES")  # the first user needs no auth
        (tmp_path / "admin-token").write_text("admin:admin-pw\n")
        (tmp_path / "admin-token").chmod(0o600)
        yield server
    finally:
        server.stop()


def gpulse_cmd(*args: str) -> list[str]:
    """The command line that runs the installed ``gpulse`` CLI with this interpreter."""
    return [sys.executable, "-m", "gpulse", *args]


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """An environment for subprocesses with no GPULSE_* settings leaking in from the host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")
    (tmp_path / "run").mkdir(mode=0o700, exist_ok=True)
    return env


@pytest.fixture
def foreign_dir(tmp_path: Path) -> Path:
    """A directory of another user (uid 12345, mode 0755). Needs root to chown (CI runs as root)."""
    if os.getuid() != 0:
        pytest.skip("needs root to chown")
    d = tmp_path / "theirs"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    os.chown(d, 12345, 12345)
    return d
