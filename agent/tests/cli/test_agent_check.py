"""``gpulse agent --check``: one verdict per item against real InfluxDB 1.x servers, exit 0 only if all pass."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fake_influx_v2_admin import FakeInfluxV2Admin
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1, free_port

from gpulse.agent.config import AgentConfig
from gpulse.cli.agent_check import run as run_checks
from gpulse.influx.connection import Connection
from gpulse.influx.query import InfluxQL

pytestmark = pytest.mark.influxdb

ADMIN = ("admin", "adm1n-pw")


@pytest.fixture(scope="module")
def auth_influxdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB1]:
    """A real influxd with auth enabled: an admin, and a user who may only write to ``gpulse``."""
    server = InfluxDB1(tmp_path_factory.mktemp("influxd-auth"), auth=True).start()
    try:
        server.query(
            f"CREATE USER {ADMIN[0]} WITH PASSWORD '{ADMIN[1]}' WITH ALL PRIVILEGES"
        )  # the first user needs no auth
        admin = InfluxQL(Connection(url=server.url, api="v1", bucket="gpulse", token=":".join(ADMIN)))
        for statement in (
            'CREATE DATABASE "gpulse"',
            "CREATE USER writer WITH PASSWORD 'wr1ter-pw'",
            'GRANT WRITE ON "gpulse" TO writer',
        ):
            admin.raw(statement, db="")
        yield server
    finally:
        server.stop()


def check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = gpulse_cmd("agent", "--check", "--simulate", "2", "--no-socket", *args)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def verdicts(out: str) -> dict[str, str]:
    """item -> 'ok' | 'FAIL' | 'SKIP' from the check's output."""
    result = {}
    for line in out.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0] in ("ok", "FAIL", "SKIP"):
            result[parts[1].rstrip(":")] = parts[0]
    return result


def test_a_reachable_database_that_exists_passes_every_check(
    influxdb_module: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    r = check(clean_env, "--api", "v1", "--url", influxdb_module.url, "--spool-dir", str(tmp_path / "spool"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert verdicts(r.stdout) == dict.fromkeys(
        ("config", "agent", "gpus", "spool", "database", "token", "bucket"), "ok"
    )
    assert "InfluxDB 1.6" in r.stdout and "all 7 checks passed" in r.stdout


def test_a_missing_database_fails_and_says_how_to_create_it(
    influxdb_module: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    r = check(clean_env, "--api", "v1", "--url", influxdb_module.url, "--bucket", "nope", "--spool-dir", str(tmp_path))
    assert r.returncode == 1
    assert verdicts(r.stdout)["bucket"] == "FAIL"
    assert "database 'nope' does not exist" in r.stdout and "gpulse setup" in r.stdout


def test_a_wrong_url_fails_the_database_check_and_skips_the_credentials_without_counting_them_as_failed(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """Before: "gpulse agent --check: 2 of 5 checks failed" with one FAIL and one SKIP."""
    url = f"http://127.0.0.1:{free_port()}"
    r = check(clean_env, "--api", "v1", "--url", url, "--spool-dir", str(tmp_path / "spool"))
    assert r.returncode == 1
    v = verdicts(r.stdout)
    assert v["database"] == "FAIL" and v["token"] == v["bucket"] == "SKIP" and v["gpus"] == "ok"
    assert f"cannot reach {url}" in r.stdout and "Connection refused" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1] == "gpulse agent --check: 1 of 5 checks failed, 2 skipped"


def test_v1_wrong_credentials_fail_and_the_right_ones_pass(
    auth_influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("writer:not-the-password\n")
    token_file.chmod(0o600)
    base = ("--api", "v1", "--url", auth_influxdb.url, "--token-file", str(token_file), "--spool-dir", str(tmp_path))
    bad = check(clean_env, *base)
    assert bad.returncode == 1
    assert verdicts(bad.stdout)["token"] == "FAIL"
    assert f"refused the credentials (user:password) from file {token_file}" in bad.stdout
    assert "not-the-password" not in bad.stdout + bad.stderr

    good = check({**clean_env, "GPULSE_TOKEN": "writer:wr1ter-pw"}, *base[:4], "--spool-dir", str(tmp_path))
    assert good.returncode == 0, good.stdout
    assert "credentials accepted as 'writer'" in good.stdout
    assert "wr1ter-pw" not in good.stdout + good.stderr


def test_an_invalid_config_is_a_failed_check_not_a_traceback(clean_env: dict[str, str], tmp_path: Path) -> None:
    r = check(clean_env, "--interval", "0.01")
    assert r.returncode == 1
    assert verdicts(r.stdout) == {"config": "FAIL"} and "below the minimum" in r.stdout and "Traceback" not in r.stderr
    assert r.stdout.rstrip().splitlines()[-1] == "gpulse agent --check: 1 of 1 checks failed"


def test_no_driver_fails_the_gpu_check(clean_env: dict[str, str], tmp_path: Path) -> None:
    """Without --simulate the real pynvml runs; this machine has no NVIDIA driver."""
    cmd = gpulse_cmd(
        "agent", "--check", "--no-socket", "--record", str(tmp_path / "r.lp"), "--spool-dir", str(tmp_path)
    )
    r = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    v = verdicts(r.stdout)
    assert v["gpus"] == "FAIL" and v["record"] == "ok" and v["database"] == "SKIP"
    assert "`gpulse agent --simulate 8`" in r.stdout and "no database configured (recording only)" in r.stdout


@pytest.fixture(scope="module")
def fake_v2() -> Iterator[FakeInfluxV2Admin]:
    """Stands in for an InfluxDB 2.x server (none runs in CI): /ping and the buckets API, as documented."""
    with FakeInfluxV2Admin(org="gpulse") as fake:
        yield fake


def v2_config(url: str, token: str, bucket: str, tmp_path: Path) -> AgentConfig:
    """An agent of 1 simulated GPU writing to ``url`` (a FakeInfluxV2Admin) with ``token`` from a file "t"."""
    conn = Connection(url=url, api="v2", org="gpulse", bucket=bucket, token=token, token_source="file t")
    return AgentConfig(connection=conn, simulate=1, spool_dir=str(tmp_path / "spool"), host="h")


def test_v2_the_token_and_bucket_are_proven_through_the_buckets_api(fake_v2: FakeInfluxV2Admin, tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_checks(v2_config(fake_v2.url, fake_v2.state.operator_token, "gpulse", tmp_path), out) == 0
    assert "ok   token: token from file t accepted" in out.getvalue()
    assert "ok   bucket: bucket 'gpulse' exists in org 'gpulse'" in out.getvalue()
    assert "(InfluxDB v2.9.1)" in out.getvalue()


def test_v2_a_wrong_token_or_a_missing_bucket_fails_with_the_fix(fake_v2: FakeInfluxV2Admin, tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_checks(v2_config(fake_v2.url, "not-a-token", "gpulse", tmp_path), out) == 1
    assert (
        "FAIL token: InfluxDB at " in out.getvalue() and "refused the credentials (token) from file t" in out.getvalue()
    )
    assert "not-a-token" not in out.getvalue()
    out = io.StringIO()
    assert run_checks(v2_config(fake_v2.url, fake_v2.state.operator_token, "nope", tmp_path), out) == 1
    assert "FAIL bucket: bucket 'nope' does not exist in org 'gpulse'" in out.getvalue()
    assert "gpulse setup" in out.getvalue()
    assert "1 of 7 checks failed" in out.getvalue()
