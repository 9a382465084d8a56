"""The InfluxDB 2.9.1 stand-in answers as the server's code does, behaviour by behaviour.

Each test names the v2.9.1 source it holds the stand-in to (``influxdata/influxdb`` at tag v2.9.1).
They talk HTTP to it the way any client would, so a drift from the server's behaviour fails here
before it can make another test lie.
"""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from support.fake_influx_v2 import FakeInfluxV2
from support.fake_influx_v2_admin import FakeInfluxV2Admin

from gpulse.influx.downsample import TIERS, flux_task

T0 = 1_700_000_000_000_000_000


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


def call(
    fake: Any,
    method: str,
    path: str,
    *,
    token: str | None = "operator",
    params: dict[str, str] | None = None,
    body: Any = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    if token == "operator":
        token = fake.state.operator_token
    url = f"{fake.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Token {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, payload, hdrs = r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        status, payload, hdrs = e.code, e.read(), dict(e.headers)
    try:
        parsed = json.loads(payload) if payload.strip() else None
    except ValueError:
        parsed = payload.decode()
    return Answer(status, parsed, hdrs)


@pytest.fixture
def fake():
    with FakeInfluxV2Admin(org="gpulse") as f:
        yield f


def grant(fake: FakeInfluxV2Admin, *perms: tuple[str, str, str | None], org: bool = True) -> str:
    """A token with exactly these (action, resource type, resource id) permissions, in the org unless ``org=False``."""
    auth = call(
        fake,
        "POST",
        "/api/v2/authorizations",
        body={
            "orgID": fake.org_id,
            "permissions": [
                {
                    "action": a,
                    "resource": {"type": t, **({"orgID": fake.org_id} if org else {}), **({"id": i} if i else {})},
                }
                for a, t, i in perms
            ],
        },
    )
    assert auth.status == 201, auth.body
    return auth.body["token"]


def write(fake: Any, text: str | bytes, **params: str) -> Answer:
    p = {"org": "gpulse", "bucket": "gpulse", "precision": "ns"} | params
    raw = text.encode() if isinstance(text, str) else text
    return call(fake, "POST", "/api/v2/write", params={k: v for k, v in p.items() if v}, raw=raw)


# -- buckets: tenant/service_bucket.go, tenant/storage_bucket.go, paging.go -----------------------------
def test_a_bucket_looked_up_by_name_that_does_not_exist_is_a_404_not_an_empty_list(fake):
    a = call(fake, "GET", "/api/v2/buckets", params={"orgID": fake.org_id, "name": "gpulse_1m"})
    assert (a.status, a.body) == (404, {"code": "not found", "message": 'bucket "gpulse_1m" not found'})
    assert a.headers["X-Platform-Error-Code"] == "not found" and a.headers["X-Influxdb-Version"] == "v2.9.1"
    by_org_name = call(fake, "GET", "/api/v2/buckets", params={"org": "gpulse", "name": "nope"})
    assert by_org_name.status == 404
    no_org = call(fake, "GET", "/api/v2/buckets", params={"name": "nope"})  # ListBuckets: no org, name filtered
    assert (no_org.status, no_org.body["buckets"]) == (200, [])


@pytest.mark.parametrize("limit", ["0", "101", "-1"])
def test_bucket_lists_refuse_a_limit_outside_1_to_100(fake, limit):
    a = call(fake, "GET", "/api/v2/buckets", params={"orgID": fake.org_id, "limit": limit})
    assert (a.status, a.body["message"]) == (400, "limit must be between 1 and 100")


def test_bucket_lists_page_20_by_default_in_name_order_then_filter_by_permission(fake):
    for i in range(30):
        fake.add_bucket(f"b{i:02}", 7 * 86400)
    names = [b["name"] for b in call(fake, "GET", "/api/v2/buckets", params={"orgID": fake.org_id}).body["buckets"]]
    assert names == ["_monitoring", "_tasks"] + [f"b{i:02}" for i in range(18)]  # the org's name index
    reader = grant(fake, ("read", "buckets", fake.bucket("gpulse")["id"]))
    for limit in ("20", "100"):  # gpulse sorts after the 30 b.. buckets: outside a page that only filters after
        page = call(fake, "GET", "/api/v2/buckets", token=reader, params={"orgID": fake.org_id, "limit": limit})
        assert [b["name"] for b in page.body["buckets"]] == ([] if limit == "20" else ["gpulse"])
    lookup = call(fake, "GET", "/api/v2/buckets", token=reader, params={"orgID": fake.org_id, "name": "gpulse"})
    assert [b["name"] for b in lookup.body["buckets"]] == ["gpulse"]
    hidden = call(fake, "GET", "/api/v2/buckets", token=reader, params={"orgID": fake.org_id, "name": "b00"})
    assert (hidden.status, hidden.body["buckets"]) == (200, [])  # exists, not readable: filtered, not 401


def test_a_new_bucket_gets_the_shard_group_duration_of_its_retention(fake):
    for days, sgd in ((30, 86400), (400, 7 * 86400), (0, 7 * 86400), (1, 3600)):
        name = f"r{days}"
        body = {
            "orgID": fake.org_id,
            "name": name,
            "retentionRules": [{"type": "expire", "everySeconds": days * 86400}],
        }
        a = call(fake, "POST", "/api/v2/buckets", body=body)
        assert a.status == 201 and a.body["retentionRules"][0]["shardGroupDurationSeconds"] == sgd, a.body
    dup = call(fake, "POST", "/api/v2/buckets", body={"orgID": fake.org_id, "name": "r30"})
    assert (dup.status, dup.body["message"]) == (422, "bucket with name r30 already exists")
    under = call(fake, "POST", "/api/v2/buckets", body={"orgID": fake.org_id, "name": "_mine"})
    assert under.status == 400 and "may not start with underscore" in under.body["message"]


def test_shortening_a_retention_below_its_shard_group_duration_needs_a_new_one(fake):
    """storage/engine.go UpdateBucketRetentionPolicy, v1/services/meta/data.go UpdateRetentionPolicy."""
    raw = fake.bucket("gpulse")  # 30 d, 1 d shard groups (onboarding)
    path = f"/api/v2/buckets/{raw['id']}"
    refused = call(fake, "PATCH", path, body={"retentionRules": [{"type": "expire", "everySeconds": 43200}]})
    assert (refused.status, refused.body["message"]) == (
        422,
        "shard-group duration must also be updated to be smaller than new retention duration",
    )
    assert fake.bucket("gpulse")["retentionRules"][0]["everySeconds"] == 30 * 86400  # unchanged
    rule = {"type": "expire", "everySeconds": 43200, "shardGroupDurationSeconds": 3600}
    assert call(fake, "PATCH", path, body={"retentionRules": [rule]}).status == 200
    too_short = call(fake, "PATCH", path, body={"retentionRules": [{"type": "expire", "everySeconds": 1800}]})
    assert (too_short.status, too_short.body["message"]) == (500, "retention policy duration must be at least 1h0m0s")


# -- orgs: tenant/http_server_org.go, authorizer/authorize_find.go -------------------------------------
def test_an_org_is_404_by_unknown_name_and_hidden_from_a_token_that_may_not_read_it(fake):
    a = call(fake, "GET", "/api/v2/orgs", params={"org": "nope"})
    assert (a.status, a.body["message"]) == (404, 'organization name "nope" not found')
    reader = grant(fake, ("read", "buckets", None))
    assert call(fake, "GET", "/api/v2/orgs", token=reader, params={"org": "gpulse"}).body["orgs"] == []


# -- DBRPs: dbrp/service.go, dbrp/middleware_auth.go, dbrp/error.go ------------------------------------
def dbrp_body(fake, bucket: str, rp: str, default: bool = False, db: str = "gpulse") -> dict[str, Any]:
    return {
        "orgID": fake.org_id,
        "bucketID": fake.bucket(bucket)["id"],
        "database": db,
        "retention_policy": rp,
        "default": default,
    }


def test_a_duplicate_dbrp_mapping_is_422_and_the_first_of_a_database_is_its_default(fake):
    one_h = fake.add_bucket("gpulse_1h")
    first = call(fake, "POST", "/api/v2/dbrps", body=dbrp_body(fake, "gpulse_1h", "1h", default=False))
    assert first.status == 201 and first.body["default"] is True  # no default yet: this one is
    second = call(fake, "POST", "/api/v2/dbrps", body=dbrp_body(fake, "gpulse", "raw", default=False))
    assert second.status == 201 and second.body["default"] is False
    dup = call(fake, "POST", "/api/v2/dbrps", body=dbrp_body(fake, "gpulse", "1h"))
    assert (dup.status, dup.body) == (
        422,
        {"code": "conflict", "message": "another DBRP mapping with same orgID, db, and rp exists"},
    )
    takeover = call(fake, "POST", "/api/v2/dbrps", body=dbrp_body(fake, "gpulse", "raw2", default=True))
    mappings = {d["retention_policy"]: d["default"] for d in fake.dbrps()}
    assert takeover.status == 201 and mappings == {"1h": False, "raw": False, "raw2": True}
    assert one_h["id"] == first.body["bucketID"]
    no_org = call(fake, "GET", "/api/v2/dbrps")
    assert (no_org.status, no_org.body["message"]) == (400, "either 'org' or 'orgID' must be provided")


def test_creating_a_dbrp_mapping_needs_write_on_the_bucket_not_a_dbrp_permission(fake):
    raw_id = fake.bucket("gpulse")["id"]
    dbrp_only = grant(fake, ("write", "dbrp", None), ("read", "dbrp", None), ("read", "buckets", raw_id))
    a = call(fake, "POST", "/api/v2/dbrps", token=dbrp_only, body=dbrp_body(fake, "gpulse", "raw"))
    assert (a.status, a.body["message"]) == (401, f"write:orgs/{fake.org_id}/buckets/{raw_id} is unauthorized")
    bucket_writer = grant(fake, ("write", "buckets", raw_id), ("read", "buckets", raw_id))
    assert call(fake, "POST", "/api/v2/dbrps", token=bucket_writer, body=dbrp_body(fake, "gpulse", "raw")).status == 201


def test_a_virtual_mapping_is_hidden_only_by_a_real_mapping_of_the_same_database_and_rp(fake):
    def listed() -> set[tuple[str, str, bool, bool]]:
        a = call(fake, "GET", "/api/v2/dbrps", params={"orgID": fake.org_id, "db": "gpulse"})
        return {(d["database"], d["retention_policy"], d["default"], d["virtual"]) for d in a.body["content"]}

    assert listed() == {("gpulse", "autogen", True, True)}  # bucket "gpulse": db gpulse, rp autogen
    call(fake, "POST", "/api/v2/dbrps", body=dbrp_body(fake, "gpulse", "raw", default=True))
    assert listed() == {("gpulse", "raw", True, False), ("gpulse", "autogen", False, True)}  # still there
    call(fake, "POST", "/api/v2/dbrps", body=dbrp_body(fake, "gpulse", "autogen"))
    assert listed() == {("gpulse", "raw", True, False), ("gpulse", "autogen", False, False)}  # now hidden


# -- tasks: http/task_service.go, kv/task.go, task/options/options.go ----------------------------------
def post_task(fake, flux: str) -> Answer:
    return call(fake, "POST", "/api/v2/tasks", body={"orgID": fake.org_id, "flux": flux, "status": "active"})


GOOD = 'option task = {name: "t", every: 10m, offset: 1m}\nfrom(bucket: "gpulse") |> range(start: -1h)\n'


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (GOOD.replace("every: 10m", "every: 10x"), "expected an operator between two expressions"),
        (GOOD.replace("every: 10m", 'every: 10m, cron: "0 * * * *"'), "cannot use both cron and every"),
        (GOOD.replace("every: 10m", 'every: "10m"'), "failed to parse field 'every' in task options"),
        (GOOD.replace("every: 10m", "every: 500ms"), "every option must be at least 1 second"),
        (GOOD.replace('name: "t", ', ""), "missing required option: name"),
        (GOOD.replace("range(start: -1h)", "range(start: -1h"), "expected RPAREN"),  # far from the option
        ('from(bucket: "gpulse") |> range(start: -1h)\n', "no task options defined"),
    ],
    ids=["bad-duration", "every-and-cron", "string-every", "sub-second", "no-name", "syntax-elsewhere", "no-option"],
)
def test_task_options_are_validated_by_parsing_the_whole_script(fake, script, message):
    a = post_task(fake, script)
    assert a.status == 400 and a.body["message"].startswith("invalid options: ") and message in a.body["message"], (
        a.body
    )
    assert fake.state.tasks == {}


