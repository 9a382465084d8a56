"""`gpulse setup` on InfluxDB 2.x, against the InfluxDB 2.9.1 stand-in.

No InfluxDB 2 server can run here: ``support.fake_influx_v2_admin`` stands in for it, following the
v2.9.1 server's code endpoint by endpoint (see its docstring). The real ``gpulse setup`` command runs
as a subprocess.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from support.fake_influx_v2_admin import FakeInfluxV2Admin
from support.fixtures import gpulse_cmd

from gpulse.influx.connection import Connection
from gpulse.influx.downsample import TIERS, flux_query, flux_task
from gpulse.influx.setup.common import SetupError
from gpulse.influx.setup.v2 import GRAFANA_TOKEN_DESCRIPTION, downsample_now, setup_v2

DAY = 86400


@pytest.fixture
def fake():
    with FakeInfluxV2Admin(org="gpulse") as f:
        yield f


@pytest.fixture
def admin_token(fake, tmp_path) -> Path:
    p = tmp_path / "influxdb-admin-token"
    p.write_text(fake.state.operator_token + "\n")
    p.chmod(0o600)
    return p


def run_setup(fake, token_file: Path, env, *extra: str) -> subprocess.CompletedProcess[str]:
    args = (
        "setup",
        "--url",
        fake.url,
        "--org",
        "gpulse",
        "--bucket",
        "gpulse",
        "--token-file",
        str(token_file),
        *extra,
    )
    return subprocess.run(gpulse_cmd(*args), env=env, capture_output=True, text=True, timeout=60)


def conn_for(fake) -> Connection:
    return Connection(url=fake.url, org="gpulse", bucket="gpulse", token=fake.state.operator_token, token_source="test")


def test_setup_creates_buckets_mappings_tasks_and_grafana_token_once_then_nothing(
    fake, admin_token, tmp_path, clean_env
):
    grafana_token = tmp_path / "secrets" / "grafana-influx-token"
    first = run_setup(fake, admin_token, clean_env, "--grafana-token-file", str(grafana_token))
    assert first.returncode == 0, first.stderr
    assert sorted(fake.writes()) == sorted(
        [("POST", "/api/v2/buckets")] * 2 + [("POST", "/api/v2/dbrps")] * 3 + [("POST", "/api/v2/tasks")] * 2
        + [("POST", "/api/v2/authorizations")]
    )  # fmt: skip

    # buckets and retentions (the raw bucket came from onboarding with the same 30 d)
    retention = {n: fake.bucket(n)["retentionRules"][0]["everySeconds"] for n in ("gpulse", "gpulse_1m", "gpulse_1h")}
    assert retention == {"gpulse": 30 * DAY, "gpulse_1m": 400 * DAY, "gpulse_1h": 0}
    # InfluxQL: database gpulse with rps raw (default), 1m, 1h on the right buckets
    dbrps = {(d["database"], d["retention_policy"]): d for d in fake.dbrps()}
    assert {k: (fake.state.buckets[d["bucketID"]]["name"], d["default"]) for k, d in dbrps.items()} == {
        ("gpulse", "raw"): ("gpulse", True),
        ("gpulse", "1m"): ("gpulse_1m", False),
        ("gpulse", "1h"): ("gpulse_1h", False),
    }
    # the generated tasks, active, with the schedule the server parsed from their option
    for tier in TIERS:
        task = fake.task(f"gpulse_{tier.source}_to_{tier.name}")
        assert task["flux"] == flux_task(tier) and task["status"] == "active" and task["every"] == tier.every
    # Grafana's token: 0600, read-only on exactly the three buckets, and it works
    assert stat.S_IMODE(os.stat(grafana_token).st_mode) == 0o600
    token = grafana_token.read_text().strip()
    (auth,) = [a for a in fake.state.auths.values() if a["token"] == token]
    assert auth["description"] == GRAFANA_TOKEN_DESCRIPTION
    assert {(p["action"], fake.state.buckets[p["resource"]["id"]]["name"]) for p in auth["permissions"]} == {
        ("read", "gpulse"), ("read", "gpulse_1m"), ("read", "gpulse_1h"),
    }  # fmt: skip
    assert token not in first.stdout + first.stderr and fake.state.operator_token not in first.stdout + first.stderr

    n = len(fake.writes())
    second = run_setup(fake, admin_token, clean_env, "--grafana-token-file", str(grafana_token))
    assert second.returncode == 0, second.stderr
    assert fake.writes()[n:] == []
    assert grafana_token.read_text().strip() == token
    assert "9 unchanged" in second.stdout


def test_a_changed_task_definition_is_updated_in_place(fake):
    setup_v2(conn_for(fake))
    task = fake.task("gpulse_raw_to_1m")
    task_id, old = task["id"], task["flux"]
    task["flux"] = old.replace("every: 10m", "every: 30m")  # as an older gpulse version would have left it
    n = len(fake.writes())
    report = setup_v2(conn_for(fake))
    assert report.changed() == ["updated task gpulse_raw_to_1m"]
    assert fake.writes()[n:] == [("PATCH", f"/api/v2/tasks/{task_id}")]
    assert fake.task("gpulse_raw_to_1m")["flux"] == old and fake.task("gpulse_raw_to_1m")["every"] == "10m"
    assert len(fake.state.tasks) == 2


def test_an_inactive_task_is_activated(fake):
    setup_v2(conn_for(fake))
    fake.task("gpulse_1m_to_1h")["status"] = "inactive"
    assert setup_v2(conn_for(fake)).changed() == ["updated task gpulse_1m_to_1h"]
    assert fake.task("gpulse_1m_to_1h")["status"] == "active"


def test_a_changed_retention_updates_the_bucket(fake):
    setup_v2(conn_for(fake))
    raw_id = fake.bucket("gpulse")["id"]
    n = len(fake.writes())
    report = setup_v2(conn_for(fake), raw_retention="7d", minute_retention="90d")
    assert sorted(report.changed()) == [
        "updated bucket gpulse (retention 7d)",
        "updated bucket gpulse_1m (retention 90d)",
    ]
    assert sorted(fake.writes()[n:]) == sorted(
        [("PATCH", f"/api/v2/buckets/{raw_id}"), ("PATCH", f"/api/v2/buckets/{fake.bucket('gpulse_1m')['id']}")]
    )
    assert fake.bucket("gpulse")["retentionRules"][0]["everySeconds"] == 7 * DAY


def test_a_retention_shortened_below_the_shard_group_duration_is_sent_with_a_new_one(fake):
    """2.9 refuses (422) 30 d -> 12 h on a bucket with 1 d shard groups unless the new duration comes along."""
    setup_v2(conn_for(fake))
    report = setup_v2(conn_for(fake), raw_retention="12h", minute_retention="3d")
    assert sorted(report.changed()) == [
        "updated bucket gpulse (retention 12h)",
        "updated bucket gpulse_1m (retention 3d)",
    ]
    rules = {n: fake.bucket(n)["retentionRules"][0] for n in ("gpulse", "gpulse_1m", "gpulse_1h")}
    assert rules["gpulse"] == {"type": "expire", "everySeconds": 12 * 3600, "shardGroupDurationSeconds": 3600}
    assert rules["gpulse_1m"] == {"type": "expire", "everySeconds": 3 * DAY, "shardGroupDurationSeconds": DAY}
    assert rules["gpulse_1h"]["everySeconds"] == 0 and rules["gpulse_1h"]["shardGroupDurationSeconds"] == 7 * DAY
    patches = [c for c in fake.requests if c.method == "PATCH" and c.path.startswith("/api/v2/buckets/")]
    assert [c.status for c in patches] == [200, 200]
    assert setup_v2(conn_for(fake), raw_retention="12h", minute_retention="3d").changed() == []


def test_the_grafana_token_is_kept_in_an_org_with_hundreds_of_buckets(fake, tmp_path):
    """2.9 pages a bucket list (100 at most) before filtering it by permission: a listed page of an org
    whose buckets sort before ``gpulse`` holds none the Grafana token reads; setup looks each one up."""
    for i in range(150):
        fake.add_bucket(f"a-team-{i:03}", 7 * DAY)
    path = tmp_path / "grafana-influx-token"
    setup_v2(conn_for(fake), grafana_token_file=str(path))
    token = path.read_text().strip()
    n = len(fake.writes())
    report = setup_v2(conn_for(fake), grafana_token_file=str(path))
    assert fake.writes()[n:] == [] and path.read_text().strip() == token
    assert ("unchanged", f"Grafana read-only token in {path}") in report.actions


def test_a_mapping_on_the_wrong_bucket_is_replaced_and_a_lost_default_restored(fake):
    setup_v2(conn_for(fake))
    other = fake.add_bucket("elsewhere")
    by_rp = {d["retention_policy"]: d for d in fake.dbrps()}
    fake.state.dbrps[by_rp["1m"]["id"]]["bucketID"] = other["id"]
    fake.state.dbrp_defaults[(fake.org_id, "gpulse")] = by_rp["1h"][
        "id"
    ]  # as `influx v1 dbrp update --default` leaves it
    report = setup_v2(conn_for(fake))
    assert sorted(report.changed()) == [
        "created DBRP gpulse/1m -> gpulse_1m",
        "deleted DBRP gpulse/1m (pointed at another bucket)",
        "updated DBRP gpulse/raw -> gpulse (default)",
    ]
    by_rp = {d["retention_policy"]: d for d in fake.dbrps()}
    assert by_rp["1m"]["bucketID"] == fake.bucket("gpulse_1m")["id"] and by_rp["raw"]["default"] is True
    assert by_rp["1h"]["default"] is False


def test_an_invalid_grafana_token_file_is_replaced_and_the_old_token_revoked(fake, tmp_path):
    path = tmp_path / "grafana-influx-token"
    setup_v2(conn_for(fake), grafana_token_file=str(path))
    first = path.read_text().strip()
    path.write_text("a-token-influxdb-does-not-know\n")
    report = setup_v2(conn_for(fake), grafana_token_file=str(path))
    second = path.read_text().strip()
    assert second not in (first, "a-token-influxdb-does-not-know")
    assert [a for a, _ in report.actions if a != "unchanged"] == ["created", "deleted"]
    managed = [a for a in fake.state.auths.values() if a["description"] == GRAFANA_TOKEN_DESCRIPTION]
    assert [a["token"] for a in managed] == [second]


def test_an_empty_grafana_token_file_made_by_make_up_is_filled_in_place(fake, tmp_path):
    path = tmp_path / "grafana-influx-token"
    path.touch(mode=0o600)
    inode = path.stat().st_ino
    setup_v2(conn_for(fake), grafana_token_file=str(path))
    assert path.read_text().strip() and path.stat().st_ino == inode  # a bind mount of the file sees it


def test_a_wrong_token_is_a_clear_error_and_changes_nothing(fake, tmp_path, clean_env):
    bad = tmp_path / "token"
    bad.write_text("not-the-token\n")
    bad.chmod(0o600)
    r = run_setup(fake, bad, clean_env)
    assert r.returncode == 1
    assert "refused the credentials (token) from file" in r.stderr and "401 unauthorized access" in r.stderr
    assert "not-the-token" not in r.stderr
    assert fake.writes() == []


def test_a_read_only_token_is_told_it_lacks_permissions(fake, tmp_path):
    path = tmp_path / "grafana-influx-token"
    setup_v2(conn_for(fake), grafana_token_file=str(path))
    ro = Connection(url=fake.url, org="gpulse", bucket="gpulse", token=path.read_text().strip(), token_source="file x")
    fake.bucket("gpulse_1m")["retentionRules"][0]["everySeconds"] = DAY  # something to fix
    with pytest.raises(SetupError, match=r"token from file x sees no org .* lacks read permission on orgs"):
        setup_v2(ro)  # 2.9 leaves out the orgs a token may not read


def test_a_missing_org_is_a_clear_error_listing_the_orgs_there_are(fake, admin_token, clean_env):
    r = subprocess.run(
        gpulse_cmd("setup", "--url", fake.url, "--org", "nope", "--token-file", str(admin_token)),
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "org 'nope' does not exist" in r.stderr and "orgs this token sees: gpulse" in r.stderr
    assert fake.writes() == []


def test_a_server_that_was_never_onboarded_is_a_clear_error(tmp_path, clean_env):
    with FakeInfluxV2Admin(onboarded=False) as fresh:
        token = tmp_path / "t"
        token.write_text("anything\n")
        token.chmod(0o600)
        r = run_setup(fresh, token, clean_env)
    assert r.returncode == 1 and "has not been set up yet" in r.stderr


def test_no_token_at_all_is_a_clear_error(fake, clean_env):
    r = subprocess.run(
        gpulse_cmd("setup", "--url", fake.url), env=clean_env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "needs an API token" in r.stderr


def test_downsample_now_runs_the_task_pipelines_over_the_range_minute_tier_first(fake):
    start, end = 1_699_999_200 * 10**9, 1_700_006_400 * 10**9  # whole hours: kept as they are
    fake.add_bucket("gpulse_1m")  # a Flux from() of a missing bucket is 404, as on the server
    ran = downsample_now(conn_for(fake), start, end)
    assert (
        fake.state.queries
        == ran
        == [flux_query(TIERS[0], "gpulse", start, end), flux_query(TIERS[1], "gpulse", start, end)]
    )
    assert 'to(bucket: "gpulse_1m")' in ran[0] and 'from(bucket: "gpulse_1m")' in ran[1]
    assert f"start = time(v: {start})" in ran[0] and f"stop = time(v: {end})" in ran[0]
