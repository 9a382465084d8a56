"""The InfluxDB 3 stand-in answers as the server's code does, behaviour by behaviour.

Each test names the source it holds the stand-in to (``influxdata/influxdb`` 3.10 nightly, d7834110;
H = ``influxdb3_server/src/http.rs``). They talk HTTP to it the way any client would, so a drift from
the server's behaviour fails here before it can make another test lie.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from support.engine_v3 import load_plugin
from support.fake_influx_v3 import DEFAULT_PORT, MIB, FakeInfluxV3, Refused, parse_trigger_spec, running
from support.fixtures import REPO

from gpulse.influx.downsample import parse_duration
from gpulse.influx.engine_plugin import PLUGIN_PATH, Edition, engine_tiers, files_per_block, triggers

TOKEN = "apiv3_admin-token"
T0 = 1_800_000_000_000_000_000  # whole 10-minute block
MINUTE = 60 * 10**9


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]
    text: str


def call(
    fake: FakeInfluxV3,
    method: str,
    path: str,
    *,
    params: dict[str, str] | None = None,
    body: Any = None,
    raw: bytes | None = None,
    auth: str | None = f"Token {TOKEN}",
    headers: dict[str, str] | None = None,
) -> Answer:
    url = f"{fake.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    h = dict(headers or {})
    if body is not None:
        raw = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    if auth is not None:
        h["Authorization"] = auth
    req = urllib.request.Request(url, data=raw, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, payload, hdrs = r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        status, payload, hdrs = e.code, e.read(), dict(e.headers)
    text = payload.decode()
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = text
    return Answer(status, parsed, hdrs, text)


def write(fake: FakeInfluxV3, path: str, lines: str, **params: str) -> Answer:
    return call(fake, "POST", path, params=params, raw=lines.encode())


@pytest.fixture
def influx3():
    with running(token=TOKEN) as fake:
        yield fake


# -- tokens and probes ---------------------------------------------------------------------------------
def test_ping_and_health_need_the_token_unless_authz_is_disabled_for_them(influx3):
    """H ``perform_routing``: authentication comes before every route but the disabled ones."""
    for path in ("/ping", "/health"):
        r = call(influx3, "GET", path, auth=None)
        assert (r.status, r.body) == (401, {"error": "the request was not authenticated"}), path
    with running(token=TOKEN, disable_authz=("ping", "health")) as open_probes:
        ping = call(open_probes, "GET", "/ping", auth=None)
        assert ping.status == 200 and ping.headers["X-Influxdb-Version"] == "3.10.0-nightly"
        assert ping.body["version"] == "3.10.0-nightly" and ping.body["product_name"] == "InfluxDB 3 Core"
        for path in ("/health", "/api/v1/health"):  # helpers.rs DisableAuthzList: health opens both
            health = call(open_probes, "GET", path, auth=None)
            assert (health.status, health.text) == (200, "OK")
            assert health.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert call(open_probes, "POST", "/write", params={"db": "x"}, auth=None).status == 401  # only those


def test_the_token_goes_as_token_bearer_basic_password_or_p_and_anything_else_is_refused(influx3):
    """H ``validate_auth_header``, ``token_part_as_bytes``, ``extract_v1_auth_token``."""
    basic = "Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    for auth in (f"Token {TOKEN}", f"Bearer {TOKEN}", basic):
        assert call(influx3, "GET", "/ping", auth=auth).status == 200, auth
    assert write(influx3, "/write", "m f=1 1", db="a", p=TOKEN).status == 204  # p= on /write and /query
    for auth in (f"Digest {TOKEN}", f"Token {TOKEN} extra", "Basic !!!"):
        assert call(influx3, "GET", "/ping", auth=auth).status == 400, auth
    assert call(influx3, "GET", "/ping", auth="Token wrong").status == 401


def test_there_is_no_flux_and_no_2x_management_api_and_the_token_is_checked_before_the_route(influx3):
    """``all_paths.rs`` has none of these paths; H ``perform_routing`` authenticates first."""
    for path in ("setup", "orgs", "buckets", "dbrps", "tasks", "authorizations", "query"):
        assert call(influx3, "GET", f"/api/v2/{path}", auth=None).status == 401
        r = call(influx3, "GET", f"/api/v2/{path}")
        assert (r.status, r.text) == (404, "Not found"), path
    assert DEFAULT_PORT == 8181


def db_perm(names: list[str], *actions: str) -> dict[str, Any]:
    return {"resource_type": "db", "resource_names": names, "actions": list(actions)}


TOKEN_ROUTE = "/api/v3/enterprise/configure/token"
SYSTEM_TOKENS = {"db": "_internal", "q": "SELECT * FROM system.tokens", "format": "json"}


@pytest.fixture
def enterprise():
    with running(token=TOKEN, edition="enterprise") as fake:
        yield fake


def test_core_has_only_admin_tokens_and_no_route_to_make_others(influx3):
    with pytest.raises(ValueError, match="Core has only admin tokens"):
        influx3.add_resource_token("reader", [db_perm(["gpulse"], "read")])
    body = {"token_name": "reader", "permissions": [db_perm(["*"], "read")]}
    assert call(influx3, "POST", TOKEN_ROUTE, body=body, auth=None).status == 401  # the token before the route
    r = call(influx3, "POST", TOKEN_ROUTE, body=body)
    assert (r.status, r.text) == (404, "Not found")  # H perform_routing: Core has no such route
    listed = call(influx3, "GET", "/api/v3/query_sql", params=SYSTEM_TOKENS).body
    assert [(t["name"], t["permissions"]) for t in listed] == [("_admin", "*:*:*")]


def test_a_resource_token_is_made_once_per_name_from_resource_names_and_its_string_shown_only_then(enterprise):
    """Docs ``admin/tokens/resource/create``; docs-v2#7063 (``resource_identifier`` is refused); C
    ``validate_permission_specs``, ``ops/token.rs``; ``influxdb3_system_tables/src/tokens.rs``."""
    assert write(enterprise, "/api/v3/write_lp", "m f=1 1", db="gpulse").status == 204
    body = {"token_name": "nodes", "permissions": [db_perm(["gpulse"], "write")]}
    old_field = [{"resource_type": "db", "resource_identifier": ["gpulse"], "actions": ["write"]}]
    r = call(enterprise, "POST", TOKEN_ROUTE, body={"token_name": "nodes", "permissions": old_field})
    assert (r.status, r.text) == (400, "serde json error: missing field `resource_names`")
    made = call(enterprise, "POST", TOKEN_ROUTE, body=body)
    assert made.status == 201 and made.body["name"] == "nodes" and made.body["expiry"] is None
    assert made.body["token"].startswith("apiv3_") and made.body["created_at"].endswith("Z")
    again = call(enterprise, "POST", TOKEN_ROUTE, body=body)
    assert (again.status, again.text) == (409, "token name already exists, nodes")
    for permissions, why in (
        ([db_perm(["nope"], "read")], "invalid resource name nope"),
        ([db_perm(["*", "gpulse"], "read")], "mixed wildcard (*) and resource name"),
        ([db_perm(["gpulse"], "drop")], "action not supported, database action drop"),
        ([{"resource_type": "*", "resource_names": ["*"], "actions": ["*"]}], "* resource type can only be set for admin token"),
        ([{"resource_type": "system", "resource_names": ["pong"], "actions": ["read"]}], "invalid resource name pong"),
    ):  # fmt: skip
        r = call(enterprise, "POST", TOKEN_ROUTE, body={"token_name": "x", "permissions": permissions})
        assert (r.status, r.text) == (500, f"cannot parse token permission, {why}"), permissions
    listed = call(enterprise, "GET", "/api/v3/query_sql", params=SYSTEM_TOKENS).body
    assert [(t["name"], t["permissions"]) for t in listed] == [("_admin", "*:*:*"), ("nodes", "db:gpulse:write")]
    assert listed[1]["hash"] == hashlib.sha512(made.body["token"].encode()).hexdigest()[:9]
    assert made.body["token"] not in json.dumps(listed)  # the server keeps the hash only

    nodes = f"Token {made.body['token']}"
    other = {"token_name": "y", "permissions": [db_perm(["gpulse"], "read")]}
    assert call(enterprise, "POST", TOKEN_ROUTE, body=other, auth=nodes).status == 403  # making tokens: admin
    assert call(enterprise, "GET", "/api/v3/query_sql", params=SYSTEM_TOKENS, auth=nodes).status == 403  # _internal
    gone = call(enterprise, "DELETE", "/api/v3/configure/token", params={"token_name": "nodes"})
    assert gone.status == 200 and call(enterprise, "GET", "/ping", auth=nodes).status == 401
    assert call(enterprise, "DELETE", "/api/v3/configure/token", params={"token_name": "nodes"}).status == 404
    assert call(enterprise, "DELETE", "/api/v3/configure/token", params={"token_name": "_admin"}).status == 405


def test_a_write_token_writes_its_database_only_reads_nothing_and_may_not_ping(enterprise):
    """P ``is_allowed_access``: the exact database, else ``db:*``, else ``*:*``; H ``Error::ResourceAuthorization``
    (403, empty); the v1 query handler's ``AuthorizationFailure`` (401 ``unauthorized access``)."""
    for db in ("gpulse", "other"):
        assert write(enterprise, "/api/v3/write_lp", "m f=1 1", db=db).status == 204
    enterprise.add_resource_token("apiv3_w", [db_perm(["gpulse"], "write")])
    auth = "Token apiv3_w"
    assert (
        call(enterprise, "POST", "/api/v3/write_lp", params={"db": "gpulse"}, raw=b"m f=2 2", auth=auth).status == 204
    )
    assert call(enterprise, "POST", "/write", params={"db": "gpulse"}, raw=b"m f=3 3", auth=auth).status == 204
    for db in ("other", "new"):  # another database, and one a write would create (that needs db:*)
        r = call(enterprise, "POST", "/api/v3/write_lp", params={"db": db}, raw=b"m f=2 2", auth=auth)
        assert (r.status, r.text) == (403, ""), db
    q = call(enterprise, "GET", "/query", params={"db": "gpulse", "q": "SELECT * FROM m"}, auth=auth)
    assert (q.status, q.body) == (401, {"error": "unauthorized access"})
    sql = {"db": "gpulse", "q": "SELECT * FROM m", "format": "json"}
    assert call(enterprise, "GET", "/api/v3/query_sql", params=sql, auth=auth).status == 403
    assert call(enterprise, "GET", "/ping", auth=auth).status == 403  # needs system:ping:read
    assert call(enterprise, "GET", "/api/v3/configure/database", params={"format": "json"}, auth=auth).status == 403
    assert sorted(r["f"] for r in enterprise.engine.rows("gpulse", "m")) == [1.0, 2.0, 3.0]


