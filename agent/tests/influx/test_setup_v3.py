"""`gpulse setup --api v3` on InfluxDB 3 Core and Enterprise, against the stand-in (``support.fake_influx_v3``).

Setup makes one database per tier with its retention, uploads the downsampling plugin, creates its
triggers and writes the token file Grafana reads; a second run reads and changes nothing. The real
``gpulse setup`` command runs as a subprocess.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
from support.fake_influx_v2_admin import FakeInfluxV2Admin
from support.fake_influx_v3 import running
from support.fixtures import gpulse_cmd

from gpulse.influx.connection import Connection
from gpulse.influx.engine_plugin import Edition, plugin_text, triggers
from gpulse.influx.setup.common import SetupError
from gpulse.influx.setup.v3 import PLUGIN_FILE, setup_v3

TOKEN = "apiv3_admin-token"
DAY = 86400
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


def token_file(tmp_path: Path, token: str = TOKEN) -> Path:
    p = tmp_path / "influxdb3-admin-token"
    p.write_text(token + "\n")
    p.chmod(0o600)
    return p


def run_setup(url: str, tokens: Path, env, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ("setup", "--api", "v3", "--url", url, "--token-file", str(tokens), *extra)
    return subprocess.run(gpulse_cmd(*args), env=env, capture_output=True, text=True, timeout=120)


def mutations(fake) -> list[tuple[str, str]]:
    return [r for r in fake.requests if r[0] in MUTATING]


def conn_for(fake, **kw) -> Connection:
    return Connection(url=fake.url, api="v3", token=TOKEN, token_source="test", **kw)


def test_setup_makes_databases_plugin_triggers_and_the_grafana_token_once_then_changes_nothing(tmp_path, clean_env):
    grafana = tmp_path / "secrets" / "grafana-influx-token"
    with running(token=TOKEN) as fake:
        first = run_setup(fake.url, token_file(tmp_path), clean_env, "--grafana-token-file", str(grafana))
        assert first.returncode == 0, first.stderr
        assert sorted(mutations(fake)) == sorted(
            [("POST", "/api/v3/configure/database")] * 3 + [("POST", "/api/v3/plugins/files")]
            + [("POST", "/api/v3/configure/processing_engine_trigger")] * 3
        )  # fmt: skip
        retention = {n: d.retention_period_s for n, d in fake.databases.items()}
        assert retention == {"gpulse": 30 * DAY, "gpulse/1m": 400 * DAY, "gpulse/1h": None}
        assert (fake.plugin_dir / PLUGIN_FILE).read_text() == plugin_text()
        want = {t.name: (t.specification, t.arguments) for t in triggers(Edition.CORE, "gpulse")}
        assert {n: (t.specification, t.arguments) for n, t in fake.triggers.items()} == want
        assert all(t.db == "gpulse" and not t.disabled for t in fake.triggers.values())
        assert grafana.read_text().strip() == TOKEN and stat.S_IMODE(grafana.stat().st_mode) == 0o600
        assert "Core has only admin tokens" in first.stdout

        fake.requests.clear()
        second = run_setup(fake.url, token_file(tmp_path), clean_env, "--grafana-token-file", str(grafana))
        assert second.returncode == 0, second.stderr
        assert mutations(fake) == [] and fake.requests  # it read, and changed nothing
        assert second.stdout.splitlines()[-1].endswith(": 8 unchanged")


def test_a_changed_retention_trigger_or_plugin_is_brought_back_and_nothing_else(tmp_path):
    with running(token=TOKEN) as fake:
        conn = conn_for(fake)
        setup_v3(conn)
        fake.databases["gpulse/1m"].retention_period_s = 7 * DAY
        fake.triggers["gpulse_1h"].specification = "every:1h"
        (fake.plugin_dir / PLUGIN_FILE).write_text("# an older plugin\n")
        fake.requests.clear()
        report = setup_v3(conn, raw_retention="14d")
        assert sorted(report.changed()) == [
            "updated database gpulse (retention 14d)",
            "updated database gpulse/1m (retention 400d)",
            f"updated plugin file {PLUGIN_FILE}",
            "updated trigger gpulse_1h (cron:0 5 * * * *) on gpulse",
        ]
        assert {n: d.retention_period_s for n, d in fake.databases.items()}["gpulse/1m"] == 400 * DAY
        assert fake.triggers["gpulse_1h"].specification == "cron:0 5 * * * *"
        assert (fake.plugin_dir / PLUGIN_FILE).read_text() == plugin_text()
        assert ("DELETE", "/api/v3/configure/processing_engine_trigger") in fake.requests


def test_enterprise_gets_its_look_back_and_is_told_which_tokens_to_make(tmp_path):
    with running(token=TOKEN, edition="enterprise") as fake:
        report = setup_v3(conn_for(fake), grafana_token_file=str(tmp_path / "grafana"))
        assert {n: t.arguments["edition"] for n, t in fake.triggers.items()} == dict.fromkeys(
            fake.triggers, "enterprise"
        )
    manual = [w for a, w in report.actions if a == "manual"]
    assert len(manual) == 1 and "reads gpulse, gpulse/1m, gpulse/1h for Grafana" in manual[0]
    assert not (tmp_path / "grafana").exists()  # the admin token is not handed to Grafana on Enterprise


def test_without_the_admin_token_or_on_another_server_setup_says_what_to_do(tmp_path):
    with running(token=TOKEN) as fake:
        with pytest.raises(SetupError) as none:
            setup_v3(Connection(url=fake.url, api="v3"))
        assert "asks for credentials on /ping" in str(none.value) and "--token-file" in str(none.value)
        fake.resource_tokens["apiv3_reader"] = {}  # a token the server knows that is not an admin's
        with pytest.raises(SetupError) as reader:
            setup_v3(Connection(url=fake.url, api="v3", token="apiv3_reader", token_source="file r"))
        assert "HTTP 403" in str(reader.value) and "setup needs an admin token" in str(reader.value)
    with FakeInfluxV2Admin(org="gpulse") as v2:
        with pytest.raises(SetupError) as other:
            setup_v3(Connection(url=v2.url, api="v3", token=v2.state.operator_token))
    assert str(other.value).startswith(f"{v2.url} is InfluxDB") and "use --api v2" in str(other.value)


@pytest.mark.parametrize("api", ["v2", "v1"])
def test_setup_for_another_generation_on_a_3x_server_says_use_api_v3(api, tmp_path, clean_env):
    """The probe carries the token, so a 3.x server that asks for it on /ping is recognised, not refused."""
    with running(token=TOKEN) as fake:
        tokens = token_file(tmp_path, TOKEN if api == "v2" else f"admin:{TOKEN}")
        args = ("setup", "--api", api, "--url", fake.url, "--token-file", str(tokens))
        r = subprocess.run(gpulse_cmd(*args), env=clean_env, capture_output=True, text=True, timeout=60)
        assert mutations(fake) == []
    assert r.returncode == 1
    assert f"{fake.url} is InfluxDB 3 Core 3.10.0-nightly: use --api v3" in r.stderr