def test_a_task_takes_its_schedule_from_the_script_and_a_patch_is_checked_the_same_way(fake):
    created = post_task(fake, flux_task(TIERS[0]))
    assert created.status == 201, created.body
    t = created.body
    assert (t["name"], t["every"], t["offset"], t["status"]) == ("gpulse_raw_to_1m", "10m", "1m", "active")
    assert "latestCompleted" in t and "token" not in t
    bad = call(
        fake, "PATCH", f"/api/v2/tasks/{t['id']}", body={"flux": GOOD.replace("every: 10m", 'every: 10m, cron: "x"')}
    )
    assert bad.status == 400 and bad.body["message"].startswith("failed to update task: invalid options: ")
    broken = call(fake, "PATCH", f"/api/v2/tasks/{t['id']}", body={"flux": GOOD.replace("-1h)", "-1h")})
    assert broken.status == 500 and broken.body["message"].startswith("failed to update task: loc ")
    assert fake.task("gpulse_raw_to_1m")["flux"] == flux_task(TIERS[0])


@pytest.mark.parametrize("limit", ["0", "501", "x"])
def test_task_lists_refuse_a_bad_limit_with_a_400_as_every_decode_error(fake, limit):
    a = call(fake, "GET", "/api/v2/tasks", params={"orgID": fake.org_id, "limit": limit})
    assert a.status == 400 and a.body["message"].startswith("failed to decode request: "), a.body