def test_a_read_token_reads_its_databases_and_pings_as_granted_and_writes_nothing(enterprise):
    for db in ("gpulse", "gpulse/1m", "other"):
        assert write(enterprise, "/api/v3/write_lp", "m f=1 1", db=db).status == 204
    ping = {"resource_type": "system", "resource_names": ["ping"], "actions": ["read"]}
    enterprise.add_resource_token("apiv3_r", [db_perm(["gpulse", "gpulse/1m"], "read"), ping])
    auth = "Token apiv3_r"
    for db in ("gpulse", "gpulse/1m"):
        q = call(enterprise, "GET", "/query", params={"db": db, "q": "SELECT * FROM m"}, auth=auth)
        assert q.status == 200 and q.body["results"][0]["series"][0]["values"], db
    assert call(enterprise, "GET", "/query", params={"db": "other", "q": "SELECT * FROM m"}, auth=auth).status == 401
    # SHOW DATABASES lists what the token may describe: read is not describe
    assert call(enterprise, "GET", "/query", params={"q": "SHOW DATABASES"}, auth=auth).status == 401
    assert (
        call(enterprise, "POST", "/api/v3/write_lp", params={"db": "gpulse"}, raw=b"m f=2 2", auth=auth).status == 403
    )
    assert call(enterprise, "GET", "/ping", auth=auth).status == 200
    assert call(enterprise, "GET", "/health", auth=auth).status == 403  # system:health:read not granted


