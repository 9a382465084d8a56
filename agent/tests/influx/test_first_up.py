"""The first `make up`, and every later one, against InfluxDB 2.9.1 as its code answers.

No Docker and no InfluxDB 2 here. The stack's InfluxDB is the 2.9.1 stand-in
(``support.fake_influx_v2_admin``) with a real InfluxDB 1.x as its storage engine, initialised from
the ``influxdb`` service's environment in ``docker-compose.yml`` the way the official image's
entrypoint does it (``DOCKER_INFLUXDB_INIT_*``, the init bucket ``gpulse`` with 30 d). Then the
compose ``setup`` service's own command runs twice (the second run changes nothing), the agent
writes, and ``gpulse demo`` runs. Every request is asserted, and the state they leave.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from support.fake_influx_v2_admin import FakeInfluxV2Admin, init_like_the_official_image
from support.fixtures import REPO, gpulse_cmd
from support.influxd import InfluxDB1

from gpulse.influx.downsample import TIERS, flux_query, flux_task, parse_duration
from gpulse.influx.setup.v2 import GRAFANA_TOKEN_DESCRIPTION

pytestmark = pytest.mark.influxdb
DAY = 86400


def compose_value(value: str) -> str:
    """Compose's ``${VAR:-default}`` with the defaults (what runs when .env sets nothing)."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