def test_task_lists_default_to_100_and_without_an_org_show_only_the_callers_own(fake):
    for i in range(105):
        assert post_task(fake, GOOD.replace('"t"', f'"t{i}"')).status == 201
    assert len(call(fake, "GET", "/api/v2/tasks", params={"orgID": fake.org_id}).body["tasks"]) == 100
    assert len(call(fake, "GET", "/api/v2/tasks", params={"orgID": fake.org_id, "limit": "500"}).body["tasks"]) == 105
    other = grant(fake, ("read", "tasks", None), ("write", "tasks", None), ("read", "orgs", fake.org_id))
    assert len(call(fake, "GET", "/api/v2/tasks", token=other, params={"orgID": fake.org_id}).body["tasks"]) == 100
    # the same user (tokens created by the operator belong to the operator's user): own tasks
    assert len(call(fake, "GET", "/api/v2/tasks", token=other).body["tasks"]) == 100


# -- authorizations: authorization/http_server.go, storage_authorization.go ----------------------------
def test_a_token_is_in_the_creation_answer_only(fake):
    token = grant(fake, ("read", "buckets", None))
    assert token
    listed = call(fake, "GET", "/api/v2/authorizations", params={"orgID": fake.org_id}).body["authorizations"]
    assert {a["token"] for a in listed} == {""}  # hashed: 2.9 cannot show them again