def test_wildcards_cover_databases_not_made_yet_and_an_expired_token_is_unknown(enterprise):
    enterprise.add_resource_token("apiv3_any", [db_perm(["*"], "write")])
    r = call(enterprise, "POST", "/api/v3/write_lp", params={"db": "new"}, raw=b"m f=1 1", auth="Token apiv3_any")
    assert r.status == 204  # get_permission_without_resource_identifier: db:* matches a database to be
    body = {"token_name": "brief", "permissions": [db_perm(["new"], "read")], "expiry_secs": 0}
    made = call(enterprise, "POST", TOKEN_ROUTE, body=body)
    assert made.status == 201 and made.body["expiry"] is not None
    assert (
        call(
            enterprise,
            "GET",
            "/query",
            params={"db": "new", "q": "SELECT * FROM m"},
            auth=f"Token {made.body['token']}",
        ).status
        == 401
    )


# -- writes --------------------------------------------------------------------------------------------
def test_a_write_creates_its_database_and_answers_204(influx3):
    assert write(influx3, "/write", "gpu,host=a util=1 1", db="gpulse").status == 204
    assert write(influx3, "/api/v2/write", "gpu,host=a util=2 2", bucket="gpulse_v2", org="ignored").status == 204
    assert write(influx3, "/write", "gpu,host=a util=3 3", db="gpulse", rp="1h").status == 204  # db/rp
    assert write(influx3, "/api/v3/write_lp", "gpu,host=a util=4 4", db="v3", precision="nanosecond").status == 204
    names = call(influx3, "GET", "/api/v3/configure/database", params={"format": "json"}).body
    assert names == [{"iox::database": n} for n in ("gpulse", "gpulse/1h", "gpulse_v2", "v3")]


def test_one_bad_line_on_write_rejects_the_batch_with_its_number_and_20_bytes_of_it(influx3):
    """``influxdb3_types/src/http.rs``: legacy writes force accept_partial=false; ``write.rs`` WriteLineError."""
    bad = "gpu,host=a,this_is_a_long_line util=oops 2"
    r = write(influx3, "/write", f"gpu,host=a util=1 1\n{bad}\ngpu,host=a util=3 3\n", db="gpulse")
    assert r.status == 400 and r.body["error"] == "line protocol parsing error"
    data = r.body["data"]
    assert isinstance(data, dict) and data["line_number"] == 2 and data["original_line"] == bad[:20]
    assert influx3.engine.rows("gpulse", "gpu") == []  # the good line before it is not written either


