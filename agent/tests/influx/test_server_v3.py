"""The probe against InfluxDB 3 (its stand-in, ``support.fake_influx_v3``): the token on ``/ping``,
Core and Enterprise told apart, and which ``--api`` can work with a 3.x server."""

from __future__ import annotations

import pytest
from support.fake_influx_v3 import VERSION, running

from gpulse.influx.connection import Connection
from gpulse.influx.server import Problem, ServerInfo, ServerProblem, probe, probe_connection

TOKEN = "apiv3_admin-token"


def v3(url: str, token: str = TOKEN, **kw) -> Connection:
    return Connection(url=url, api="v3", token=token, token_source="file t" if token else "", **kw)


@pytest.mark.parametrize("edition", ["core", "enterprise"])
def test_the_probe_sends_the_token_and_recognises_core_and_enterprise(edition):
    with running(token=TOKEN, edition=edition) as fake:
        info = probe_connection(v3(fake.url), admin=True)
    assert (info.api, info.version, info.edition) == ("v3", VERSION, edition)
    assert info.describe() == f"InfluxDB 3 {edition.title()} {VERSION}"
    assert info.date  # the server's clock, for doctor's clock check


def test_without_the_token_ping_is_a_credentials_problem_not_something_else():
    with running(token=TOKEN) as fake:
        with pytest.raises(ServerProblem) as none:
            probe_connection(v3(fake.url, token=""))
        with pytest.raises(ServerProblem) as wrong:
            probe_connection(v3(fake.url, token="apiv3_not-it"))
    assert none.value.diagnosis.problem is Problem.CREDENTIALS
    assert "asks for credentials on /ping" in none.value.diagnosis.detail and "none were given" in str(none.value)
    assert "--token-file FILE" in none.value.diagnosis.fix and "InfluxDB 3 token" in none.value.diagnosis.fix
    assert wrong.value.diagnosis.problem is Problem.CREDENTIALS and "refused the ones given" in str(wrong.value)
    assert "apiv3_not-it" not in str(wrong.value)


def test_an_enterprise_token_that_may_not_ping_is_a_credentials_problem_that_names_the_permission():
    """Enterprise answers ``/ping`` only to a token with ``system:ping:read`` (support.authz_v3)."""
    write_only = [{"resource_type": "db", "resource_names": ["*"], "actions": ["write"]}]
    with running(token=TOKEN, edition="enterprise") as fake:
        fake.add_resource_token("apiv3_writer", write_only)
        with pytest.raises(ServerProblem) as refused:
            probe_connection(v3(fake.url, token="apiv3_writer"))
    assert refused.value.diagnosis.problem is Problem.CREDENTIALS
    assert "HTTP 403" in str(refused.value) and "system:ping:read" in str(refused.value)
    assert "--token-file FILE" in refused.value.diagnosis.fix


def test_an_open_ping_is_read_as_3x_without_a_token():
    with running(token=TOKEN, disable_authz=("ping",)) as fake:
        info = probe(fake.url)
    assert info.api == "v3" and info.edition == "core"


V3 = ServerInfo("http://db:8181", "3.10.0", "Core", product="InfluxDB 3 Core")
V29 = ServerInfo("http://db:8086", "v2.9.1", "OSS")
V18 = ServerInfo("http://db:8086", "1.8.10", "OSS")


@pytest.mark.parametrize(
    ("info", "api", "admin", "verdict"),
    [
        (V3, "v3", True, None),
        (V3, "v2", False, None),  # /api/v2/write is served
        (V3, "v1", False, None),  # /write and /query are served
        (V3, "v2", True, "use --api v3"),  # no buckets, DBRPs or tasks
        (V3, "v1", True, "use --api v3"),  # no retention policy statements
        (V29, "v3", False, "use --api v2"),  # no /api/v3
        (V18, "v3", False, "use --api v1"),
    ],
)
def test_which_api_a_3x_server_can_serve_and_which_api_3x_needs(info, api, admin, verdict):
    found = info.mismatch(api, admin=admin)
    assert (found and found.fix.split(" (")[0]) == verdict
    if found and info is V3:
        assert found.detail == "http://db:8181 is InfluxDB 3 Core 3.10.0"