def test_a_token_cannot_grant_a_permission_it_does_not_hold(fake):
    reader = grant(
        fake, ("read", "buckets", None), ("write", "authorizations", None), ("write", "users", None), org=False
    )
    body = {
        "orgID": fake.org_id,
        "permissions": [{"action": "write", "resource": {"type": "buckets", "orgID": fake.org_id}}],
    }
    a = call(fake, "POST", "/api/v2/authorizations", token=reader, body=body)
    assert a.status == 403 and a.body["message"].startswith(
        f"permission write:orgs/{fake.org_id}/buckets is not allowed"
    )


# -- writes: http/write_handler.go, http/points/points_parser.go, models/points.go ---------------------
def test_a_bad_line_rejects_the_whole_batch_and_the_message_names_every_bad_line(fake):
    lines = ["m,host=a v=1 1", "m,host=a 12345", "m,host=a v=1 2", "m,host=a v=tru 3", "m,host=a v=2 4"]
    a = write(fake, "\n".join(lines))
    assert a.status == 400
    assert a.body == {
        "code": "invalid",
        "message": "unable to parse 'm,host=a 12345': invalid field format\n"
        "unable to parse 'm,host=a v=tru 3': invalid boolean",
    }
    assert fake.points("gpulse") == {}  # nothing of the batch was written


