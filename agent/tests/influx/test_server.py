"""The one server probe: what is at the URL, decided once, and what a refusal means for the command.

The 1.x answers come from the real InfluxDB 1.6.7; the 2.x ones from its version header as 2.9.1
sends it (``v2.9.1``, ``http/handler.go`` ``buildHeader``).
"""

from __future__ import annotations

import pytest
from support.influxd import free_port
from support.rawhttp import RawHTTPServer, respond

from gpulse.influx.connection import Connection
from gpulse.influx.server import (
    Explainer,
    Problem,
    ServerInfo,
    ServerProblem,
    diagnose,
    probe,
    probe_connection,
)

V167 = ServerInfo("http://db:8086", "1.6.7~rc0", "OSS")
V18 = ServerInfo("http://db:8086", "1.8.10", "OSS")
V29 = ServerInfo("http://db:8086", "v2.9.1", "OSS")


def v1(**kw) -> Connection:
    return Connection(url="http://db:8086", api="v1", **kw)


def v2(**kw) -> Connection:
    return Connection(url="http://db:8086", api="v2", **kw)


def test_the_real_server_tells_its_version_build_and_clock_without_credentials(influxdb_module):
    info = probe(influxdb_module.url)
    assert info.version.startswith("1.6") and info.api == "v1" and info.build == "OSS"
    assert info.date and info.date.endswith("GMT")
    assert probe_connection(Connection(url=influxdb_module.url, api="v1")) == info


def test_the_other_generation_is_refused_before_anything_is_sent_with_setups_message(influxdb_module):
    with pytest.raises(ServerProblem) as e:
        probe_connection(Connection(url=influxdb_module.url, api="v2"))
    d = e.value.diagnosis
    assert d.problem is Problem.WRONG_API
    assert str(d) == (
        f"{influxdb_module.url} is InfluxDB {probe(influxdb_module.url).version}: "
        "use --api v1 (with --token-file holding user:password)"
    )


def test_nothing_listening_and_not_influxdb_are_told_apart():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerProblem) as e:
        probe(url)
    assert e.value.diagnosis.problem is Problem.UNREACHABLE
    assert f"cannot reach {url}: Connection refused" in str(e.value) and "--url" in e.value.diagnosis.fix
    with RawHTTPServer(respond("200 OK", b"<html>hello</html>", influxdb=False)) as web:
        with pytest.raises(ServerProblem) as e:
            probe(web.url)
    assert e.value.diagnosis.problem is Problem.NOT_INFLUXDB
    assert "no X-Influxdb-Version header: it is not InfluxDB" in str(e.value)


@pytest.mark.parametrize(
    ("info", "api", "admin", "verdict"),
    [
        (V167, "v1", False, None),
        (V167, "v2", False, "use --api v1"),  # 1.6 has no /api/v2/write
        (V18, "v2", False, None),  # 1.8 serves /api/v2/write
        (V18, "v2", True, "use --api v1"),  # but no buckets, DBRPs or tasks for setup
        (V29, "v2", False, None),
        (V29, "v1", False, None),  # 2.x serves /write and /query for 1.x clients
        (V29, "v1", True, "use --api v2"),  # setup's InfluxQL admin statements are 1.x only
    ],
)
def test_which_api_a_server_can_serve(info, api, admin, verdict):
    found = info.mismatch(api, admin=admin)
    assert (found and found.fix.split(" (")[0]) == verdict


def test_a_missing_retention_policy_is_a_layout_problem_not_credentials():
    conn = v1(bucket="gpulse/nosuchrp", token="admin:pw", token_source="file creds")
    for status in (500, 200):  # a write answers 500, a query 200 with the error in its result
        d = diagnose(conn, status, "retention policy not found: nosuchrp")
        assert d.problem is Problem.LAYOUT
        assert d.detail == "retention policy 'nosuchrp' does not exist on database 'gpulse'"
        assert "--bucket gpulse/POLICY" in d.fix and "--bucket gpulse for the database's default" in d.fix
    d = diagnose(v1(bucket="nosuchdb"), 404, 'database not found: "nosuchdb"')
    assert d.problem is Problem.LAYOUT and "'nosuchdb' does not exist" in d.detail
    d = diagnose(v2(bucket="nope"), 404, 'bucket "nope" not found')
    assert d.problem is Problem.LAYOUT and "bucket 'nope' does not exist in org 'gpulse'" in d.detail


def test_credentials_say_where_they_came_from_or_that_none_were_given():
    none = diagnose(v1(), 401, "unable to parse authentication credentials")
    assert none.problem is Problem.CREDENTIALS
    assert none.detail == (
        "InfluxDB at http://db:8086 asks for credentials and none were given "
        "(no --token-file, GPULSE_TOKEN_FILE, token_file in --config, nor GPULSE_TOKEN)"
    )
    assert "--token-file FILE" in none.fix and "user:password" in none.fix
    wrong = diagnose(v1(token="admin:N0t-it", token_source="file creds"), 401, "authorization failed")
    assert wrong.detail == "InfluxDB at http://db:8086 refused the credentials (user:password) from file creds"
    assert "N0t-it" not in str(wrong)
    denied = diagnose(v2(token="t", token_source="GPULSE_TOKEN"), 403, "insufficient permissions for write")
    assert "does not allow the credentials (token) from GPULSE_TOKEN" in denied.detail and "API token" in denied.fix


def test_a_refusal_from_the_other_generation_says_wrong_api_not_bad_credentials():
    assert diagnose(v2(), 404, "404 page not found", V167).problem is Problem.WRONG_API
    assert diagnose(v2(token="t"), 401, "unable to parse authentication credentials", V167).fix.startswith(
        "use --api v1"
    )
    assert diagnose(v1(), 401, "unauthorized access", V29).fix.startswith("use --api v2")  # served, but refused
    assert diagnose(v2(), 404, "404 page not found", V29) is None  # nothing known to say


def test_the_explainer_asks_the_server_once_and_only_for_a_refusal():
    with RawHTTPServer(respond()) as server:
        ex = Explainer(Connection(url=server.url, api="v2"))
        assert ex.diagnose(500, "internal error") is None and server.requests == []
        for _ in range(3):
            assert ex.diagnose(404, "404 page not found").problem is Problem.WRONG_API
        assert [r.path for r in server.requests] == ["/ping"]
