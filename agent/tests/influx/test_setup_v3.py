"""`gpulse setup --api v3` on InfluxDB 3 Core and Enterprise, against the stand-in (``support.fake_influx_v3``).

Setup makes one database per tier with its retention, uploads the downsampling plugin, creates its
triggers and writes the token files: on Enterprise a token that only writes the raw database for the
nodes and one that only reads the tiers for Grafana (the stand-in enforces them as
``influxdb3_authz`` does: ``support.authz_v3``), on Core the admin token. A second run reads and
changes nothing. The real ``gpulse setup`` command runs as a subprocess.
"""

from __future__ import annotations

import json
import re
import shlex
import stat
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support.fake_influx_v2_admin import FakeInfluxV2Admin
from support.fake_influx_v3 import running
from support.fixtures import REPO, gpulse_cmd

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


def token_files(tmp_path: Path) -> tuple[Path, Path, tuple[str, ...]]:
    """Where the nodes' and Grafana's tokens go, and the flags that say so."""
    nodes, grafana = tmp_path / "secrets" / "influxdb3-node-token", tmp_path / "secrets" / "grafana-influx-token"
    return nodes, grafana, ("--node-token-file", str(nodes), "--grafana-token-file", str(grafana))


def http(fake, method: str, path: str, token: str, params: dict[str, str], data: bytes | None = None) -> int:
    """The status a request with ``token`` gets, as any client (Grafana, an agent) would send it."""
    url = f"{fake.url}{path}?{urllib.parse.urlencode(params)}"
    headers = {"Authorization": f"Token {token}"} | (
        {"Content-Type": "application/json"} if path.endswith("database") else {}
    )
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, method=method, headers=headers), timeout=30
        ) as r:
            body = r.read()
            assert b'"error"' not in body, body  # InfluxQL errors come back in-band with 200
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_setup_makes_databases_plugin_triggers_and_the_token_files_once_then_changes_nothing(tmp_path, clean_env):
    nodes, grafana, flags = token_files(tmp_path)
    with running(token=TOKEN) as fake:
        first = run_setup(fake.url, token_file(tmp_path), clean_env, *flags)
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
        for path in (nodes, grafana):  # Core has only admin tokens
            assert path.read_text().strip() == TOKEN and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert "Core has only admin tokens" in first.stdout
        assert "/api/v3/enterprise/configure/token" not in {p for _, p in fake.requests}

        fake.requests.clear()
        second = run_setup(fake.url, token_file(tmp_path), clean_env, *flags)
        assert second.returncode == 0, second.stderr
        assert mutations(fake) == [] and fake.requests  # it read, and changed nothing
        assert second.stdout.splitlines()[-1].endswith(": 9 unchanged")


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


def test_enterprise_gets_its_look_back_and_no_token_without_a_file_to_keep_it_in(tmp_path):
    with running(token=TOKEN, edition="enterprise") as fake:
        report = setup_v3(conn_for(fake))
        assert {n: t.arguments["edition"] for n, t in fake.triggers.items()} == dict.fromkeys(
            fake.triggers, "enterprise"
        )
        assert set(fake.tokens) == {"_admin"}  # a token's string is shown once: with nowhere to keep it, none
    skipped = [w for a, w in report.actions if "not made" in w]
    assert skipped == [
        "nodes' token gpulse-nodes (db:gpulse:write system:ping:read): not made, no --node-token-file given",
        "Grafana's token gpulse-grafana (db:gpulse,gpulse/1m,gpulse/1h:read system:ping:read): not made, no "
        "--grafana-token-file given",
    ]