def test_a_type_conflict_is_a_422_partial_write_with_the_good_points_written(fake):
    assert write(fake, f"m,host=a v=1i {T0}").status == 204
    a = write(fake, f"m,host=a v=2i {T0 + 1}\nm,host=a v=2.5 {T0 + 2}\nm,host=b v=3i {T0 + 3}")
    assert a.status == 422
    assert a.body["message"] == (
        'failure writing points to database: partial write: field type conflict: input field "v" on measurement '
        '"m" is type float, already exists as type integer dropped=1'
    )
    assert len(fake.points("gpulse")) == 3


def test_an_empty_write_body_is_a_204(fake):
    assert write(fake, "").status == 204
    assert write(fake, "\n# just a comment\n").status == 204


def test_precision_bucket_parameter_and_gzip_header_are_checked_before_the_org(fake):
    no_org = {"org": ""}
    assert (
        write(fake, "m v=1", precision="h", **no_org).status,
        write(fake, "m v=1", precision="h", **no_org).body,
    ) == (
        400,
        {"code": "invalid", "message": "invalid precision; valid precision units are ns, us, ms, and s"},
    )
    assert write(fake, "m v=1", bucket="", **no_org).body == {"code": "not found", "message": "bucket not found"}
    bad_gzip = call(
        fake,
        "POST",
        "/api/v2/write",
        params={"bucket": "gpulse"},
        raw=b"not gzip",
        headers={"Content-Encoding": "gzip"},
    )
    assert (bad_gzip.status, bad_gzip.body["message"]) == (500, "An internal error has occurred - check server logs")
    assert write(fake, "m v=1", **no_org).body == {"code": "invalid", "message": "Please provide either orgID or org"}
    assert write(fake, "m v=1", org="nope").body["message"] == 'organization name "nope" not found'
    assert write(fake, "m v=1", bucket="nope").body["message"] == 'bucket "nope" not found'


def test_a_token_that_may_not_write_the_bucket_is_403_after_the_org_and_bucket(fake):
    reader = grant(fake, ("read", "buckets", None))
    a = call(fake, "POST", "/api/v2/write", token=reader, params={"org": "gpulse", "bucket": "gpulse"}, raw=b"m v=1")
    assert (a.status, a.body["message"]) == (403, "insufficient permissions for write")
    assert call(fake, "POST", "/api/v2/write", token="nope", params={"bucket": "gpulse"}, raw=b"m v=1").status == 401


def test_a_batch_over_a_configured_limit_is_413_without_max_length_and_oss_sets_no_limit(fake):
    big = "\n".join(f"m,host=a v={i} {T0 + i}" for i in range(200))
    assert write(fake, gzip.compress(big.encode()), **{}).status == 400  # gzip without the header: parsed as text
    assert call(
        fake, "POST", "/api/v2/write", params={"org": "gpulse", "bucket": "gpulse"}, raw=gzip.compress(big.encode()),
        headers={"Content-Encoding": "gzip"},
    ).status == 204  # fmt: skip
    fake.max_body_bytes = 1000
    a = write(fake, big)
    assert (a.status, a.body) == (
        413,
        {"code": "request too large", "message": "unable to read data: points batch is too large"},
    )


