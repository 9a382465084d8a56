"""Grafana's provisioning files: the InfluxQL datasource, the read-only dashboard provider, the alert rules.

There is no Grafana server here; these tests check the files against what Grafana's file
provisioning reads (apiVersion 1, datasource and provider keys) and against the paths the compose
file mounts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulse.dashboards import ALERTS_PATH, DASHBOARDS_DIR, datasources
from gpulse.dashboards.builder import DATASOURCE_UID, DATASOURCE_UIDS
from gpulse.influx import engine_plugin

PROVISIONING = "grafana/provisioning"
DASHBOARDS_MOUNT = "/var/lib/grafana/dashboards"
TOKEN_SECRET = "/run/secrets/grafana-influx-token"


def _load(repo_root: Path, rel: str) -> dict[str, Any]:
    return yaml.safe_load((repo_root / PROVISIONING / rel).read_text())


@pytest.mark.parametrize("backend", datasources.BACKENDS, ids=lambda b: b.key)
def test_a_datasource_per_tier_is_influxql_on_the_buckets_database_with_a_token_header_read_from_a_secret(
    repo_root: Path, backend: datasources.Backend
) -> None:
    doc = yaml.safe_load((repo_root / backend.path).read_text())
    assert doc["apiVersion"] == 1
    by_uid = {ds["uid"]: ds for ds in doc["datasources"]}
    assert set(by_uid) == set(DATASOURCE_UIDS.values())
    assert [ds["uid"] for ds in doc["datasources"] if ds["isDefault"]] == [DATASOURCE_UID]
    for tier, uid in DATASOURCE_UIDS.items():
        ds = by_uid[uid]
        assert ds["type"] == "influxdb" and ds["access"] == "proxy" and ds["editable"] is False
        assert ds["url"] == {"v2": "http://influxdb:8086", "v3": "http://influxdb3:8181"}[backend.key]
        j = ds["jsonData"]
        assert j["version"] == "InfluxQL" and j["httpMode"] == "POST"
        # 2.x: the bucket's DBRP database, the query's retention policy picks the tier; 3: the database
        # the downsampling plugin writes the tier to
        expected = "${GPULSE_BUCKET}" if backend.key == "v2" else engine_plugin.database_name("${GPULSE_BUCKET}", tier)
        assert j["dbName"] == expected
        assert j["httpHeaderName1"] == "Authorization" and j["timeInterval"] == "1s"
        assert ds["secureJsonData"]["httpHeaderValue1"] == f"Token $__file{{{TOKEN_SECRET}}}"
        assert "database" not in ds and "password" not in ds and "token" not in str(ds.get("jsonData"))


def test_the_dashboard_provider_is_read_only_with_folders_from_the_mounted_directory(repo_root: Path) -> None:
    doc = _load(repo_root, "dashboards/gpulse.yaml")
    assert doc["apiVersion"] == 1
    (p,) = doc["providers"]
    assert p["type"] == "file" and p["disableDeletion"] is True and p["allowUiUpdates"] is False
    assert p["options"] == {"path": DASHBOARDS_MOUNT, "foldersFromFilesStructure": True}
    assert "folder" not in p and "folderUid" not in p  # must be empty with foldersFromFilesStructure


def test_dashboards_sit_one_folder_deep_as_folders_from_files_structure_expects(repo_root: Path) -> None:
    files = sorted((repo_root / DASHBOARDS_DIR).rglob("*.json"))
    assert files
    for f in files:
        assert len(f.relative_to(repo_root / DASHBOARDS_DIR).parts) == 2, f


def test_the_compose_file_mounts_provisioning_dashboards_and_the_token_secret_where_these_files_expect(
    repo_root: Path,
) -> None:
    compose_path = next(
        (repo_root / n for n in ("docker-compose.yml", "compose.yaml") if (repo_root / n).exists()), None
    )
    if compose_path is None:  # the compose engineer's file; checked once it exists
        return
    grafana = yaml.safe_load(compose_path.read_text())["services"]["grafana"]
    volumes = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in grafana.get("volumes", [])]
    assert any(v.startswith("./grafana/provisioning:/etc/grafana/provisioning") for v in volumes), volumes
    assert any(v.startswith(f"./grafana/dashboards:{DASHBOARDS_MOUNT}") for v in volumes), volumes
    secrets = [s if isinstance(s, str) else s.get("target") or s["source"] for s in grafana.get("secrets", [])]
    assert "grafana-influx-token" in secrets
    env = grafana.get("environment", {})
    env = dict(e.split("=", 1) for e in env) if isinstance(env, list) else env
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH", "")
    assert home.startswith(DASHBOARDS_MOUNT + "/")
    assert (repo_root / DASHBOARDS_DIR / home.removeprefix(DASHBOARDS_MOUNT + "/")).exists()


def test_setup_the_datasource_and_the_agent_agree_on_the_database_name(repo_root: Path) -> None:
    """One rule: the InfluxQL database is the raw bucket's name. `gpulse setup` maps DBRP database
    <bucket> (influx/setup/v2.py ensure_dbrps uses conn.bucket; v1 creates that database), Grafana
    gets the same GPULSE_BUCKET with the same default, and dashboards never name the database."""
    import re

    compose = yaml.safe_load((repo_root / "docker-compose.yml").read_text())
    services = compose["services"]
    buckets = {
        name: next(a.split("=", 1)[1] for a in services[name]["command"] if a.startswith("--bucket="))
        for name in ("setup", "agent")
    }
    assert set(buckets.values()) == {"${GPULSE_BUCKET:-gpulse}"}, buckets
    assert services["grafana"]["environment"]["GPULSE_BUCKET"] == "${GPULSE_BUCKET:-gpulse}"
    assert re.search(r"^GPULSE_BUCKET=\w+$", (repo_root / ".env.example").read_text(), re.M)
    for path in (repo_root / DASHBOARDS_DIR).rglob("*.json"):
        assert not re.search(r'FROM\s+\\"[^"\\]+\\"\.\\"[^"\\]+\\"\.\\"', path.read_text()), path


def test_the_alert_rules_file_is_in_the_alerting_provisioning_directory(repo_root: Path) -> None:
    assert ALERTS_PATH.startswith(f"{PROVISIONING}/alerting/") and (repo_root / ALERTS_PATH).exists()