def test_one_bad_line_on_api_v2_write_is_invalid_without_a_line_number(influx3):
    r = write(influx3, "/api/v2/write", "gpu,host=a util=1 1\ngpu util=oops 2\n", bucket="gpulse")
    assert r.status == 400 and r.body["code"] == "invalid"
    assert r.body["message"].startswith("write buffer error: line protocol parse failed: ")
    assert set(r.body) == {"code", "message"}
    assert write(influx3, "/api/v2/write", "m f=1 1", org="o").body == {
        "code": "invalid",
        "message": "missing bucket value",
    }
    assert write(influx3, "/write", "m f=1 1").body == {"error": "no db destination provided"}
    r = write(influx3, "/write", "m f=1 1", db="d", precision="auto")  # no auto on the legacy endpoints
    assert r.status == 400 and r.body["error"].startswith("failed to deserialize db/rp/precision in request")


def test_write_lp_keeps_the_good_lines_and_lists_the_bad_ones(influx3):
    lines = "gpu,host=a util=1 1\ngpu util=oops 2\ngpu,host=a util=3 3\ngpu util= 4\n"
    r = write(influx3, "/api/v3/write_lp", lines, db="gpulse", precision="ns")
    assert r.status == 400 and r.body["error"] == "partial write of line protocol occurred"
    assert [e["line_number"] for e in r.body["data"]] == [2, 4]
    assert [row["util"] for row in influx3.engine.rows("gpulse", "gpu")] == [1.0, 3.0]
    strict = write(influx3, "/api/v3/write_lp", "gpu util=oops 5\n", db="gpulse", accept_partial="false")
    assert strict.status == 400 and strict.body["error"] == "line protocol parsing error"


def test_write_lp_guesses_the_unit_of_a_timestamp_by_default():
    """``influxdb3_types/src/write.rs``: precision ``auto`` reads 3 as seconds, 1.6e12 as milliseconds, 1.7e18 as nanoseconds."""
    with running(token=TOKEN) as fake:
        write(fake, "/api/v3/write_lp", "m f=1 3\nm f=2 1600000000000\nm f=3 1700000000000000000\n", db="d")
        assert [r["time"] for r in fake.engine.rows("d", "m")] == [3 * 10**9, 16 * 10**17, 17 * 10**17]


def test_the_request_limit_applies_after_gzip_and_is_a_413():
    """H ``read_body``: ``--max-http-request-size`` (10 MiB) on the decompressed body."""
    assert FakeInfluxV3().max_request_bytes == 10 * MIB
    with running(token=TOKEN, max_request_bytes=1000) as fake:
        small_gzip = gzip.compress(b"m f=1 1\n" * 200)  # 1600 bytes once decompressed
        assert len(small_gzip) < 1000
        r = call(fake, "POST", "/write", params={"db": "d"}, raw=small_gzip, headers={"Content-Encoding": "gzip"})
        assert (r.status, r.text) == (413, "max request size (1000 bytes) exceeded")
        ok = gzip.compress(b"m f=1 1\n" * 100)
        assert (
            call(fake, "POST", "/write", params={"db": "d"}, raw=ok, headers={"Content-Encoding": "gzip"}).status == 204
        )
        r = call(fake, "POST", "/write", params={"db": "d"}, raw=b"m f=1 1", headers={"Content-Encoding": "br"})
        assert (r.status, r.text) == (400, "unacceptable content-encoding: br")


def columns_line(first: int, n: int, ts: int) -> str:
    return "wide " + ",".join(f"f{i}={i}" for i in range(first, first + n)) + f" {ts}\n"


def test_a_table_holds_500_columns_400_on_legacy_writes_422_on_partial_writes(influx3):
    """``transaction.rs`` check_columns_limit (tags + fields >= 500); H ``PartialLpWrite`` limit_hit -> 422."""
    assert write(influx3, "/write", columns_line(0, 500, 1), db="d").status == 204
    why = "Update to schema would exceed number of columns per table limit of 500 columns"
    legacy = write(influx3, "/write", columns_line(500, 1, 2), db="d")
    assert legacy.status == 400 and legacy.body["data"]["error_message"] == why
    v2 = write(influx3, "/api/v2/write", columns_line(500, 1, 2), bucket="d")
    assert (v2.status, v2.body["code"]) == (400, "invalid") and why in v2.body["message"]
    partial = write(
        influx3, "/api/v3/write_lp", columns_line(0, 1, 3) + columns_line(500, 1, 4), db="d", precision="ns"
    )
    assert partial.status == 422 and [e["error_message"] for e in partial.body["data"]] == [why]
    assert [r["time"] for r in influx3.engine.rows("d", "wide")] == [1, 3]