def test_the_write_stand_in_never_answers_429_or_retry_after_unless_scripted_as_a_proxy():
    fake = FakeInfluxV2(token="t").start()
    try:
        answers = []
        for body in (b"m v=1", b"", b"bad", b"m v=1i\nm v=1.5", b"m v=1 99999999999999999999"):
            req = urllib.request.Request(
                f"{fake.url}/api/v2/write?org=gpulse&bucket=gpulse", data=body, headers={"Authorization": "Token t"}
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    answers.append((r.status, r.headers.get("Retry-After")))
            except urllib.error.HTTPError as e:
                answers.append((e.code, e.headers.get("Retry-After")))
        assert answers == [(204, None), (204, None), (400, None), (422, None), (400, None)]
        fake.push(429, headers={"Retry-After": "2"})  # what a proxy in front, or InfluxDB Cloud, may send
        req = urllib.request.Request(f"{fake.url}/api/v2/write?org=gpulse&bucket=gpulse", data=b"m v=1")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 429 and e.value.headers["Retry-After"] == "2"
    finally:
        fake.stop()


# -- onboarding: tenant/http_server_onboarding.go, tenant/service_onboarding.go ------------------------
def test_onboarding_creates_the_org_its_system_buckets_the_bucket_and_an_operator_token_once():
    with FakeInfluxV2Admin(onboarded=False) as fresh:
        assert call(fresh, "GET", "/api/v2/setup", token=None).body == {"allowed": True}
        assert call(fresh, "GET", "/api/v2/buckets", token="whatever").status == 401
        body = {"username": "admin", "password": "secret-pw", "org": "gpulse", "bucket": "gpulse",
                "retentionPeriodSeconds": 30 * 86400, "token": "op-token"}  # fmt: skip
        done = call(fresh, "POST", "/api/v2/setup", token=None, body=body)
        assert done.status == 201 and done.body["auth"]["token"] == "op-token"
        assert call(fresh, "GET", "/api/v2/setup", token=None).body == {"allowed": False}
        again = call(fresh, "POST", "/api/v2/setup", token=None, body=body)
        assert (again.status, again.body["message"]) == (422, "onboarding has already been completed")
        buckets = call(fresh, "GET", "/api/v2/buckets", token="op-token", params={"org": "gpulse"}).body["buckets"]
        assert {(b["name"], b["type"], b["retentionRules"][0]["everySeconds"]) for b in buckets} == {
            ("_monitoring", "system", 7 * 86400), ("_tasks", "system", 3 * 86400), ("gpulse", "user", 30 * 86400),
        }  # fmt: skip


def test_a_flux_query_needs_an_org_and_a_script_that_parses(fake):
    q = {"query": 'from(bucket: "gpulse") |> range(start: -1h)', "type": "flux"}
    no_org = call(fake, "POST", "/api/v2/query", body=q)
    assert (no_org.status, no_org.body["message"]) == (
        400,
        "failed to decode request body: Please provide either orgID or org",
    )
    assert call(fake, "POST", "/api/v2/query", params={"org": "gpulse"}, body=q).status == 200
    broken = call(fake, "POST", "/api/v2/query", params={"org": "gpulse"}, body={"query": q["query"][:-1]})
    assert broken.status == 400 and "expected RPAREN" in broken.body["message"]
    assert fake.state.queries == [q["query"]]


def test_a_flux_from_of_a_bucket_the_token_may_not_read_is_404_could_not_find_bucket(fake):
    """``query/bucket_lookup.go`` ``BucketLookup.Lookup``: the authorizing bucket service's refusal is "not found"."""
    own = call(fake, "POST", "/api/v2/buckets", body={"orgID": fake.org_id, "name": "own", "retentionRules": []})
    token = grant(fake, ("read", "buckets", own.body["id"]))
    query = {"query": 'from(bucket: "gpulse") |> range(start: -1h)', "type": "flux"}
    a = call(fake, "POST", "/api/v2/query", token=token, params={"org": "gpulse"}, body=query)
    assert (a.status, a.body["message"]) == (404, 'failed to initialize execute state: could not find bucket "gpulse"')
    query["query"] = 'from(bucket: "own") |> range(start: -1h)'
    assert call(fake, "POST", "/api/v2/query", token=token, params={"org": "gpulse"}, body=query).status == 200
    query["query"] = 'from(bucket: "nowhere") |> range(start: -1h)'
    assert call(fake, "POST", "/api/v2/query", params={"org": "gpulse"}, body=query).status == 404