def test_enterprise_setup_makes_the_nodes_and_grafanas_tokens_once_and_never_prints_them(tmp_path, clean_env):
    nodes, grafana, flags = token_files(tmp_path)
    with running(token=TOKEN, edition="enterprise") as fake:
        first = run_setup(fake.url, token_file(tmp_path), clean_env, *flags)
        assert first.returncode == 0, first.stderr
        assert mutations(fake).count(("POST", "/api/v3/enterprise/configure/token")) == 2
        assert {n: t.text for n, t in fake.tokens.items()} == {
            "_admin": "*:*:*",
            "gpulse-nodes": "db:gpulse:write, system:ping:read",
            "gpulse-grafana": "db:gpulse,gpulse/1m,gpulse/1h:read, system:ping:read",
        }
        for path in (nodes, grafana):
            token = path.read_text().strip()
            assert token.startswith("apiv3_") and token != TOKEN and stat.S_IMODE(path.stat().st_mode) == 0o600
            assert token not in first.stdout + first.stderr
        assert f"created   nodes' token gpulse-nodes (db:gpulse:write system:ping:read) in {nodes}" in first.stdout

        fake.requests.clear()
        second = run_setup(fake.url, token_file(tmp_path), clean_env, *flags)
        assert second.returncode == 0, second.stderr
        assert mutations(fake) == [] and ("GET", "/api/v3/query_sql") in fake.requests  # it read, and changed nothing
        assert second.stdout.splitlines()[-1].endswith(": 9 unchanged")