def test_a_field_of_another_type_than_its_column_is_a_bad_line(influx3):
    """``transaction.rs`` column_or_create: ``CatalogError::InvalidColumnType``, the types as IOx names them."""
    write(influx3, "/write", "gpu,host=a util=1 1", db="d")
    r = write(influx3, "/api/v3/write_lp", "gpu,host=a util=2i 2\ngpu host=3 3\n", db="d", precision="ns")
    assert r.status == 400
    assert [e["error_message"] for e in r.body["data"]] == [
        "invalid column type for column 'util', expected iox::column_type::field::float, got iox::column_type::field::integer",
        "invalid column type for column 'host', expected iox::column_type::tag, got iox::column_type::field::float",
    ]


def test_core_holds_five_databases(influx3):
    for i in range(5):
        assert write(influx3, "/write", "m f=1 1", db=f"db{i}").status == 204
    r = write(influx3, "/write", "m f=1 1", db="db5")
    assert (r.status, r.body) == (422, {"error": "Adding a new database would exceed limit of 5 databases"})
    create = call(influx3, "POST", "/api/v3/configure/database", body={"db": "db5"})
    assert create.status == 422


def test_a_database_name_is_checked_before_anything_is_written(influx3):
    """H ``validate_db_name``: one ``/`` between database and retention policy, ASCII letters and digits."""
    for name in ("bad name", "a/b/c", "a/", "_x"):
        r = write(influx3, "/api/v3/write_lp", "m f=1 1", db=name)
        assert r.status == 400 and "error" in r.body, name
    assert influx3.databases == {}


# -- database configuration ----------------------------------------------------------------------------
def test_databases_are_created_updated_listed_with_format_and_deleted(influx3):
    """H ``create_database``, ``update_database``, ``show_databases``, ``delete_database``."""
    path = "/api/v3/configure/database"
    assert call(influx3, "POST", path, body={"db": "gpulse", "retention_period": "30d"}).status == 200
    assert influx3.databases["gpulse"].retention_period_s == 30 * 86400
    assert call(influx3, "POST", path, body={"db": "gpulse"}).status == 409
    as_text = call(influx3, "POST", path, raw=b'{"db": "x"}', headers={"Content-Type": "text/plain"})
    assert as_text.status == 415  # read_body_json: application/json only
    assert call(influx3, "PUT", path, body={"db": "gpulse", "retention_period": "400d"}).status == 200
    assert influx3.databases["gpulse"].retention_period_s == 400 * 86400
    assert call(influx3, "PUT", path, body={"db": "gpulse"}).status == 200  # no period: cleared
    assert influx3.databases["gpulse"].retention_period_s is None
    no_format = call(influx3, "GET", path)
    assert (no_format.status, no_format.text) == (400, "serde error: missing field `format`")
    assert call(influx3, "GET", path, params={"format": "json"}).body == [{"iox::database": "gpulse"}]
    assert call(influx3, "DELETE", path, params={"db": "gpulse"}).status == 200
    gone = call(influx3, "DELETE", path, params={"db": "gpulse"})
    assert (gone.status, gone.text) == (404, "Database not found gpulse")


# -- plugins and triggers ------------------------------------------------------------------------------
def trigger(db: str, spec: str, name: str = "t", plugin: str = "p.py") -> dict[str, Any]:
    return {
        "db": db,
        "plugin_filename": plugin,
        "trigger_name": name,
        "trigger_specification": spec,
        "trigger_settings": {"run_async": False, "error_behavior": "log"},
        "trigger_arguments": None,
        "disabled": False,
    }


def test_a_trigger_needs_its_plugin_file_a_valid_specification_and_an_existing_database(influx3):
    """H ``configure_processing_engine_trigger``: plugin file (500), spec (500), database (404), name (409)."""
    path = "/api/v3/configure/processing_engine_trigger"
    assert call(influx3, "POST", path, body=trigger("gpulse", "every:10m")).status == 500  # no plugin file yet
    assert (
        call(influx3, "POST", "/api/v3/plugins/files", body={"plugin_name": "p.py", "content": "x = 1\n"}).status == 200
    )
    bad = call(influx3, "POST", path, body=trigger("nowhere", "sometimes"))
    assert bad.status == 500 and bad.text.startswith("failed to parse trigger from sometimes")  # before the database
    missing = call(influx3, "POST", path, body=trigger("gpulse", "every:10m"))
    assert (missing.status, missing.text) == (404, "Database not found gpulse")
    call(influx3, "POST", "/api/v3/configure/database", body={"db": "gpulse"})
    unsettled = trigger("gpulse", "every:10m") | {"trigger_settings": {"run_async": False}}
    assert call(influx3, "POST", path, body=unsettled).status == 400  # TriggerSettings: both fields required
    assert call(influx3, "POST", path, body=trigger("gpulse", "every:10m")).status == 200
    assert call(influx3, "POST", path, body=trigger("gpulse", "every:10m")).status == 409


