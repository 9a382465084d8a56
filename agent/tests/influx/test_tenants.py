"""`gpulse setup --tenant NAME`: each team's bucket or database, and credentials the server bounds to it.

The isolation is proved where the server enforces it: the InfluxDB 2.9.1 stand-in's authorizer
(``support.fake_influx_v2_admin``, with a real influxd 1.6.7 behind it for InfluxQL) and a real
influxd 1.6.7 with authentication on, per-database users and grants.
"""

from __future__ import annotations

import base64
import json
import stat
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support.fake_influx_v2_admin import FakeInfluxV2Admin
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1

from gpulse.influx.setup.tenant import READ_FILE, WRITE_FILE

pytestmark = pytest.mark.influxdb
#: a minute ago, within the raw retention (30 d)
T0 = (time.time_ns() // 10**9 - 60) * 10**9


def http(url: str, *, auth: str, data: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, method="POST", headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def secret(path: Path) -> str:
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path.read_text().strip()


# -- InfluxDB 2.x: the 2.9.1 stand-in's authorizer --------------------------------------------------
@pytest.fixture
def v2(tmp_path):
    backend = InfluxDB1(tmp_path / "influxd").start()
    try:
        with FakeInfluxV2Admin(org="gpulse", backend=backend) as fake:
            (tmp_path / "admin-token").write_text(fake.state.operator_token + "\n")
            (tmp_path / "admin-token").chmod(0o600)
            yield fake
    finally:
        backend.stop()


def setup_v2_tenant(fake, tmp_path: Path, env, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ("setup", "--url", fake.url, "--org", "gpulse", "--token-file", str(tmp_path / "admin-token"))
    cmd = gpulse_cmd(*args, "--tenant", name, "--secrets-dir", str(tmp_path / "secrets"), *extra)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def v2_write(fake, token: str, bucket: str) -> tuple[int, str]:
    q = urllib.parse.urlencode({"org": "gpulse", "bucket": bucket, "precision": "ns"})
    return http(f"{fake.url}/api/v2/write?{q}", auth=f"Token {token}", data=f"gpu,gpu=0 util=50 {T0}".encode())


def flux(fake, token: str, bucket: str) -> tuple[int, str]:
    body = json.dumps({"query": f'from(bucket: "{bucket}") |> range(start: -1h)', "type": "flux"}).encode()
    return http(f"{fake.url}/api/v2/query?org=gpulse", auth=f"Token {token}", data=body)


def influxql(url: str, auth: str, db: str) -> dict:
    q = urllib.parse.urlencode({"q": 'SELECT * FROM "gpu"', "db": db, "epoch": "ns"})
    status, text = http(f"{url}/query?{q}", auth=auth)
    return {"status": status, **json.loads(text or "{}")}


def test_a_v2_tenant_gets_its_bucket_tiers_tasks_and_two_tokens_bounded_to_them(v2, tmp_path, clean_env):
    run = setup_v2_tenant(v2, tmp_path, clean_env, "vision")
    assert run.returncode == 0, run.stderr
    assert {"gpulse-vision", "gpulse-vision_1m", "gpulse-vision_1h"} <= {b["name"] for b in v2.state.buckets.values()}
    assert v2.task("gpulse_vision_raw_to_1m") is not None and v2.task("gpulse_vision_1m_to_1h") is not None
    folder = tmp_path / "secrets" / "tenants" / "vision"
    write_token, read_token = secret(folder / WRITE_FILE), secret(folder / READ_FILE)
    assert write_token not in run.stdout + run.stderr and read_token not in run.stdout + run.stderr
    perms = {
        a["description"]: sorted((p["action"], v2.state.buckets[p["resource"]["id"]]["name"]) for p in a["permissions"])
        for a in v2.state.auths.values()
        if "tenant vision" in a["description"]
    }
    assert sorted(perms.values()) == [
        [("read", "gpulse-vision"), ("read", "gpulse-vision_1h"), ("read", "gpulse-vision_1m")],
        [("write", "gpulse-vision")],
    ]


def test_a_second_v2_run_changes_nothing_and_keeps_the_tokens(v2, tmp_path, clean_env):
    assert setup_v2_tenant(v2, tmp_path, clean_env, "vision").returncode == 0
    folder = tmp_path / "secrets" / "tenants" / "vision"
    before, writes = (secret(folder / WRITE_FILE), secret(folder / READ_FILE)), len(v2.writes())
    again = setup_v2_tenant(v2, tmp_path, clean_env, "vision")
    assert again.returncode == 0, again.stderr
    assert len(v2.writes()) == writes and "created" not in again.stdout
    assert (secret(folder / WRITE_FILE), secret(folder / READ_FILE)) == before


def test_v2_tenants_can_neither_write_nor_read_each_others_buckets(v2, tmp_path, clean_env):
    for name in ("vision", "speech"):
        assert setup_v2_tenant(v2, tmp_path, clean_env, name).returncode == 0
    tokens = {
        (name, kind): secret(tmp_path / "secrets" / "tenants" / name / kind)
        for name in ("vision", "speech")
        for kind in (WRITE_FILE, READ_FILE)
    }
    a_write, a_read = tokens["vision", WRITE_FILE], tokens["vision", READ_FILE]

    assert v2_write(v2, a_write, "gpulse-vision") == (204, "")
    assert v2_write(v2, a_write, "gpulse-speech") == (403, v2_write(v2, a_read, "gpulse-vision")[1])
    assert json.loads(v2_write(v2, a_write, "gpulse-speech")[1])["message"] == "insufficient permissions for write"
    assert v2_write(v2, tokens["speech", WRITE_FILE], "gpulse")[0] == 403  # nor the fleet's bucket

    assert flux(v2, a_read, "gpulse-vision")[0] == 200
    status, text = flux(v2, a_read, "gpulse-speech_1m")
    assert (status, json.loads(text)["message"]) == (
        404,
        'failed to initialize execute state: could not find bucket "gpulse-speech_1m"',
    )
    assert flux(v2, a_write, "gpulse-vision")[0] == 404  # the write token reads nothing

    own = influxql(v2.url, f"Token {a_read}", "gpulse-vision")
    assert own["results"][0]["series"][0]["values"][0][0] == T0
    other = influxql(v2.url, f"Token {a_read}", "gpulse-speech")
    assert other["results"][0]["error"] == "database not found: gpulse-speech"


def test_a_lost_v2_token_file_stops_setup_with_the_rotate_command_which_works(v2, tmp_path, clean_env):
    assert setup_v2_tenant(v2, tmp_path, clean_env, "vision").returncode == 0
    folder = tmp_path / "secrets" / "tenants" / "vision"
    old = secret(folder / WRITE_FILE)
    (folder / WRITE_FILE).unlink()
    lost = setup_v2_tenant(v2, tmp_path, clean_env, "vision")
    assert lost.returncode == 1
    assert "gpulse setup --tenant vision --rotate-tenant-tokens" in lost.stderr, lost.stderr
    rotated = setup_v2_tenant(v2, tmp_path, clean_env, "vision", "--rotate-tenant-tokens")
    assert rotated.returncode == 0, rotated.stderr
    assert v2_write(v2, secret(folder / WRITE_FILE), "gpulse-vision")[0] == 204
    assert v2_write(v2, old, "gpulse-vision")[0] == 401  # the old token was deleted


def test_a_tenant_name_that_cannot_be_a_bucket_user_and_org_name_is_refused(v2, tmp_path, clean_env):
    run = setup_v2_tenant(v2, tmp_path, clean_env, "Vision Team")
    assert run.returncode == 1 and "tenant name 'Vision Team' is not allowed" in run.stderr
    assert v2.writes() == []


# -- InfluxDB 1.x: a real influxd 1.6.7 with authentication ----------------------------------------
def setup_v1_tenant(s: InfluxDB1, tmp_path: Path, env, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ("setup", "--api", "v1", "--url", s.url, "--token-file", str(tmp_path / "admin-token"))
    cmd = gpulse_cmd(*args, "--tenant", name, "--secrets-dir", str(tmp_path / "secrets"), *extra)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def v1_write(s: InfluxDB1, credentials: str, db: str) -> tuple[int, str]:
    return http(f"{s.url}/write?db={db}&precision=n", auth=basic(credentials), data=f"gpu,gpu=0 util=1 {T0}".encode())


def test_v1_tenants_get_a_database_and_users_that_reach_only_it(influxdb_auth, tmp_path, clean_env):
    v1 = influxdb_auth
    for name in ("vision", "speech"):
        run = setup_v1_tenant(v1, tmp_path, clean_env, name)
        assert run.returncode == 0, run.stderr
    creds = {
        (name, kind): secret(tmp_path / "secrets" / "tenants" / name / kind)
        for name in ("vision", "speech")
        for kind in (WRITE_FILE, READ_FILE)
    }
    assert creds["vision", WRITE_FILE].startswith("gpulse_vision_writer:")
    assert creds["vision", READ_FILE].startswith("gpulse_vision_reader:")
    admin = ("admin", "admin-pw")
    rps = {r["name"] for r in v1.rows('SHOW RETENTION POLICIES ON "gpulse_vision"', db="", user=admin)}
    assert {"raw", "1m", "1h"} <= rps

    assert v1_write(v1, creds["vision", WRITE_FILE], "gpulse_vision")[0] == 204
    refused = v1_write(v1, creds["vision", WRITE_FILE], "gpulse_speech")
    assert refused == (
        403,
        '{"error":"\\"gpulse_vision_writer\\" user is not authorized to write to database \\"gpulse_speech\\""}\n',
    )
    assert v1_write(v1, creds["vision", READ_FILE], "gpulse_vision")[0] == 403

    own = influxql(v1.url, basic(creds["vision", READ_FILE]), "gpulse_vision")
    assert own["results"][0]["series"][0]["values"][0][0] == T0
    other = influxql(v1.url, basic(creds["vision", READ_FILE]), "gpulse_speech")
    assert (other["status"], other["error"]) == (
        403,
        "error authorizing query: gpulse_vision_reader not authorized to execute statement 'SELECT * FROM gpu', "
        "requires READ on gpulse_speech",
    )
    writer_reads = influxql(v1.url, basic(creds["vision", WRITE_FILE]), "gpulse_vision")
    assert writer_reads["status"] == 403 and writer_reads["error"].endswith("requires READ on gpulse_vision")


def test_a_second_v1_run_keeps_the_passwords_and_a_lost_file_needs_the_rotate_command(
    influxdb_auth, tmp_path, clean_env
):
    v1 = influxdb_auth
    assert setup_v1_tenant(v1, tmp_path, clean_env, "vision").returncode == 0
    folder = tmp_path / "secrets" / "tenants" / "vision"
    before = secret(folder / WRITE_FILE)
    again = setup_v1_tenant(v1, tmp_path, clean_env, "vision")
    assert again.returncode == 0 and "created" not in again.stdout and "updated" not in again.stdout, again.stdout
    assert secret(folder / WRITE_FILE) == before
    (folder / WRITE_FILE).unlink()
    lost = setup_v1_tenant(v1, tmp_path, clean_env, "vision")
    assert lost.returncode == 1 and "gpulse setup --tenant vision --rotate-tenant-tokens" in lost.stderr
    assert setup_v1_tenant(v1, tmp_path, clean_env, "vision", "--rotate-tenant-tokens").returncode == 0
    assert v1_write(v1, secret(folder / WRITE_FILE), "gpulse_vision")[0] == 204
    assert v1_write(v1, before, "gpulse_vision")[0] == 401  # the old password no longer works


def test_run_downsampling_with_a_tenant_fills_the_tenants_tiers_not_the_fleets(influxdb_auth, tmp_path, clean_env):
    v1 = influxdb_auth
    assert setup_v1_tenant(v1, tmp_path, clean_env, "vision").returncode == 0
    writer = secret(tmp_path / "secrets" / "tenants" / "vision" / WRITE_FILE)
    minute = T0 // (60 * 10**9) * 60 * 10**9 - 120 * 10**9  # a whole minute, two minutes ago
    line = f"train_step,host=n1,run=r1,rank=0 step=1i,step_time_s=0.5 {minute}"
    assert http(f"{v1.url}/write?db=gpulse_vision&precision=n", auth=basic(writer), data=line.encode())[0] == 204
    run = setup_v1_tenant(v1, tmp_path, clean_env, "vision", "--run-downsampling", "1h")
    assert run.returncode == 0, run.stderr
    admin = ("admin", "admin-pw")
    assert v1.rows('SELECT * FROM "1m"."train_step"', db="gpulse_vision", user=admin)
    assert "gpulse" not in {r["name"] for r in v1.rows("SHOW DATABASES", db="", user=admin)}


def test_v3_says_what_core_cannot_do_for_a_tenant(tmp_path, clean_env):
    (tmp_path / "t").write_text("apiv3_x\n")
    (tmp_path / "t").chmod(0o600)
    cmd = gpulse_cmd("setup", "--api", "v3", "--url", "http://127.0.0.1:9", "--token-file", str(tmp_path / "t"))
    run = subprocess.run([*cmd, "--tenant", "vision"], env=clean_env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "Core has only admin tokens" in run.stderr and "Enterprise has resource tokens" in run.stderr