@pytest.fixture
def stack(tmp_path):
    """The stand-in initialised from the compose file's environment, and the secrets `make up` makes."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "influxdb-admin-password").write_text("a-long-admin-password\n")
    (secrets / "influxdb-admin-token").write_text("the-operator-token-make-up-generated\n")
    (secrets / "grafana-influx-token").touch()  # `make up` creates it empty for the bind mount
    for f in secrets.iterdir():
        f.chmod(0o600)
    env = {
        k: compose_value(str(v)).replace("/run/secrets/", f"{secrets}/")
        for k, v in compose["services"]["influxdb"]["environment"].items()
    }
    backend = InfluxDB1(tmp_path / "influxd").start()
    with FakeInfluxV2Admin(onboarded=False, backend=backend) as fake:
        init_like_the_official_image(fake.url, env)
        fake.requests.clear()  # what follows is gpulse's
        yield fake, compose, secrets
    backend.stop()


def setup_command(compose: dict, fake: FakeInfluxV2Admin, secrets: Path) -> list[str]:
    """The compose ``setup`` service's command, pointed at the stand-in and this test's secrets."""
    args = [compose_value(a) for a in compose["services"]["setup"]["command"]]
    args = [a.replace("http://influxdb:8086", fake.url) for a in args]
    args = [a.replace("/run/secrets/", f"{secrets}/").replace("/run/gpulse/", f"{secrets}/") for a in args]
    return gpulse_cmd(*args)


def calls(fake: FakeInfluxV2Admin, since: int = 0) -> list[tuple[str, str, dict[str, str], int]]:
    return [(c.method, c.path, c.params, c.status) for c in fake.requests[since:]]


def test_setup_twice_on_a_fresh_2_9_server_then_the_agent_then_the_demo(stack, tmp_path, clean_env):
    fake, compose, secrets = stack
    org = fake.org_id
    raw = fake.bucket("gpulse")
    assert raw["retentionRules"][0] == {"type": "expire", "everySeconds": 30 * DAY, "shardGroupDurationSeconds": DAY}
    assert fake.state.operator_token == "the-operator-token-make-up-generated"  # the entrypoint's $(cat FILE)

    # -- the first `make up`: setup creates everything ----------------------------------------------
    first = subprocess.run(
        setup_command(compose, fake, secrets), env=clean_env, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    names = {b["name"]: b["id"] for b in fake.state.buckets.values() if b["type"] == "user"}
    lookups = [("GET", "/api/v2/buckets", {"orgID": org, "name": n}) for n in ("gpulse", "gpulse_1m", "gpulse_1h")]
    assert calls(fake) == [
        ("GET", "/ping", {}, 204),
        ("GET", "/health", {}, 200),
        ("GET", "/api/v2/setup", {}, 200),
        ("GET", "/api/v2/orgs", {"org": "gpulse"}, 200),
        (*lookups[0], 200),
        (*lookups[1], 404),  # 2.9: absent, not an empty list
        ("POST", "/api/v2/buckets", {}, 201),
        (*lookups[2], 404),
        ("POST", "/api/v2/buckets", {}, 201),
        ("GET", "/api/v2/dbrps", {"orgID": org, "db": "gpulse"}, 200),
        ("POST", "/api/v2/dbrps", {}, 201),
        ("POST", "/api/v2/dbrps", {}, 201),
        ("POST", "/api/v2/dbrps", {}, 201),
        ("GET", "/api/v2/tasks", {"orgID": org, "name": "gpulse_raw_to_1m"}, 200),
        ("POST", "/api/v2/tasks", {}, 201),
        ("GET", "/api/v2/tasks", {"orgID": org, "name": "gpulse_1m_to_1h"}, 200),
        ("POST", "/api/v2/tasks", {}, 201),
        ("GET", "/api/v2/authorizations", {"orgID": org}, 200),  # the token file is empty: no check
        ("POST", "/api/v2/authorizations", {}, 201),
    ]
    bodies = [c.body for c in fake.requests if c.method == "POST"]
    assert bodies[0]["retentionRules"] == [{"type": "expire", "everySeconds": 400 * DAY}]
    assert bodies[1]["retentionRules"] == []  # forever
    assert [(b["retention_policy"], b["bucketID"], b["default"]) for b in bodies[2:5]] == [
        ("raw", names["gpulse"], True), ("1m", names["gpulse_1m"], False), ("1h", names["gpulse_1h"], False),
    ]  # fmt: skip
    assert [b["flux"] for b in bodies[5:7]] == [flux_task(t) for t in TIERS]
    assert "created" in first.stdout and "gpulse setup:" in first.stdout

    # -- the second `make up`: nothing changes --------------------------------------------------------
    n = len(fake.requests)
    token = (secrets / "grafana-influx-token").read_text().strip()
    second = subprocess.run(
        setup_command(compose, fake, secrets), env=clean_env, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert calls(fake, n) == [
        ("GET", "/ping", {}, 204),
        ("GET", "/health", {}, 200),
        ("GET", "/api/v2/setup", {}, 200),
        ("GET", "/api/v2/orgs", {"org": "gpulse"}, 200),
        *[(*lookup, 200) for lookup in lookups],
        ("GET", "/api/v2/dbrps", {"orgID": org, "db": "gpulse"}, 200),
        ("GET", "/api/v2/tasks", {"orgID": org, "name": "gpulse_raw_to_1m"}, 200),
        ("GET", "/api/v2/tasks", {"orgID": org, "name": "gpulse_1m_to_1h"}, 200),
        *[(*lookup, 200) for lookup in lookups],  # with Grafana's token: it still reads all three
    ]
    assert "created" not in second.stdout and "updated" not in second.stdout and "deleted" not in second.stdout
    assert (secrets / "grafana-influx-token").read_text().strip() == token

    # -- the end state of setup -----------------------------------------------------------------------
    user_buckets = {b["name"]: b["retentionRules"][0] for b in fake.state.buckets.values() if b["type"] == "user"}
    assert user_buckets == {
        "gpulse": {"type": "expire", "everySeconds": 30 * DAY, "shardGroupDurationSeconds": DAY},
        "gpulse_1m": {"type": "expire", "everySeconds": 400 * DAY, "shardGroupDurationSeconds": 7 * DAY},
        "gpulse_1h": {"type": "expire", "everySeconds": 0, "shardGroupDurationSeconds": 7 * DAY},
    }
    assert {(d["retention_policy"], d["bucketID"], d["default"]) for d in fake.dbrps()} == {
        ("raw", names["gpulse"], True), ("1m", names["gpulse_1m"], False), ("1h", names["gpulse_1h"], False),
    }  # fmt: skip
    for tier in TIERS:
        t = fake.task(f"gpulse_{tier.source}_to_{tier.name}")
        assert (t["flux"], t["every"], t["offset"], t["status"]) == (flux_task(tier), tier.every, tier.offset, "active")
    (grafana,) = [a for a in fake.state.auths.values() if a["description"] == GRAFANA_TOKEN_DESCRIPTION]
    assert grafana["token"] == token
    assert {(p["action"], p["resource"]["id"]) for p in grafana["permissions"]} == {("read", i) for i in names.values()}

    # -- the agent writes -----------------------------------------------------------------------------
    n = len(fake.requests)
    admin_token = secrets / "influxdb-admin-token"
    agent = subprocess.run(
        gpulse_cmd("agent", "--simulate", "2", "--no-socket", "--duration", "3", "--url", fake.url,
                   "--token-file", str(admin_token), "--spool-dir", str(tmp_path / "spool")),
        env=clean_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert agent.returncode == 0, agent.stderr
    writes = [c for c in fake.requests[n:] if c.path == "/api/v2/write"]
    assert writes and all(c.status == 204 for c in writes), [(c.status, c.params) for c in writes]
    assert all(c.params == {"org": "gpulse", "bucket": "gpulse", "precision": "ns"} for c in writes)
    assert all(c.status < 400 for c in fake.requests[n:])
    assert influxql(fake, token, 'SELECT count("util_gpu_pct") FROM "gpu"')[0]["count"] > 0  # Grafana's token reads it

    # -- gpulse demo ----------------------------------------------------------------------------------
    n = len(fake.requests)
    demo = subprocess.run(
        gpulse_cmd("demo", "--url", fake.url, "--token-file", str(admin_token), "--hours", "1", "--gpus", "2",
                   "--out", str(tmp_path / "demo")),
        env=clean_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "downsampled the whole window into the 1m and 1h tiers" in demo.stdout
    assert (tmp_path / "demo" / "metrics_report.json").is_file()
    after = fake.requests[n:]
    assert all(c.status < 400 for c in after), [(c.method, c.path, c.status) for c in after if c.status >= 400]
    flux = [c for c in after if c.path == "/api/v2/query"]
    assert [c.params for c in flux] == [{"org": "gpulse"}] * 2
    window = [int(x) for x in re.findall(r"time\(v: (\d+)\)", flux[0].body["query"])]
    assert [c.body["query"] for c in flux] == [flux_query(t, "gpulse", window[0], window[1]) for t in TIERS]
    assert window[1] - window[0] >= parse_duration("1h")
    influxql_calls = [c for c in after if c.path == "/query"]
    assert influxql_calls and all("org" not in c.params for c in influxql_calls)  # 2.9 takes the org from the token
    run_id = json.loads((tmp_path / "demo" / "metrics_report.json").read_text())["run"]["id"]
    steps = influxql(fake, token, f'SELECT count("step_time_s") FROM "train_step" WHERE "run" = \'{run_id}\'')
    assert steps[0]["count"] > 0
    assert fake.writes()[-1] == ("POST", "/api/v2/authorizations")  # neither the agent nor the demo changed the setup


def influxql(fake: FakeInfluxV2Admin, token: str, q: str) -> list[dict]:
    """A query as Grafana's InfluxQL datasource sends it: ``db=gpulse``, the read-only token."""
    req = urllib.request.Request(
        f"{fake.url}/query",
        data=urllib.parse.urlencode({"q": q, "db": "gpulse", "epoch": "ns"}).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        body = json.loads(r.read())
    series = body["results"][0].get("series") or []
    return [dict(zip(s["columns"], v, strict=True)) for s in series for v in s["values"]]