def test_put_on_plugin_files_replaces_the_file_of_the_trigger_so_named(influx3):
    """``influxdb3_processing_engine/src/lib.rs`` update_plugin_file looks the name up among triggers."""
    files = "/api/v3/plugins/files"
    r = call(influx3, "PUT", files, body={"plugin_name": "p.py", "content": "x = 2\n"})
    assert r.status == 500 and "Plugin not found: p.py" in r.text
    call(influx3, "POST", files, body={"plugin_name": "p.py", "content": "x = 1\n"})
    call(influx3, "POST", "/api/v3/configure/database", body={"db": "gpulse"})
    call(influx3, "POST", "/api/v3/configure/processing_engine_trigger", body=trigger("gpulse", "every:1h", "hourly"))
    assert call(influx3, "PUT", files, body={"plugin_name": "hourly", "content": "x = 3\n"}).status == 200
    assert (influx3.plugin_dir / "p.py").read_text() == "x = 3\n"


def test_a_request_trigger_answers_for_its_plugin_and_a_plugin_that_raises_is_a_500(influx3):
    """H ``processing_engine_request_plugin``; ``plugins.rs``: the plugin's answer, or 500 ``{"error": ...}``."""
    code = "def process_request(influxdb3_local, query_parameters, request_headers, request_body, args=None):\n"
    code += "    if 'fail' in query_parameters:\n        raise RuntimeError('boom')\n"
    code += "    return {'seen': sorted(request_headers).count('Authorization'), 'args': args}\n"
    call(influx3, "POST", "/api/v3/plugins/files", body={"plugin_name": "echo.py", "content": code})
    call(influx3, "POST", "/api/v3/configure/database", body={"db": "gpulse"})
    body = trigger("gpulse", "request:echo", "echo", "echo.py") | {"trigger_arguments": {"a": "1"}}
    call(influx3, "POST", "/api/v3/configure/processing_engine_trigger", body=body)
    assert call(influx3, "GET", "/api/v3/engine/echo").body == {"seen": 0, "args": {"a": "1"}}  # no token passed on
    failed = call(influx3, "POST", "/api/v3/engine/echo", params={"fail": "1"})
    assert failed.status == 500 and "boom" in failed.body["error"]
    escape = call(influx3, "POST", "/api/v3/plugins/files", body={"plugin_name": "../x.py", "content": ""})
    assert escape.status == 500


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("table:gpu", "table"),
        ("all_tables", "all_tables"),
        ("every:10m", "every"),
        ("every:1 hour", "every"),
        ("cron:0 1/10 * * * *", "cron"),
        ("cron:0 5 * * * * 2027", "cron"),
        ("cron:0 0 9-17 * * Mon-Fri", "cron"),
        ("request:gpulse_recompute", "request"),
    ],
)
def test_the_trigger_grammar_accepts(spec, kind):
    """``influxdb3_catalog/src/log/versions/v2.rs`` ``from_string_rep``."""
    assert parse_trigger_spec(spec) == kind


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("table:", "table name is empty"),
        ("every:soon", "couldn't parse to duration"),
        ("every:2y", "don't support every schedules of over 1 year"),
        ("cron:*/10 * * * *", ""),  # five fields: the cron crate wants seconds first
        ("cron:0 60 * * * *", ""),  # minute 60
        ("cron:0 */0 * * * *", ""),
        ("request:", ""),
        ("wal", "expect one of the following forms"),
    ],
)
def test_the_trigger_grammar_refuses_with_a_500(spec, why):
    with pytest.raises(Refused) as e:
        parse_trigger_spec(spec)
    assert e.value.answer.status == 500 and e.value.answer.body.startswith(f"failed to parse trigger from {spec}")
    assert why in e.value.answer.body


def test_gpulses_generated_plugin_and_triggers_are_accepted(influx3):
    plugin = (REPO / "influxdb" / PLUGIN_PATH).read_text(encoding="utf-8")
    assert (
        call(
            influx3, "POST", "/api/v3/plugins/files", body={"plugin_name": "gpulse_downsample.py", "content": plugin}
        ).status
        == 200
    )
    call(influx3, "POST", "/api/v3/configure/database", body={"db": "gpulse"})
    for t in triggers(Edition.CORE):
        body = trigger("gpulse", t.specification, t.name, "gpulse_downsample.py") | {"trigger_arguments": t.arguments}
        r = call(influx3, "POST", "/api/v3/configure/processing_engine_trigger", body=body)
        assert r.status == 200, (t, r.text)