def test_the_nodes_token_only_writes_the_raw_database_and_grafanas_only_reads_the_tiers(tmp_path, clean_env):
    nodes, grafana, flags = token_files(tmp_path)
    with running(token=TOKEN, edition="enterprise") as fake:
        assert run_setup(fake.url, token_file(tmp_path), clean_env, *flags).returncode == 0
        node, reader = nodes.read_text().strip(), grafana.read_text().strip()
        # an agent with the nodes' token asks /ping, then writes the raw database
        args = ("agent", "--api", "v3", "--url", fake.url, "--token-file", str(nodes), "--simulate", "2", "--no-socket",
                "--duration", "3", "--spool-dir", str(tmp_path / "spool"), "--summary-file", str(tmp_path / "s.json"))  # fmt: skip
        agent = subprocess.run(gpulse_cmd(*args), env=clean_env, capture_output=True, text=True, timeout=120)
        assert agent.returncode == 0, agent.stderr
        final = json.loads((tmp_path / "s.json").read_text())
        assert final["lines_written"] == final["lines_submitted"] > 0 and final["lines_rejected"] == 0
        check = ("agent", "--check", "--api", "v3", "--url", fake.url, "--token-file", str(nodes), "--simulate", "2")
        checked = subprocess.run(gpulse_cmd(*check), env=clean_env, capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr  # the check each node runs passes with it
        assert "bucket: not checked: this token may not list the databases" in checked.stdout
        line = b"gpu,host=x util=1"
        for db in ("gpulse/1m", "gpulse/1h", "other"):  # no other database, not even one a write would create
            assert http(fake, "POST", "/api/v3/write_lp", node, {"db": db}, line) == 403, db
        assert http(fake, "GET", "/query", node, {"db": "gpulse", "q": "SELECT * FROM gpu"}) == 401  # reads nothing
        assert http(fake, "GET", "/api/v3/query_sql", node, {"db": "gpulse", "q": "SELECT 1", "format": "json"}) == 403

        # Grafana's token reads every tier (its datasources query InfluxQL) and writes nothing
        for db in ("gpulse", "gpulse/1m", "gpulse/1h"):
            assert http(fake, "GET", "/query", reader, {"db": db, "q": "SELECT * FROM gpu"}) == 200, db
        for db in ("gpulse", "gpulse/1m"):
            assert http(fake, "POST", "/api/v3/write_lp", reader, {"db": db}, line) == 403, db
        assert http(fake, "POST", "/api/v3/configure/database", reader, {}, b'{"db": "x"}') == 403
        assert http(fake, "GET", "/ping", reader, {}) == 200
        assert len(fake.engine.rows("gpulse", "gpu")) == final["points"]["gpu"]  # only the agent's points


def test_a_lost_token_file_stops_setup_with_the_command_that_makes_new_tokens_which_works(tmp_path, clean_env):
    nodes, grafana, flags = token_files(tmp_path)
    admin = token_file(tmp_path)
    with running(token=TOKEN, edition="enterprise") as fake:
        assert run_setup(fake.url, admin, clean_env, *flags).returncode == 0
        old_node = nodes.read_text().strip()
        nodes.unlink()
        grafana.write_text("apiv3_a-token-of-someone-else\n")
        fake.requests.clear()
        lost = run_setup(fake.url, admin, clean_env, *flags)
        assert lost.returncode == 1 and mutations(fake) == []
        assert (
            f"gpulse-nodes (db:gpulse:write system:ping:read) exists on {fake.url} but {nodes} is missing"
            in lost.stderr
        )
        assert f"gpulse-grafana (db:gpulse,gpulse/1m,gpulse/1h:read system:ping:read) exists on {fake.url} but {grafana}" in lost.stderr  # fmt: skip
        advice = shlex.split(re.search(r"`([^`]+)`", lost.stderr)[1])
        assert advice[:2] == ["gpulse", "setup"] and "--rotate-tokens" in advice

        rotated = subprocess.run(
            gpulse_cmd(*advice[1:], "--url", fake.url, "--token-file", str(admin), *flags),
            env=clean_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert rotated.returncode == 0, rotated.stderr
        assert [w.split(" (")[0] for a, w in _report_lines(rotated.stdout) if a == "updated"] == [
            "nodes' token gpulse-nodes",
            "Grafana's token gpulse-grafana",
        ]
        new_node = nodes.read_text().strip()
        assert new_node != old_node and http(fake, "GET", "/ping", new_node, {}) == 200
        assert http(fake, "GET", "/ping", old_node, {}) == 401  # the old token is gone
        fake.requests.clear()
        assert run_setup(fake.url, admin, clean_env, *flags).returncode == 0 and mutations(fake) == []


def test_the_influxdb_readmes_v3_command_makes_the_enterprise_tokens_where_it_says(tmp_path, clean_env):
    """``influxdb/README.md`` (Without compose) as a reader types it, with the stand-in's URL for its own."""
    text = (REPO / "influxdb" / "README.md").read_text()
    block = text.split("## Without compose", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    command = re.search(r"^gpulse setup --api v3 .*?(?<!\\)$", block, re.M | re.S)[0]
    home = tmp_path / "home"
    home.mkdir()
    token_file(home).rename(home / ".influxdb3-admin-token")
    env = clean_env | {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{clean_env['PATH']}"}
    with running(token=TOKEN, edition="enterprise") as fake:
        shown = command.replace("http://127.0.0.1:8181", fake.url)
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", shown], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        assert {"gpulse-nodes", "gpulse-grafana"} <= set(fake.tokens)
        for name in ("node-token", "grafana-token"):
            assert (home / ".gpulse" / name).read_text().startswith("apiv3_")


def _report_lines(stdout: str) -> list[tuple[str, str]]:
    return [(line[:9].strip(), line[10:]) for line in stdout.splitlines() if not line.startswith("gpulse setup:")]


def test_an_expired_token_is_made_again_and_the_other_kept(tmp_path):
    nodes, grafana, _ = token_files(tmp_path)
    with running(token=TOKEN, edition="enterprise") as fake:
        conn = conn_for(fake)
        setup_v3(conn, node_token_file=str(nodes), grafana_token_file=str(grafana))
        kept = nodes.read_text()
        fake.tokens["gpulse-grafana"].expiry_ms = 1  # long past
        report = setup_v3(conn, node_token_file=str(nodes), grafana_token_file=str(grafana))
        assert [c.split(" (")[0] for c in report.changed()] == ["updated Grafana's token gpulse-grafana"]
        assert report.changed()[0].endswith(f"in {grafana} (the previous one had expired)")
        assert nodes.read_text() == kept and http(fake, "GET", "/ping", grafana.read_text().strip(), {}) == 200


def test_without_the_admin_token_or_on_another_server_setup_says_what_to_do(tmp_path):
    with running(token=TOKEN) as fake:
        with pytest.raises(SetupError) as none:
            setup_v3(Connection(url=fake.url, api="v3"))
        assert "asks for credentials on /ping" in str(none.value) and "--token-file" in str(none.value)
    with running(token=TOKEN, edition="enterprise") as fake:  # Core has no token that is not an admin's
        reads = [{"resource_type": "db", "resource_names": ["*"], "actions": ["read"]}]
        fake.add_resource_token(
            "apiv3_reader", [*reads, {"resource_type": "system", "resource_names": ["ping"], "actions": ["read"]}]
        )
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
