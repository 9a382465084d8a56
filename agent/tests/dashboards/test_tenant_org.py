"""A tenant's Grafana org: made through Grafana's HTTP API, re-runnably, with datasources holding only its read token.

Grafana cannot run here: ``support.fake_grafana`` stands in for its org, datasource and dashboard
endpoints (see its docstring for what it follows and where it may differ). The real ``gpulse setup
--tenant`` runs as a subprocess against it and the InfluxDB 2.9.1 stand-in.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.fake_grafana import FakeGrafana
from support.fake_influx_v2_admin import FakeInfluxV2Admin
from support.fixtures import gpulse_cmd

from gpulse.dashboards import dashboards
from gpulse.dashboards.builder import DATASOURCE_UIDS


@pytest.fixture
def servers(tmp_path):
    with FakeInfluxV2Admin(org="gpulse") as influx, FakeGrafana(admin_password="admin-pw") as grafana:
        for name, text in (("admin-token", influx.state.operator_token), ("grafana-admin", "admin:admin-pw")):
            (tmp_path / name).write_text(text + "\n")
            (tmp_path / name).chmod(0o600)
        yield influx, grafana


def setup_tenant(servers, tmp_path: Path, env, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    influx, grafana = servers
    cmd = gpulse_cmd(
        "setup", "--url", influx.url, "--org", "gpulse", "--token-file", str(tmp_path / "admin-token"),
        "--tenant", name, "--secrets-dir", str(tmp_path / "secrets"),
        "--grafana-url", grafana.url, "--grafana-admin-file", str(tmp_path / "grafana-admin"), *extra,
    )  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_each_tenant_gets_an_org_whose_datasources_hold_its_read_token_and_the_dashboards(servers, tmp_path, clean_env):
    _, grafana = servers
    for name in ("vision", "speech"):
        run = setup_tenant(servers, tmp_path, clean_env, name)
        assert run.returncode == 0, run.stderr
    for name in ("vision", "speech"):
        org = grafana.org(name)
        assert org is not None and org.members == {"admin": "Admin"}
        token = (tmp_path / "secrets" / "tenants" / name / "influx-read-token").read_text().strip()
        assert set(org.datasources) == set(DATASOURCE_UIDS.values())
        assert {ds["jsonData"]["dbName"] for ds in org.datasources.values()} == {f"gpulse-{name}"}
        assert {s["httpHeaderValue1"] for s in org.secrets.values()} == {f"Token {token}"}
        assert set(org.dashboards) == {d.uid for d in dashboards()}
    assert grafana.org("Main Org.").datasources == {}  # nothing landed in the default org
    tenant_orgs = {grafana.org("vision").id, grafana.org("speech").id}
    assert {org_id for _, path, org_id in grafana.writes() if path != "/api/orgs"} == tenant_orgs


def test_a_second_run_creates_and_changes_nothing_in_grafana(servers, tmp_path, clean_env):
    _, grafana = servers
    assert setup_tenant(servers, tmp_path, clean_env, "vision").returncode == 0
    writes = len(grafana.writes())
    again = setup_tenant(servers, tmp_path, clean_env, "vision")
    assert again.returncode == 0, again.stderr
    assert len(grafana.writes()) == writes
    assert "created" not in again.stdout and "updated" not in again.stdout, again.stdout
    assert [o.name for o in grafana.orgs.values()].count("vision") == 1


def test_rotated_tokens_reach_the_datasources_and_a_changed_dashboard_is_put_back(servers, tmp_path, clean_env):
    _, grafana = servers
    assert setup_tenant(servers, tmp_path, clean_env, "vision").returncode == 0
    org = grafana.org("vision")
    uid = dashboards()[0].uid
    org.dashboards[uid]["title"] = "edited by hand"
    rotated = setup_tenant(servers, tmp_path, clean_env, "vision", "--rotate-tenant-tokens")
    assert rotated.returncode == 0, rotated.stderr
    token = (tmp_path / "secrets" / "tenants" / "vision" / "influx-read-token").read_text().strip()
    assert {s["httpHeaderValue1"] for s in org.secrets.values()} == {f"Token {token}"}
    assert org.dashboards[uid]["title"] == dashboards()[0].title and org.dashboards[uid]["version"] == 2


def test_wrong_grafana_admin_credentials_say_what_the_file_must_hold(servers, tmp_path, clean_env):
    (tmp_path / "grafana-admin").write_text("admin:wrong\n")
    run = setup_tenant(servers, tmp_path, clean_env, "vision")
    assert run.returncode == 1
    assert "Grafana refused to look up org vision (HTTP 401 Invalid username or password)" in run.stderr
    assert "user:password of a Grafana server admin" in run.stderr


def test_on_influxdb_1_the_datasources_log_in_as_the_tenants_reader_user(tmp_path):
    from gpulse.dashboards.tenant_org import GrafanaAdmin, TenantGrafana, setup_grafana_tenant
    from gpulse.influx.setup.common import SetupReport

    tenant = TenantGrafana("vision", "http://influxdb:8086", "gpulse_vision", "gpulse_vision_reader:pw", api="v1")
    with FakeGrafana(admin_password="admin-pw") as grafana, GrafanaAdmin(grafana.url, "admin:admin-pw") as admin:
        setup_grafana_tenant(admin, tenant, SetupReport())
        org = grafana.org("vision")
    assert {(ds["user"], ds["jsonData"]["dbName"]) for ds in org.datasources.values()} == {
        ("gpulse_vision_reader", "gpulse_vision")
    }
    assert all("httpHeaderName1" not in ds["jsonData"] for ds in org.datasources.values())
    assert {s["password"] for s in org.secrets.values()} == {"pw"}


def test_an_org_someone_else_made_gets_the_admin_as_its_admin_before_anything_is_written_in_it(tmp_path):
    """Grafana looks a user up in the org ``X-Grafana-Org-Id`` names: a server admin who is not a member is refused."""
    import base64
    import json
    import urllib.error
    import urllib.request

    from gpulse.dashboards.tenant_org import GrafanaAdmin, TenantGrafana, setup_grafana_tenant
    from gpulse.influx.setup.common import SetupReport

    tenant = TenantGrafana("vision", "http://influxdb:8086", "gpulse_vision", "gpulse_vision_reader:pw", api="v1")
    with FakeGrafana(admin_password="admin-pw") as grafana, GrafanaAdmin(grafana.url, "admin:admin-pw") as admin:
        grafana.add_user("ops", "ops-pw", server_admin=True)
        theirs = grafana.add_org("vision", {"ops": "Admin"})
        grafana.add_org("speech", {"ops": "Admin", "admin": "Viewer"})
        req = urllib.request.Request(
            f"{grafana.url}/api/datasources/uid/x",
            headers={"Authorization": "Basic " + base64.b64encode(b"admin:admin-pw").decode(),
                     "X-Grafana-Org-Id": str(theirs.id)},
        )  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 403
        assert json.loads(refused.value.read())["message"].endswith("Permissions needed: datasources:read")

        setup_grafana_tenant(admin, tenant, SetupReport())
        speech = TenantGrafana("speech", tenant.influx_url, "gpulse_speech", "gpulse_speech_reader:pw", api="v1")
        setup_grafana_tenant(admin, speech, SetupReport())
    assert theirs.members == {"ops": "Admin", "admin": "Admin"}
    assert set(theirs.datasources) == set(DATASOURCE_UIDS.values())
    assert grafana.org("speech").members["admin"] == "Admin"  # a Viewer could write nothing there


def test_the_stand_in_refuses_to_demote_an_orgs_last_admin_as_grafana_does():
    """``updateOrgUserHelper``: 400 for the last Admin, the role kept; 500 for a non-member or an unknown org."""
    import base64
    import json
    import urllib.error
    import urllib.request

    def patch(url: str, role: str) -> tuple[int, dict]:
        req = urllib.request.Request(
            url, method="PATCH", data=json.dumps({"role": role}).encode(),
            headers={"Authorization": "Basic " + base64.b64encode(b"admin:admin-pw").decode(),
                     "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    with FakeGrafana(admin_password="admin-pw") as grafana:
        ops, dev = grafana.add_user("ops", "ops-pw"), grafana.add_user("dev", "dev-pw")
        org = grafana.add_org("vision", {"ops": "Admin", "dev": "Viewer"})
        users = f"{grafana.url}/api/orgs/{org.id}/users"
        assert patch(f"{users}/{ops.id}", "Editor") == (
            400, {"message": "Cannot change role so that there is no organization admin left"}
        )  # fmt: skip
        assert org.members["ops"] == "Admin"
        assert patch(f"{users}/1", "Viewer") == (500, {"message": "Failed update org user"})  # admin: no member
        assert patch(f"{grafana.url}/api/orgs/999/users/{ops.id}", "Viewer") == (
            500, {"message": "Failed update org user"}
        )  # fmt: skip
        assert patch(f"{users}/{dev.id}", "Admin")[0] == 200
        assert patch(f"{users}/{ops.id}", "Editor")[0] == 200  # dev is an Admin now
    assert org.members == {"ops": "Editor", "dev": "Admin"}