# -- InfluxQL: the retention policy is dropped -------------------------------------------------------------
def test_influxql_reads_the_raw_table_when_from_names_only_a_retention_policy(influx3):
    """``iox_query_influxql_rewrite`` ``resolve_dbrp``: ``"rp"."m"`` has no database, so ``db=`` is used as is."""
    write(influx3, "/write", "gpu,host=a util=10 60000000000", db="gpulse")
    write(influx3, "/write", "gpu,host=a util=99 60000000000", db="gpulse", rp="1h")

    def util(q: str, **params: str) -> list:
        r = call(influx3, "GET", "/query", params={"q": q, "epoch": "ns", **params})
        return [
            row[r.body["results"][0]["series"][0]["columns"].index("util")]
            for row in r.body["results"][0]["series"][0]["values"]
        ]

    assert util('SELECT * FROM "1h"."gpu"', db="gpulse") == [10.0]  # silently the raw table
    assert util('SELECT "util" FROM "gpu"', db="gpulse", rp="1h") == [10.0]  # rp= ignored too
    assert util('SELECT * FROM "gpulse"."1h"."gpu"', db="gpulse") == [99.0]  # db.rp -> database gpulse/1h
    assert util('SELECT * FROM "gpu"', db="gpulse/1h") == [99.0]


# -- InfluxQL: the statements gpulse report sends (support.influxql_v3) ---------------------------------------
def influxql(fake: FakeInfluxV3, q: str, db: str = "gpulse") -> dict:
    """The statement's result object (``series`` or ``error``) from ``/query`` with ``epoch=ns``."""
    r = call(fake, "GET", "/query", params={"q": q, "db": db, "epoch": "ns"})
    assert r.status == 200
    return r.body["results"][0]


STEPS = (
    f"train_step,run=r1,rank=0 step=1i,loss=2.0 {T0}\n"
    f"train_step,run=r1,rank=1 loss=1.5 {T0 + MINUTE}\n"  # no step field: not a first/last of "step"
    f"train_step,run=r1,rank=0 step=2i {T0 + 2 * MINUTE}\n"
    f"train_step,run=r2,rank=0 step=7i {T0 + 3 * MINUTE}\n"
)


def test_first_and_last_answer_the_selected_points_time_and_value(influx3):
    """P ``selectors_additional_fields_4``: ``time`` is the selected point's, over non-null values."""
    write(influx3, "/write", STEPS, db="gpulse")
    where = f"\"run\" = 'r1' AND time >= {T0} AND time < {T0 + 10 * MINUTE}"
    first = influxql(influx3, f'SELECT first("step") FROM "train_step" WHERE {where}')
    last = influxql(influx3, f'SELECT last("loss") FROM "train_step" WHERE {where}')
    assert first["series"] == [{"name": "train_step", "columns": ["time", "first"], "values": [[T0, 1]]}]
    assert last["series"][0]["values"] == [[T0 + MINUTE, 1.5]]
    assert influxql(influx3, f'SELECT last("step") FROM "train_step" WHERE {where}')["series"][0]["values"] == [
        [T0 + 2 * MINUTE, 2]
    ]
    # nothing matches: no series (__aggr_count > 0), not a row of nulls
    assert influxql(influx3, f'SELECT first("step") FROM "train_step" WHERE time >= {T0 + 4 * MINUTE}') == {
        "statement_id": 0
    }


def test_tag_conditions_and_or_lists_filter_rows_and_an_unknown_tag_matches_nothing(influx3):
    write(influx3, "/write", STEPS, db="gpulse")

    def steps(cond: str) -> list:
        series = influxql(influx3, f'SELECT "step" FROM "train_step" WHERE {cond}').get("series", [])
        return [v[1] for s in series for v in s["values"]]

    assert steps(f"(\"run\" = 'r1' OR \"run\" = 'r2') AND time >= {T0} AND time < {T0 + 10 * MINUTE}") == [1, 2, 7]
    assert steps(f"\"run\" = 'r2' AND time >= {T0} AND time <= {T0 + 3 * MINUTE}") == [7]
    assert steps(f"\"run\" = 'r2' AND time >= {T0} AND time < {T0 + 3 * MINUTE}") == []
    assert steps(f"\"host\" = 'a' AND time >= {T0}") == []  # no such tag: null, so no match
    star = influxql(influx3, f'SELECT * FROM "train_step" WHERE "rank" = \'1\' AND time >= {T0}')["series"][0]
    assert star["columns"] == ["time", "loss", "rank", "run", "step"]  # the wildcard: tags and fields by name
    assert star["values"] == [[T0 + MINUTE, 1.5, "1", "r1", None]]


def test_show_tag_values_lists_distinct_values_in_the_range_and_only_the_last_day_without_one(influx3):
    """P ``metadata_queries__show_tag_values_*``: columns key and value, sorted; the last day by default."""
    now = time.time_ns()
    old = now - 3 * 86_400 * 10**9
    write(
        influx3, "/write", f'train_run,run=old event="start" {old}\ntrain_run,run=new event="start" {now}', db="gpulse"
    )
    ranged = influxql(influx3, f'SHOW TAG VALUES FROM "train_run" WITH KEY = "run" WHERE time >= 0 AND time <= {now}')
    assert ranged["series"] == [
        {"name": "train_run", "columns": ["key", "value"], "values": [["run", "new"], ["run", "old"]]}
    ]
    assert influxql(influx3, 'SHOW TAG VALUES FROM "train_run" WITH KEY = "run"')["series"][0]["values"] == [
        ["run", "new"]
    ]
    assert "series" not in influxql(influx3, 'SHOW TAG VALUES FROM "train_run" WITH KEY = "host" WHERE time >= 0')


def test_a_tier_is_a_database_and_a_missing_one_or_measurement_answers_as_the_server(influx3):
    """``"db"."rp"."m"`` reads database ``db/rp``; one that does not exist is ``Database X not found`` in
    band (handler.rs ``plan_query``); a measurement the database lacks gives no series."""
    write(influx3, "/write", STEPS, db="gpulse/1m")
    tier = influxql(influx3, f'SELECT last("step") FROM "gpulse"."1m"."train_step" WHERE time >= {T0}')
    assert tier["series"][0]["values"] == [[T0 + 3 * MINUTE, 7]]
    assert influxql(influx3, 'SELECT * FROM "gpulse"."1h"."gpu" WHERE time >= 0') == {
        "statement_id": 0,
        "error": "Database gpulse/1h not found",
    }
    assert influxql(influx3, 'SELECT * FROM "gpulse"."1m"."gpu" WHERE time >= 0') == {"statement_id": 0}


def test_a_statement_outside_the_subset_is_an_in_band_error(influx3):
    write(influx3, "/write", STEPS, db="gpulse")
    answer = influxql(influx3, 'SELECT mean("step") FROM "train_step" GROUP BY time(1m)')
    assert "SHOW TAG VALUES and simple SELECTs only" in answer["error"]


# -- Parquet files: the 432-file query limit ------------------------------------------------------------------
def test_a_query_over_more_than_432_files_fails_and_the_error_prints_the_limit(influx3):
    """``influxdb3_write/src/write_buffer/mod.rs``: files per table in the query's range, limit 432 (Core)."""
    lines = "".join(f"gpu,host=a util=1 {T0 + b * 10 * MINUTE}\n" for b in range(433))
    write(influx3, "/api/v3/write_lp", lines, db="gpulse")
    assert influx3.snapshot() == 433  # one file per 10-minute block
    whole = call(influx3, "GET", "/query", params={"q": 'SELECT * FROM "gpu"', "db": "gpulse"})
    error = whole.body["results"][0]["error"]
    assert whole.status == 200 and error.startswith("Query would scan 432 Parquet files, exceeding the file limit")
    narrow = f'SELECT * FROM "gpu" WHERE time >= {T0} AND time < {T0 + 432 * 10 * MINUTE}'
    assert (
        len(
            call(influx3, "GET", "/query", params={"q": narrow, "db": "gpulse"}).body["results"][0]["series"][0][
                "values"
            ]
        )
        == 432
    )


def test_rewriting_a_block_adds_a_file_each_snapshot(influx3):
    for _ in range(3):
        write(influx3, "/api/v3/write_lp", f"gpu,host=a util=1 {T0 + MINUTE}\n", db="gpulse")
        influx3.snapshot()
    assert influx3.file_count("gpulse", "gpu") == 3
    assert influx3.file_count("gpulse", "gpu", T0 + 10 * MINUTE, T0 + 20 * MINUTE) == 0


@pytest.mark.parametrize("edition", list(Edition), ids=[e.value for e in Edition])
def test_the_plugins_1m_tier_collects_the_files_per_block_its_lookback_predicts(influx3, edition):
    """The generated plugin's scheduled runs, written through the stand-in's write path, one snapshot each."""
    plugin = load_plugin(REPO / "influxdb" / PLUGIN_PATH)
    minute = engine_tiers(edition)[0]
    lines = "".join(f"gpu,host=a util_gpu_pct={m % 7} {T0 + m * MINUTE}\n" for m in range(120))
    write(influx3, "/api/v3/write_lp", lines, db="gpulse")
    influx3.snapshot()
    block = T0 + 60 * MINUTE  # written by the runs scheduled in (block, block + 10 min + look-back)
    last = block + 10 * MINUTE + parse_duration(minute.lookback)
    for scheduled in range(T0 + 10 * MINUTE, last + 10 * MINUTE, 10 * MINUTE):
        tick = scheduled + MINUTE  # cron:0 1/10 * * * *
        influx3.engine.run_schedule(plugin, "gpulse", tick, {"tier": "1m", "edition": edition.value})
        influx3.snapshot()
    assert influx3.file_count("gpulse/1m", "gpu", block, block + 10 * MINUTE) == files_per_block(minute)
