"""A stand-in for InfluxDB 2.9.1 OSS: the endpoints gpulse uses, as the server's code answers them.

No InfluxDB 2 can run here. This server follows ``influxdata/influxdb`` at tag v2.9.1, read
endpoint by endpoint; every behaviour below names the source file and function it comes from. It
must never be more lenient than the server where gpulse depends on the answer.

Shared by every endpoint: errors are ``{"code", "message"}`` with ``X-Platform-Error-Code`` and the
status of the code (``kit/transport/http/api.go`` ``API.Err``, ``kit/transport/http/error_handler.go``);
every answer carries ``X-Influxdb-Build: OSS`` and ``X-Influxdb-Version`` (``http/handler.go``); a
missing or unknown token is 401 ``unauthorized access`` except on ``/ping``, ``/health`` and
``/api/v2/setup`` (``http/authentication_middleware.go``, ``http/platform_handler.go``). Permissions are
matched as ``authz.go`` ``Permission.matchesV1`` does; a refused one reads ``<action>:<resource> is
unauthorized`` (``authorizer/authorize.go`` ``isAllowedAll``). List endpoints decode paging with
``paging.go`` ``DecodeFindOptions``: ``limit`` 1..100 (default 20), else 400 ``limit must be between 1
and 100``.

* ``GET /ping`` 204 (``http/legacy/ping_handler.go``); ``GET /health`` (``http/health.go`` ``HealthHandler``).
* ``/api/v2/setup`` GET ``{"allowed"}``; POST onboards: user, org (with the system buckets ``_tasks`` 3 d
  and ``_monitoring`` 7 d, ``tenant/service_org.go`` ``CreateOrganization``), the bucket, and an operator
  token with every permission (``tenant/service_onboarding.go`` ``onboardUser``, ``authz.go``
  ``OperPermissions``); a second POST is 422 ``onboarding has already been completed``.
* ``GET /api/v2/orgs`` (``tenant/http_server_org.go``): ``org=<name>`` unknown -> 404 ``organization name
  "X" not found``; orgs the token may not read are left out (``AuthorizeFindOrganizations``).
* ``/api/v2/buckets`` (``tenant/http_server_bucket.go``, ``tenant/service_bucket.go``,
  ``tenant/storage_bucket.go``, ``tenant/middleware_bucket_auth.go``, ``storage/bucket_service.go``):
  a name looked up in an org is 404 ``bucket "X" not found`` when absent (``FindBuckets`` ->
  ``GetBucketByName``), never an empty list; a list is paged first (an org's buckets in name order, all
  buckets in ID order) and then filtered by read permission, so a token sees at most ``limit``
  buckets of each page; system buckets need read on the org. POST: ``orgID`` required (400), write on
  the org's buckets (401), names starting with ``_`` refused (400), a duplicate name 422 ``bucket with
  name X already exists``, the shard-group duration set from the retention (``meta.NormalisedShardDuration``).
  PATCH: write on the bucket (401); a retention shorter than the current shard-group duration without a
  new one -> 422 ``shard-group duration must also be updated to be smaller than new retention
  duration`` (``storage/engine.go`` ``UpdateBucketRetentionPolicy``, ``v1/services/meta/data.go``
  ``UpdateRetentionPolicy``); a retention under 1 h -> 500 ``retention policy duration must be at least 1h0m0s``.
* ``/api/v2/dbrps`` (``dbrp/http_server_dbrp.go``, ``dbrp/service.go``, ``dbrp/middleware_auth.go``,
  ``dbrp/error.go``): ``org`` or ``orgID`` is required on every call but POST (400 ``either 'org' or
  'orgID' must be provided``); POST needs write on the *bucket* (no ``dbrp`` permission is checked); a
  duplicate (org, db, rp) is 422 ``another DBRP mapping with same orgID, db, and rp exists``; the first
  mapping of a database becomes its default whatever ``default`` says, and a new default takes over;
  unsetting the default, or deleting it, makes the first other mapping the default. GET adds every
  bucket's *virtual* mapping (db = bucket name, rp ``autogen``, id = bucket id), hidden only by a real
  mapping of the same database *and* retention policy, and not default when a real default exists.
* ``/api/v2/tasks`` (``http/task_service.go``, ``kv/task.go``, ``authorizer/task.go``,
  ``task/options/options.go``): GET ``limit`` 1..500 (default 100); a decode error of any kind is 400
  ``failed to decode request: ...``; without ``org``/``orgID`` only the caller's own tasks are listed.
  POST and PATCH parse the whole script with the Flux parser (``fluxlang.DefaultService.Parse``; the same
  Rust parser through ``support.flux_parser``) and take the options from ``option task`` as
  ``FromScriptAST`` does: a syntax error anywhere, ``every`` with ``cron``, a duration that is not a
  literal, ``every`` under 1 s or not whole seconds -> 400 ``invalid options: ...`` (POST) or ``failed to
  update task: invalid options: ...`` (PATCH; a syntax error there is 500, the parser's error not being a
  platform error). A refused permission is 500 ``failed to create task: unauthorized``. A task becomes
  due from its creation (``latestCompleted`` = now): the scheduler never runs it for the past.
* ``/api/v2/authorizations`` (``authorization/http_server.go``, ``authorization/middleware_auth.go``): the
  token only in the creation answer, ``""`` when listed (hashed tokens, the 2.9 default,
  ``authorization/storage_authorization.go``); the creator must hold every permission it grants (403
  ``permission X is not allowed``).
* ``POST /api/v2/query`` (``http/query_handler.go``): ``org``/``orgID`` required (400 ``failed to decode
  request body: Please provide either orgID or org``); the script is parsed, a syntax error is 400
  (``query/control/controller.go`` ``handleFluxError``). A ``from(bucket: "X")`` the token may not read,
  or that is not in the org, is 404 ``failed to initialize execute state: could not find bucket "X"``:
  the bucket lookup goes through the authorizing bucket service and takes any error as "not found"
  (``query/bucket_lookup.go`` ``BucketLookup.Lookup``, ``query/stdlib/influxdata/influxdb/source.go``),
  as read from the source, not seen on a 2.9.1 server.
* ``POST /api/v2/write``: :class:`support.fake_influx_v2.WriteAPI`.
* ``/query`` (InfluxQL, ``http/legacy/influxqld_handler.go``): the org comes from the token (``org`` is not
  read), ``db``/``rp`` resolve through the DBRP mappings (``v1/coordinator/statement_executor.go``) to the
  bucket, which 2.x stores as a 1.x database named by the bucket ID with retention policy ``autogen``
  (``storage/engine.go`` ``CreateBucket``).

Known differences: Flux is parsed, never executed (a query answers no tables; a task never runs);
InfluxQL and storage need a real InfluxDB 1.x as ``backend`` (the same engine 2.x embeds: each
bucket is the database ``<bucket id>``, retention policy ``autogen``); without one, points are kept
in memory and ``/query`` answers 501. Only the ``"db"."rp".`` source qualifiers and the ``db``/``rp``
parameters are translated. Cron expressions are not checked. Every request is logged in ``requests``.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import flux_parser
from .fake_influx_v2 import (
    VERSION,
    ApiError,
    MemoryStorage,
    Response,
    WriteAPI,
    is_id,
    send,
    token_of,
    unauthorized,
)
from .influx_points import Point

DAY, HOUR = 86400, 3600
#: authz.go AllResourceTypes without "instance" (OperPermissions grants read and write on each).
RESOURCE_TYPES = (
    "authorizations", "buckets", "dashboards", "orgs", "sources", "tasks", "telegrafs", "users", "variables",
    "scrapers", "secrets", "labels", "views", "documents", "notificationRules", "notificationEndpoints",
    "checks", "dbrp", "notebooks", "annotations", "remotes", "replications",
)  # fmt: skip
DEFAULT_PAGE, MAX_PAGE = 20, 100  # paging.go
TASK_DEFAULT_PAGE, TASK_MAX_PAGE = 100, 500  # task/taskmodel/task.go
DURATION_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
DURATION_NS |= {"d": 86400 * 10**9, "w": 7 * 86400 * 10**9, "mo": 30 * 86400 * 10**9, "y": 365 * 86400 * 10**9}


def new_id() -> str:
    while True:
        i = secrets.token_hex(8)
        if i != "0" * 16:
            return i


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def shard_group_seconds(retention_s: int) -> int:
    """``v1/services/meta/data.go`` ``shardGroupDuration``."""
    if retention_s == 0 or retention_s >= 180 * DAY:
        return 7 * DAY
    return DAY if retention_s >= 2 * DAY else HOUR


def normalised_shard_seconds(sgd_s: int, retention_s: int) -> int:
    """``v1/services/meta/data.go`` ``NormalisedShardDuration``."""
    if sgd_s == 0:
        return shard_group_seconds(retention_s)
    return shard_group_seconds(HOUR) if sgd_s < HOUR else sgd_s


# -- permissions (authz.go) -------------------------------------------------------------------------
def resource_string(rtype: str, rid: str | None, org: str | None) -> str:
    """``authz.go`` ``Resource.String``."""
    if org and rid:
        return f"orgs/{org}/{rtype}/{rid}"
    if org:
        return f"orgs/{org}/{rtype}"
    return f"{rtype}/{rid}" if rid else rtype


def matches(have: dict[str, Any], action: str, rtype: str, rid: str | None, org: str | None) -> bool:
    """``authz.go`` ``Permission.matchesV1``: does the permission ``have`` allow this one?"""
    res = have["resource"]
    if have["action"] != action:
        return False
    if res["type"] == "instance":
        return True
    if res["type"] != rtype:
        return False
    if not res.get("orgID") and not res.get("id"):
        return True
    if res.get("orgID") and not res.get("id") and org == res["orgID"]:
        return True
    return bool(res.get("id")) and rid == res["id"]


def allowed(auth: dict[str, Any], action: str, rtype: str, rid: str | None = None, org: str | None = None) -> bool:
    return any(matches(p, action, rtype, rid, org) for p in auth["permissions"])


def require(auth: dict[str, Any], action: str, rtype: str, rid: str | None = None, org: str | None = None) -> None:
    """``authorizer/authorize.go`` ``authorize``: 401 naming the permission that is missing."""
    if not allowed(auth, action, rtype, rid, org):
        raise ApiError("unauthorized", f"{action}:{resource_string(rtype, rid, org)} is unauthorized")


# -- Flux task options (task/options/options.go FromScriptAST) -------------------------------------
def _loc(node: dict[str, Any]) -> str:
    s, e = node["location"]["start"], node["location"]["end"]
    return f"{s['line']}:{s['column']}-{e['line']}:{e['column']}"


def flux_syntax_error(src: str) -> str | None:
    """The first error ``ast.Check`` finds, worded as ``ast.GetErrors`` wraps it (``loc L:C-L:C: msg``)."""
    for node, msg in flux_parser.errors(flux_parser.parse(src)):
        return f"loc {_loc(node)}: {msg}" if "location" in node else msg
    return None


def _duration_ns(node: dict[str, Any]) -> int:
    return sum(v["magnitude"] * DURATION_NS[v["unit"]] for v in node["values"])


def _format_duration(node: dict[str, Any]) -> str:
    """``parser.FormatDuration`` of a duration literal: its values as written (``1h30m``)."""
    return "".join(f"{v['magnitude']}{v['unit']}" for v in node["values"])


def _go_duration(ns: int) -> str:
    """``http/task_service.go`` ``customParseDuration`` for the task's ``offset``."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    h, rest = divmod(ns, 3600 * 10**9)
    m, rest = divmod(rest, 60 * 10**9)
    s = rest // 10**9
    return sign + (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s else "")


@dataclass
class TaskOptions:
    name: str
    every: str = ""
    cron: str = ""
    offset_ns: int = 0


def task_options(src: str) -> TaskOptions:
    """Options of a task script, or ``ValueError`` with the server's wording (after ``invalid options: ``)."""
    err = flux_syntax_error(src)
    if err:
        raise ValueError(err)
    tree = flux_parser.parse(src)
    found = flux_parser.options(tree, "task")
    if len(found) > 1:
        raise ValueError("multiple task options defined")
    if not found:
        raise ValueError("no task options defined")
    if found[0].get("type") != "ObjectExpression":
        raise ValueError(f'task option expected to be object literal, but found "{found[0].get("type")}"')
    props = flux_parser.properties(found[0])
    if "name" not in props:
        raise ValueError("missing required option: name")
    if props["name"].get("type") != "StringLiteral":
        raise ValueError("failed to parse field 'name' in task options")
    opts = TaskOptions(name=props["name"]["value"])
    if "cron" in props and "every" in props:
        raise ValueError("cannot use both cron and every in task options")
    if "cron" not in props and "every" not in props:
        raise ValueError("missing required option: cron or every")
    every_ns = 0
    if "cron" in props:
        if props["cron"].get("type") != "StringLiteral":
            raise ValueError("failed to parse field 'cron' in task options")
        opts.cron = props["cron"]["value"]
    else:
        if props["every"].get("type") != "DurationLiteral":
            raise ValueError("failed to parse field 'every' in task options")
        every_ns, opts.every = _duration_ns(props["every"]), _format_duration(props["every"])
    if "offset" in props:
        off = props["offset"]
        if off.get("type") == "UnaryExpression" and off["argument"].get("type") == "DurationLiteral":
            opts.offset_ns = -_duration_ns(off["argument"]) if off["operator"] == "-" else _duration_ns(off["argument"])
        elif off.get("type") == "DurationLiteral":
            opts.offset_ns = _duration_ns(off)
        else:
            raise ValueError("failed to parse field 'offset' in task options")
    for key in ("concurrency", "retry"):
        if key in props and props[key].get("type") != "IntegerLiteral":
            raise ValueError(f"failed to parse field '{key}' in task options")
    problems = []  # Options.Validate
    if opts.every:
        if every_ns < 10**9:
            problems.append("every option must be at least 1 second")
        elif every_ns % 10**9:
            problems.append("every option must be expressible as whole seconds")
    if opts.offset_ns % 10**9:
        problems.append("offset option must be expressible as whole seconds")
    for key, top in (("concurrency", 100), ("retry", 10)):
        if key in props:
            n = int(props[key]["value"])
            if n < 1:
                problems.append(f"{key} must be at least 1")
            elif n > top:
                problems.append(f"{key} exceeded max of {top}")
    if problems:
        raise ValueError("invalid options: " + ", ".join(problems))
    return opts


# -- the state ---------------------------------------------------------------------------------------
@dataclass
class Call:
    method: str
    path: str
    params: dict[str, str]
    status: int
    body: Any = None  # the request's JSON body, if any


@dataclass
class FakeState:
    org_name: str = "gpulse"
    operator_token: str = ""
    onboarded: bool = False
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    orgs: dict[str, dict[str, Any]] = field(default_factory=dict)
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)
    dbrps: dict[str, dict[str, Any]] = field(default_factory=dict)  # real mappings, without "default"
    dbrp_defaults: dict[tuple[str, str], str] = field(default_factory=dict)  # (orgID, db) -> mapping id
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # as the API renders them, plus "_type"
    auths: dict[str, dict[str, Any]] = field(default_factory=dict)  # with their tokens
    queries: list[str] = field(default_factory=list)


class FakeInfluxV2Admin(WriteAPI):
    """A threaded HTTP server on a free loopback port; ``with FakeInfluxV2Admin() as fake: fake.url``.

    ``onboarded=True`` onboards it as ``influx setup`` would (user ``admin``, org ``org``, bucket
    ``gpulse`` 30 d, a generated operator token in ``state.operator_token``); ``onboarded=False``
    leaves it empty for ``POST /api/v2/setup``. ``backend`` (a started ``support.influxd.InfluxDB1``)
    stores the points and answers InfluxQL.
    """

    def __init__(self, org: str = "gpulse", *, onboarded: bool = True, backend: Any = None) -> None:
        self.state = FakeState(org_name=org)
        self.requests: list[Call] = []
        self.lock = threading.RLock()
        self.backend = backend
        self.memory = MemoryStorage()
        if onboarded:
            self.onboard("admin", "admin-password", org, "gpulse", 30 * DAY, secrets.token_urlsafe(32))
        handler = type("Handler", (_Handler,), {"fake": self})
        self.server = _Server(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> FakeInfluxV2Admin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what tests read ------------------------------------------------------------------------
    @property
    def org_id(self) -> str:
        return next(iter(self.state.orgs))

    def writes(self) -> list[tuple[str, str]]:
        """Requests that change state (POST/PATCH/PUT/DELETE), except queries and point writes."""
        return [
            (c.method, c.path)
            for c in self.requests
            if c.method != "GET" and c.path not in ("/api/v2/query", "/api/v2/write", "/query")
        ]

    def bucket(self, name: str) -> dict[str, Any] | None:
        return next((b for b in self.state.buckets.values() if b["name"] == name), None)

    def task(self, name: str) -> dict[str, Any] | None:
        return next((t for t in self.state.tasks.values() if t["name"] == name), None)

    def dbrps(self) -> list[dict[str, Any]]:
        """The real mappings as the API renders them (with ``default``)."""
        return [self._render_dbrp(d) for d in self.state.dbrps.values()]

    def points(self, bucket: str) -> dict[str, str]:
        """What a bucket holds (in-memory storage): series + timestamp -> line."""
        b = self.bucket(bucket)
        return dict(self.memory.points.get(b["id"], {})) if b else {}

    def add_bucket(self, name: str, retention_s: int = 0, *, bucket_type: str = "user") -> dict[str, Any]:
        """A bucket created the way the bucket service creates one (as if someone else made it)."""
        with self.lock:
            return self._create_bucket(self.org_id, name, retention_s, 0, "", bucket_type)

    # -- onboarding (tenant/service_onboarding.go onboardUser) ----------------------------------
    def onboard(self, user: str, password: str, org: str, bucket: str, retention_s: int, token: str) -> dict[str, Any]:
        with self.lock:
            if self.state.onboarded:
                raise ApiError("conflict", "onboarding has already been completed")
            st = self.state
            uid, oid = new_id(), new_id()
            st.users[uid] = {"id": uid, "name": user, "status": "active"}
            st.orgs[oid] = {"id": oid, "name": org, "description": "", "createdAt": _now(), "updatedAt": _now()}
            self._create_bucket(oid, "_tasks", 3 * DAY, 0, "System bucket for task logs", "system")
            self._create_bucket(oid, "_monitoring", 7 * DAY, 0, "System bucket for monitoring logs", "system")
            b = self._create_bucket(oid, bucket, retention_s, 0, "", "user")
            perms = [{"action": a, "resource": {"type": t}} for t in RESOURCE_TYPES for a in ("read", "write")]
            auth = self._create_auth(oid, uid, f"{user}'s Token", perms, token)
            st.onboarded, st.operator_token, st.org_name = True, token, org
            return {"user": st.users[uid], "org": st.orgs[oid], "bucket": self._render_bucket(b), "auth": auth}

    # -- state changes shared by the handlers --------------------------------------------------
    def _create_bucket(self, org: str, name: str, retention_s: int, sgd_s: int, desc: str, btype: str) -> dict:
        sgd = normalised_shard_seconds(sgd_s, retention_s)  # storage/bucket_service.go CreateBucket
        b = {
            "id": new_id(), "orgID": org, "type": btype, "name": name, "description": desc,
            "retentionRules": [{"type": "expire", "everySeconds": retention_s, "shardGroupDurationSeconds": sgd}],
            "createdAt": _now(), "updatedAt": _now(),
        }  # fmt: skip
        if retention_s and retention_s < sgd:  # meta CreateRetentionPolicy: ErrIncompatibleDurations, plain error
            raise ApiError("internal error", "retention policy duration must be greater than the shard duration")
        self.state.buckets[b["id"]] = b
        if self.backend is not None:
            self.backend.query(
                f'CREATE DATABASE "{b["id"]}" WITH DURATION {retention_s or "INF"}'
                f'{"s" if retention_s else ""} SHARD DURATION {sgd}s NAME "autogen"'
            )
        return b

    def _create_auth(self, org: str, user: str, desc: str, perms: list[dict], token: str | None = None) -> dict:
        a = {
            "id": new_id(), "token": token or secrets.token_urlsafe(64), "status": "active", "description": desc,
            "orgID": org, "userID": user, "permissions": perms, "createdAt": _now(), "updatedAt": _now(),
        }  # fmt: skip
        self.state.auths[a["id"]] = a
        return self._render_auth(a, with_token=True)

    # -- rendering ------------------------------------------------------------------------------
    def _render_bucket(self, b: dict[str, Any]) -> dict[str, Any]:
        """``tenant/http_server_bucket.go`` ``NewBucketResponse``."""
        doc = {k: v for k, v in b.items() if not (k == "description" and not v)}
        doc["links"] = {
            "self": f"/api/v2/buckets/{b['id']}", "org": f"/api/v2/orgs/{b['orgID']}",
            "write": f"/api/v2/write?org={b['orgID']}&bucket={b['id']}",
        }  # fmt: skip
        doc["labels"] = []
        return doc

    def _render_dbrp(self, d: dict[str, Any]) -> dict[str, Any]:
        default = self.state.dbrp_defaults.get((d["orgID"], d["database"])) == d["id"]
        return {**d, "default": default, "virtual": False}

    def _render_auth(self, a: dict[str, Any], *, with_token: bool = False) -> dict[str, Any]:
        """``authorization/http_server.go`` ``newAuthResponse``; the token is ``""`` once stored hashed."""
        return {
            **{k: v for k, v in a.items() if k != "token"},
            "token": a["token"] if with_token else "",
            "org": self.state.orgs[a["orgID"]]["name"],
            "user": self.state.users[a["userID"]]["name"],
            "links": {"self": f"/api/v2/authorizations/{a['id']}", "user": f"/api/v2/users/{a['userID']}"},
        }

    def _render_task(self, t: dict[str, Any]) -> dict[str, Any]:
        """``http/task_service.go`` ``newTaskResponse`` (``NewFrontEndTask``: empty fields left out)."""
        doc = {k: v for k, v in t.items() if not k.startswith("_") and v not in ("", None)}
        doc["links"] = {
            k: f"/api/v2/tasks/{t['id']}{s}" for k, s in (("self", ""), ("runs", "/runs"), ("logs", "/logs"))
        }
        doc["labels"] = []
        return doc

    # -- WriteAPI (the write path is in support.fake_influx_v2) ---------------------------------
    def write_auth(self, token: str | None) -> dict[str, Any]:
        return self._auth_of(token)

    def write_org(self, org: str, org_id: str) -> dict[str, Any]:
        return self._org_of(org, org_id)

    def write_bucket(self, org: dict[str, Any], bucket: str) -> str:
        """``WriteHandler.findBucket``: an ID first, then a name in the org."""
        b = self.state.buckets.get(bucket)
        if b is None or b["orgID"] != org["id"]:
            b = next((x for x in self.state.buckets.values() if x["orgID"] == org["id"] and x["name"] == bucket), None)
        if b is None:
            raise ApiError("not found", f'bucket "{bucket}" not found')
        return b["id"]

    def may_write(self, auth: dict[str, Any], org: dict[str, Any], bucket: str) -> bool:
        return allowed(auth, "write", "buckets", bucket, org["id"])  # checkBucketWritePermissions

    def store(self, bucket: str, points: list[Point]) -> tuple[int, str]:
        if self.backend is None:
            with self.lock:
                return self.memory.write(bucket, points)
        return self._backend_write(bucket, points)

    def _backend_write(self, bucket: str, points: list[Point]) -> tuple[int, str]:
        body = "".join(f"{p.head} {p.time_ns}\n" for p in points)
        req = urllib.request.Request(
            f"{self.backend.url}/write?db={bucket}&rp=autogen&precision=n", data=body.encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=30):
                return 0, ""
        except urllib.error.HTTPError as e:
            message = json.loads(e.read() or b"{}").get("error", "")
            if "partial write:" in message:  # the same tsdb engine: "partial write: <reason> dropped=N"
                reason, _, dropped = message.split("partial write: ", 1)[1].rpartition(" dropped=")
                return int(dropped), reason
            raise ApiError("internal error", f"unexpected error writing points to database: {message}") from None

    # -- lookups shared by the handlers --------------------------------------------------------
    def _auth_of(self, token: str | None) -> dict[str, Any]:
        a = next((a for a in self.state.auths.values() if token is not None and a["token"] == token), None)
        if a is None or a["status"] != "active":
            raise unauthorized()
        return a

    def _org_of(self, org: str, org_id: str) -> dict[str, Any]:
        """``http/requests.go`` ``queryOrganization``: ``org`` is an ID or a name, ``orgID`` an ID."""
        if org_id:
            if not is_id(org_id):
                raise ApiError("invalid", "invalid ID")
            o = self.state.orgs.get(org_id)
            if o is None:
                raise ApiError("not found", "organization not found")
            return o
        if not org:
            raise ApiError("invalid", "Please provide either orgID or org")
        if is_id(org) and org in self.state.orgs:
            return self.state.orgs[org]
        o = next((o for o in self.state.orgs.values() if o["name"] == org), None)
        if o is None:
            raise ApiError("not found", f'organization name "{org}" not found')
        return o

    # -- dispatch -------------------------------------------------------------------------------
    def handle(self, method: str, path: str, params: dict[str, str], headers: Any, raw: bytes) -> Response:
        try:
            if path == "/ping" and method in ("GET", "HEAD"):
                return Response(204)
            if path == "/health":
                return Response(
                    200,
                    (
                        '{"name":"influxdb", "message":"ready for queries and writes", "status":"pass", "checks":[], '
                        f'"version": "{VERSION}", "commit": "stand-in"}}\n'
                    ).encode(),
                )
            if path == "/api/v2/setup":
                return self._setup(method, raw)
            if path == "/api/v2/write" and method == "POST":
                return self.write(params, headers, raw)
            auth = self._auth_of(token_of(headers))
            if path == "/query":
                return self._influxql(auth, params, raw, headers)
            parts = path.split("/")
            if parts[:3] != ["", "api", "v2"] or len(parts) < 4:
                raise ApiError("not found", "path not found")
            body = json.loads(raw) if raw and method in ("POST", "PATCH", "PUT") and parts[3] != "query" else None
            if parts[3] in self.COLLECTIONS:
                with self.lock:
                    return self._collection(parts[3], method, parts[4:], params, auth, body)
            endpoint = getattr(self, f"_ep_{parts[3]}", None)
            if endpoint is None:
                raise ApiError("not found", "path not found")
            with self.lock:
                return endpoint(method, parts[4:], params, auth, body if body is not None else raw)
        except ApiError as e:
            return Response.error(e)
        except json.JSONDecodeError as e:
            return Response.error(ApiError("invalid", f"failed to unmarshal json: {e}"))

    # -- /api/v2/setup --------------------------------------------------------------------------
    def _setup(self, method: str, raw: bytes) -> Response:
        if method == "GET":
            return Response(200, {"allowed": not self.state.onboarded})
        if method != "POST":
            raise ApiError("method not allowed", "method not allowed")
        req = json.loads(raw or b"{}")
        for key, what in (("username", "username"), ("org", "org name"), ("bucket", "bucket name")):
            if not req.get(key):
                raise ApiError("empty value", f"{what} is empty")  # onboarding.go OnboardingRequest.Valid
        result = self.onboard(
            req["username"], req.get("password", ""), req["org"], req["bucket"],
            int(req.get("retentionPeriodSeconds") or 0), req.get("token") or secrets.token_urlsafe(64),
        )  # fmt: skip
        return Response(201, result)

    #: collections served as ``GET /``, ``POST /``, ``GET /{id}``, ``PATCH /{id}`` (any other method: 405)
    COLLECTIONS = {
        "buckets": ("_find_buckets", "_post_bucket", "_get_bucket", "_patch_bucket"),
        "tasks": ("_find_tasks", "_post_task", "_get_task", "_patch_task"),
    }

    def _collection(
        self, name: str, method: str, rest: list[str], q: dict[str, str], auth: dict, body: Any
    ) -> Response:
        find, create, read, update = (getattr(self, f) for f in self.COLLECTIONS[name])
        if not rest and method == "GET":
            return Response(200, {"links": {"self": f"/api/v2/{name}"}, name: find(auth, q)})
        if not rest and method == "POST":
            return create(auth, body or {})
        if len(rest) == 1 and method == "GET":
            return read(auth, rest[0])
        if len(rest) == 1 and method == "PATCH":
            return update(auth, rest[0], body or {})
        raise ApiError("method not allowed", "method not allowed")

    # -- /api/v2/orgs ---------------------------------------------------------------------------
    def _ep_orgs(self, method: str, rest: list[str], q: dict[str, str], auth: dict, body: Any) -> Response:
        if method != "GET" or rest:
            raise ApiError("method not allowed", "method not allowed")
        limit, offset = find_options(q)
        if q.get("org"):
            found = [o for o in self.state.orgs.values() if o["name"] == q["org"]]
            if not found:
                raise ApiError("not found", f'organization name "{q["org"]}" not found')
        else:
            found = list(self.state.orgs.values())[offset : offset + limit]
        visible = [o for o in found if allowed(auth, "read", "orgs", o["id"])]  # AuthorizeFindOrganizations
        return Response(200, {"links": {"self": "/api/v2/orgs"}, "orgs": visible})

    # -- /api/v2/buckets ------------------------------------------------------------------------
    def _get_bucket(self, auth: dict, bucket_id: str) -> Response:
        b = self.state.buckets.get(bucket_id)
        if b is None:
            raise ApiError("not found", "bucket not found")
        self._require_read_bucket(auth, b)
        return Response(200, self._render_bucket(b))

    def _require_read_bucket(self, auth: dict, b: dict) -> None:
        """``authorizer/authorize.go`` ``AuthorizeReadBucket``: a system bucket needs read on its org."""
        if b["type"] == "system":
            require(auth, "read", "orgs", b["orgID"])
        else:
            require(auth, "read", "buckets", b["id"], b["orgID"])

    def _find_buckets(self, auth: dict, q: dict[str, str]) -> list[dict[str, Any]]:
        limit, offset = find_options(q)
        org_id = q.get("orgID")
        if org_id and not is_id(org_id):
            raise ApiError("invalid", "invalid ID")
        if not org_id and q.get("org"):
            org_id = self._org_of(q["org"], "")["id"]
        st = self.state
        if q.get("id"):
            b = st.buckets.get(q["id"])
            if b is None:
                raise ApiError("not found", "bucket not found")
            page = [b]
        elif q.get("name") and org_id:  # GetBucketByName: absent is an error, not an empty list
            page = [b for b in st.buckets.values() if b["orgID"] == org_id and b["name"] == q["name"]]
            if not page:
                raise ApiError("not found", f'bucket "{q["name"]}" not found')
        elif org_id:  # listBucketsByOrg: the org's name index, then offset/after/limit
            ordered = sorted((b for b in st.buckets.values() if b["orgID"] == org_id), key=lambda b: b["name"].encode())
            page = _page(ordered, limit, offset, q.get("after"))
        else:  # ListBuckets: every bucket in ID order; offset counts all, the name filter applies after it
            ordered = sorted(st.buckets.values(), key=lambda b: b["id"])[offset:]
            if q.get("name"):
                ordered = [b for b in ordered if b["name"] == q["name"]]
            page = ordered[:limit]
        out = []
        for b in page:  # AuthorizeFindBuckets: filtered after paging
            try:
                self._require_read_bucket(auth, b)
            except ApiError:
                continue
            out.append(self._render_bucket(b))
        return out

    def _post_bucket(self, auth: dict, body: dict[str, Any]) -> Response:
        org = body.get("orgID") or ""
        if not is_id(org):
            raise ApiError("invalid", "organization id must be provided")
        rules = body.get("retentionRules") or []
        if len(rules) > 1:
            raise ApiError("unprocessable entity", "buckets cannot have more than one retention rule at this time")
        every = int(rules[0].get("everySeconds") or 0) if rules else 0
        sgd = int(rules[0].get("shardGroupDurationSeconds") or 0) if rules else 0
        if every < 0:
            raise ApiError("unprocessable entity", "expiration seconds cannot be negative")
        if sgd < 0:
            raise ApiError("unprocessable entity", "shard-group duration seconds cannot be negative")
        require(auth, "write", "buckets", None, org)  # AuthorizeCreate
        name = body.get("name") or ""
        if name.startswith("_"):
            raise ApiError("invalid", f"bucket name {name} is invalid. Buckets may not start with underscore")
        if '"' in name:
            raise ApiError("invalid", f"bucket name {name} is invalid. Bucket names may not include quotation marks")
        if org not in self.state.orgs:
            raise ApiError("not found", "organization not found")
        if any(b["orgID"] == org and b["name"] == name for b in self.state.buckets.values()):
            raise ApiError("conflict", f"bucket with name {name} already exists")
        b = self._create_bucket(org, name, every, sgd, body.get("description") or "", "user")
        return Response(201, self._render_bucket(b))

    def _patch_bucket(self, auth: dict, bucket_id: str, body: dict[str, Any]) -> Response:
        b = self.state.buckets.get(bucket_id)
        if b is None:
            raise ApiError("not found", "bucket not found")
        require(auth, "write", "buckets", bucket_id, b["orgID"])
        rules = body.get("retentionRules") or []
        rule = b["retentionRules"][0]
        every = rules[0].get("everySeconds") if rules else None
        sgd = rules[0].get("shardGroupDurationSeconds") if rules else None
        if every is not None and every != 0 and every < HOUR:  # meta UpdateRetentionPolicy: a plain error
            raise ApiError("internal error", "retention policy duration must be at least 1h0m0s")
        current_sgd = rule["shardGroupDurationSeconds"]
        if (every and ((sgd is not None and every < sgd) or (sgd is None and every < current_sgd))) or (
            every is None and rule["everySeconds"] > 0 and sgd is not None and rule["everySeconds"] < sgd
        ):
            raise ApiError(
                "unprocessable entity",
                "shard-group duration must also be updated to be smaller than new retention duration",
            )
        name = body.get("name")
        if name is not None and name != b["name"]:
            if b["type"] == "system":
                raise ApiError("invalid", "system buckets cannot be renamed")
            if any(x["orgID"] == b["orgID"] and x["name"] == name for x in self.state.buckets.values()):
                raise ApiError("conflict", "bucket name is not unique")
            b["name"] = name
        if body.get("description") is not None:
            b["description"] = body["description"]
        if every is not None:
            rule["everySeconds"] = every
        if sgd is not None:
            rule["shardGroupDurationSeconds"] = sgd  # the tenant store keeps it as sent
        b["updatedAt"] = _now()
        if self.backend is not None and (every is not None or sgd is not None):
            self.backend.query(
                f'ALTER RETENTION POLICY "autogen" ON "{bucket_id}" DURATION {rule["everySeconds"] or "INF"}'
                f"{'s' if rule['everySeconds'] else ''} SHARD DURATION "
                f"{normalised_shard_seconds(rule['shardGroupDurationSeconds'], rule['everySeconds'])}s"
            )
        return Response(200, self._render_bucket(b))

    # -- /api/v2/dbrps --------------------------------------------------------------------------
    def _dbrp_org(self, q: dict[str, str]) -> str:
        """``mustGetOrgIDFromHTTPRequest``."""
        if q.get("orgID"):
            if not is_id(q["orgID"]):
                raise ApiError("invalid", f'invalid org ID "{q["orgID"]}"')
            return q["orgID"]
        if not q.get("org"):
            raise ApiError("invalid", "either 'org' or 'orgID' must be provided")
        o = next((o for o in self.state.orgs.values() if o["name"] == q["org"]), None)
        if o is None:
            raise ApiError("not found", f'invalid org "{q["org"]}"')
        return o["id"]

    def _ep_dbrps(self, method: str, rest: list[str], q: dict[str, str], auth: dict, body: Any) -> Response:
        st = self.state
        if method == "POST" and not rest:
            return self._post_dbrp(auth, body or {})
        org = self._dbrp_org(q)
        if method == "GET" and not rest:
            return Response(200, {"content": self._find_dbrps(auth, org, q)})
        if len(rest) != 1:
            raise ApiError("method not allowed", "method not allowed")
        d = self._dbrp_by_id(auth, org, rest[0])
        if method == "GET":
            return Response(200, {"content": d})
        if method == "PATCH":
            require(auth, "write", "buckets", d["bucketID"], org)
            body = body or {}
            real = st.dbrps.get(d["id"])
            if real is None:
                raise ApiError("not found", "unable to find DBRP")
            rp = body.get("retention_policy", real["retention_policy"])
            if any(
                x["id"] != real["id"]
                and x["orgID"] == org
                and x["database"] == real["database"]
                and x["retention_policy"] == rp
                for x in st.dbrps.values()
            ):
                raise ApiError("conflict", "another DBRP mapping with same orgID, db, and rp exists")
            real["retention_policy"] = rp
            key = (org, real["database"])
            if body.get("default") is True:
                st.dbrp_defaults[key] = real["id"]
            elif body.get("default") is False and st.dbrp_defaults.get(key) == real["id"]:
                other = self._first_mapping_but(key, real["id"])  # dbrp/service.go Update: the first other one
                if other:
                    st.dbrp_defaults[key] = other
            return Response(200, {"content": self._render_dbrp(real)})
        if method == "DELETE":
            require(auth, "write", "buckets", d["bucketID"], org)
            real = st.dbrps.pop(d["id"], None)
            if real is not None:
                key = (org, real["database"])
                if st.dbrp_defaults.get(key) == real["id"]:
                    other = self._first_mapping_but(key, real["id"])
                    if other:
                        st.dbrp_defaults[key] = other
                    else:
                        del st.dbrp_defaults[key]
            return Response(204)
        raise ApiError("method not allowed", "method not allowed")

    def _first_mapping_but(self, key: tuple[str, str], skip: str) -> str | None:
        """``dbrp/service.go`` ``getFirstBut``: the org+db index is ordered by mapping ID."""
        ids = sorted(
            d["id"] for d in self.state.dbrps.values() if (d["orgID"], d["database"]) == key and d["id"] != skip
        )
        return ids[0] if ids else None

    def _dbrp_by_id(self, auth: dict, org: str, dbrp_id: str) -> dict[str, Any]:
        """``Service.FindByID`` (a bucket ID finds its virtual mapping) behind ``AuthorizedService.FindByID``."""
        if not is_id(dbrp_id):
            raise ApiError("invalid", "invalid ID")
        d = self.state.dbrps.get(dbrp_id)
        if d is not None and d["orgID"] == org:
            mapping = self._render_dbrp(d)
        elif dbrp_id in self.state.buckets:
            mapping = _virtual(self.state.buckets[dbrp_id])
        else:
            raise ApiError("not found", "unable to find DBRP")
        require(auth, "read", "buckets", mapping["bucketID"], org)
        return mapping

    def _find_dbrps(self, auth: dict, org: str, q: dict[str, str]) -> list[dict[str, Any]]:
        """``dbrp/service.go`` ``FindMany`` behind ``AuthorizedService.FindMany``."""
        real = [
            self._render_dbrp(d) for d in sorted(self.state.dbrps.values(), key=lambda d: d["id"]) if d["orgID"] == org
        ]
        out = list(real)
        readable = [
            b for b in sorted(self.state.buckets.values(), key=lambda b: b["name"].encode()) if b["orgID"] == org
        ]
        for b in readable:
            if not _readable(auth, b):  # the virtual mappings come from an authorizing bucket service
                continue
            v = _virtual(b)
            if any(m["database"] == v["database"] and m["retention_policy"] == v["retention_policy"] for m in real):
                continue
            if any(m["database"] == v["database"] and m["default"] for m in real):
                v["default"] = False
            out.append(v)
        want = {k: q[k] for k in ("id", "bucketID", "db", "rp") if q.get(k)}
        if q.get("default"):
            if q["default"].lower() not in ("true", "false", "1", "0", "t", "f"):
                raise ApiError("invalid", "invalid default parameter")
            want["default"] = q["default"].lower() in ("true", "1", "t")
        key = {"id": "id", "bucketID": "bucketID", "db": "database", "rp": "retention_policy", "default": "default"}
        out = [m for m in out if all(m[key[k]] == v for k, v in want.items())]
        return [m for m in out if allowed(auth, "read", "buckets", m["bucketID"], m["orgID"])]  # AuthorizeFindDBRPs

    def _post_dbrp(self, auth: dict, body: dict[str, Any]) -> Response:
        st = self.state
        if body.get("orgID"):
            if not is_id(body["orgID"]):
                raise ApiError("invalid", f'invalid org ID "{body["orgID"]}"')
            org = body["orgID"]
        elif body.get("org"):
            o = next((o for o in st.orgs.values() if o["name"] == body["org"]), None)
            if o is None:
                raise ApiError("not found", f'invalid org "{body["org"]}"')
            org = o["id"]
        else:
            raise ApiError("invalid", "either 'org' or 'orgID' must be provided")
        bucket = body.get("bucketID") or ""
        if not is_id(bucket):
            raise ApiError("invalid", f'invalid bucket ID "{bucket}"')
        require(auth, "write", "buckets", bucket, org)  # dbrp/middleware_auth.go Create: write on the bucket
        db, rp = body.get("database") or "", body.get("retention_policy") or ""
        for value, what in ((db, "database"), (rp, "retentionPolicy")):
            if not value or any(not (c.isalnum() or c in "_-.") for c in value):
                raise ApiError(
                    "invalid",
                    f"DBRP provided is invalid: {what} must contain at least one character and only be letters, "
                    "numbers, '_', '-', and '.'",
                )
        b = st.buckets.get(bucket)
        if b is None:
            raise ApiError("not found", "bucket not found")
        self._require_read_bucket(auth, b)
        if any(d["orgID"] == org and d["database"] == db and d["retention_policy"] == rp for d in st.dbrps.values()):
            raise ApiError("conflict", "another DBRP mapping with same orgID, db, and rp exists")
        d = {"id": new_id(), "database": db, "retention_policy": rp, "orgID": org, "bucketID": bucket}
        st.dbrps[d["id"]] = d
        if (org, db) not in st.dbrp_defaults or body.get("default"):  # the first mapping of a db is its default
            st.dbrp_defaults[(org, db)] = d["id"]
        return Response(201, self._render_dbrp(d))

    # -- /api/v2/tasks --------------------------------------------------------------------------
    def _get_task(self, auth: dict, task_id: str) -> Response:
        t = self.state.tasks.get(task_id)
        if t is None:
            raise ApiError("not found", "failed to find task: task not found")
        require(auth, "read", "tasks", t["id"], t["orgID"])
        return Response(200, self._render_task(t))

    def _find_tasks(self, auth: dict, q: dict[str, str]) -> list[dict[str, Any]]:
        def bad(why: str) -> ApiError:
            return ApiError("invalid", f"failed to decode request: {why}")  # handleGetTasks wraps every decode error

        org_id = None
        if q.get("org"):
            o = next((o for o in self.state.orgs.values() if o["name"] == q["org"]), None)
            if o is None:
                raise bad(f"org {q['org']} not found or unauthorized")
            org_id = o["id"]
        if q.get("orgID"):
            if not is_id(q["orgID"]):
                raise bad("invalid ID")
            org_id = q["orgID"]
        limit = TASK_DEFAULT_PAGE
        if q.get("limit"):
            try:
                limit = int(q["limit"])
            except ValueError:
                raise bad(f'strconv.Atoi: parsing "{q["limit"]}": invalid syntax') from None
            if not 1 <= limit <= TASK_MAX_PAGE:
                raise bad(f"limit must be between 1 and {TASK_MAX_PAGE}")
        kind = q.get("type", "")
        if kind not in ("", "system", "basic"):
            raise bad(f'"{kind}" is not a valid task type')
        user = auth["userID"] if org_id is None else None  # kv/task.go findTasks: the caller's own tasks
        found = []
        for t in sorted(self.state.tasks.values(), key=lambda t: t["id"]):
            if org_id is not None and t["orgID"] != org_id:
                continue
            if user is not None and t["ownerID"] != user:
                continue
            if q.get("name") and t["name"] != q["name"]:
                continue
            if q.get("status") in ("active", "inactive") and t["status"] != q["status"]:
                continue
            found.append(t)
            if len(found) >= limit:
                break
        return [self._render_task(t) for t in found if allowed(auth, "read", "tasks", t["id"], t["orgID"])]

    def _post_task(self, auth: dict, body: dict[str, Any]) -> Response:
        def bad(why: str) -> ApiError:
            return ApiError("invalid", f"failed to decode request: {why}")

        flux, status = body.get("flux") or "", body.get("status") or ""
        if not flux:
            raise bad("missing flux")  # TaskCreate.Validate
        if not body.get("orgID") and not body.get("org"):
            raise bad("missing orgID and org")
        if status not in ("", "active", "inactive"):
            raise bad(f'invalid task status: "{status}"')
        org = self._org_of("", body["orgID"]) if body.get("orgID") else self._org_of(body["org"], "")
        if not allowed(auth, "write", "tasks", None, org["id"]):  # authorizer/task.go: authError, not a platform error
            raise ApiError("internal error", "failed to create task: unauthorized")
        try:
            opts = task_options(flux)
        except ValueError as e:
            raise ApiError("invalid", f"invalid options: {e}") from None  # taskmodel.ErrTaskOptionParse
        created = datetime.now(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        t = {
            "id": new_id(), "orgID": org["id"], "org": org["name"], "ownerID": auth["userID"], "name": opts.name,
            "description": body.get("description") or "", "status": status or "active", "flux": flux,
            "every": opts.every, "cron": opts.cron, "offset": _go_duration(opts.offset_ns) if opts.offset_ns else "",
            "latestCompleted": created, "createdAt": created, "updatedAt": "", "_type": "system",
        }  # fmt: skip
        self.state.tasks[t["id"]] = t
        return Response(201, self._render_task(t))

    def _patch_task(self, auth: dict, task_id: str, body: dict[str, Any]) -> Response:
        def bad(why: str) -> ApiError:
            return ApiError("invalid", f"failed to decode request: {why}")

        if body.get("every") and body.get("cron"):
            raise bad("cannot specify both every and cron")  # TaskUpdate.Validate
        if not any(body.get(k) is not None for k in ("flux", "status", "name", "every", "cron", "offset")):
            raise bad("cannot update task without content")
        if body.get("status") is not None and body["status"] not in ("active", "inactive"):
            raise bad(f'invalid task status: "{body["status"]}"')
        t = self.state.tasks.get(task_id)
        if t is None:
            raise ApiError("not found", "failed to update task: task not found")
        if not allowed(auth, "write", "tasks", t["id"], t["orgID"]):
            raise ApiError("internal error", "failed to update task: unauthorized")
        if body.get("flux"):
            err = flux_syntax_error(body["flux"])
            if err:  # UpdateFlux -> safeParseSource: the parser's error is not a platform error
                raise ApiError("internal error", f"failed to update task: {err}")
            try:
                opts = task_options(body["flux"])
            except ValueError as e:
                raise ApiError("invalid", f"failed to update task: invalid options: {e}") from None
            t.update(flux=body["flux"], name=opts.name, every=opts.every, cron=opts.cron)
            t["offset"] = _go_duration(opts.offset_ns) if opts.offset_ns else ""
            t["updatedAt"] = _now()
        if body.get("description") is not None:
            t["description"] = body["description"]
        if body.get("status") is not None and body["status"] != t["status"]:
            t["status"] = body["status"]
            t["updatedAt"] = _now()
            if t["status"] == "active":  # kv/task.go updateTask: inactive -> active skips the missed runs
                t["latestCompleted"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return Response(200, self._render_task(t))

    # -- /api/v2/authorizations -----------------------------------------------------------------
    def _ep_authorizations(self, method: str, rest: list[str], q: dict[str, str], auth: dict, body: Any) -> Response:
        st = self.state
        if method == "GET" and not rest:
            org = q.get("orgID") or (self._org_of(q["org"], "")["id"] if q.get("org") else None)
            found = [
                a for a in st.auths.values()
                if (org is None or a["orgID"] == org) and (not q.get("userID") or a["userID"] == q["userID"])
                and (not q.get("id") or a["id"] == q["id"])
                and allowed(auth, "read", "authorizations", a["id"], a["orgID"])
                and allowed(auth, "read", "users", a["userID"])
            ]  # fmt: skip
            return Response(
                200,
                {"links": {"self": "/api/v2/authorizations"}, "authorizations": [self._render_auth(a) for a in found]},
            )
        if method == "POST" and not rest:
            body = body or {}
            perms = body.get("permissions") or []
            if not perms:
                raise ApiError("invalid", "authorization must include permissions")
            for p in perms:
                if p.get("action") not in ("read", "write") or (p.get("resource") or {}).get("type") not in (
                    *RESOURCE_TYPES,
                    "instance",
                ):
                    raise ApiError("invalid", "invalid resource type for permission")
            org = body.get("orgID") or ""
            if not is_id(org):
                raise ApiError("invalid", "org id required: invalid ID")
            require(auth, "write", "authorizations", None, org)
            require(auth, "write", "users", auth["userID"])
            for p in perms:  # VerifyPermissions: the creator holds each permission it grants
                r = p["resource"]
                if not allowed(auth, p["action"], r["type"], r.get("id"), r.get("orgID")):
                    perm = f"{p['action']}:{resource_string(r['type'], r.get('id'), r.get('orgID'))}"
                    raise ApiError("forbidden", f"permission {perm} is not allowed: {perm} is unauthorized")
            return Response(201, self._create_auth(org, auth["userID"], body.get("description") or "", perms))
        if len(rest) == 1 and method == "DELETE":
            a = st.auths.get(rest[0])
            if a is None:
                raise ApiError("not found", "authorization not found")
            require(auth, "write", "authorizations", a["id"], a["orgID"])
            del st.auths[rest[0]]
            return Response(204)
        raise ApiError("method not allowed", "method not allowed")

    # -- /api/v2/query (Flux) -------------------------------------------------------------------
    def _ep_query(self, method: str, rest: list[str], q: dict[str, str], auth: dict, raw: Any) -> Response:
        if method != "POST" or rest:
            raise ApiError("method not allowed", "method not allowed")
        try:
            self._org_of(q.get("org", ""), q.get("orgID", ""))
        except ApiError as e:
            raise ApiError("invalid", f"failed to decode request body: {e.message}") from None
        query = json.loads(raw or b"{}").get("query") if isinstance(raw, bytes) else (raw or {}).get("query")
        if not query:
            raise ApiError("invalid", "failed to decode request body: request body requires either query or AST")
        err = flux_syntax_error(query)
        if err:
            raise ApiError("invalid", err)
        org = self._org_of(q.get("org", ""), q.get("orgID", ""))
        for name in FLUX_FROM_BUCKET.findall(query):
            b = next((x for x in self.state.buckets.values() if x["orgID"] == org["id"] and x["name"] == name), None)
            if b is None or not _readable(auth, b):
                raise ApiError("not found", f'failed to initialize execute state: could not find bucket "{name}"')
        self.state.queries.append(query)
        return Response(200, b"\r\n", content_type="text/csv; charset=utf-8")

    # -- /query (InfluxQL) ----------------------------------------------------------------------
    def _influxql(self, auth: dict, params: dict[str, str], raw: bytes, headers: Any) -> Response:
        form = dict(params)
        if raw and (headers.get("Content-Type") or "").startswith("application/x-www-form-urlencoded"):
            form.update(dict(urllib.parse.parse_qsl(raw.decode())))
        if self.backend is None:
            raise ApiError("not implemented", "this stand-in answers InfluxQL only with an InfluxDB 1.x backend")
        org = auth["orgID"]  # http/legacy/influxqld_handler.go: the org of the token; `org` is not read
        query, db, rp = form.get("q", ""), form.get("db", ""), form.get("rp", "")
        with self.lock:
            mappings = self._find_dbrps(auth, org, {})
        target = None
        if db:
            target = next(
                (m for m in mappings if m["database"] == db and (m["retention_policy"] == rp if rp else m["default"])),
                None,
            )
            if target is None:
                body = {"results": [{"statement_id": 0, "error": f"database not found: {db}"}]}
                return Response(200, body)
            for m in mappings:  # "db"."rp". qualifiers name a mapping's bucket
                query = query.replace(f'"{m["database"]}"."{m["retention_policy"]}".', f'"{m["bucketID"]}"."autogen".')
        fwd = {k: v for k, v in form.items() if k in ("q", "epoch", "chunked", "chunk_size")} | {"q": query}
        if target is not None:
            fwd |= {"db": target["bucketID"], "rp": "autogen"}
        req = urllib.request.Request(
            f"{self.backend.url}/query", data=urllib.parse.urlencode(fwd).encode(), method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return Response(200, r.read())
        except urllib.error.HTTPError as e:
            return Response(e.code, e.read())


#: ``from(bucket: "X")`` (the only source form gpulse writes); ``bucketID:`` and computed names are not looked at.
FLUX_FROM_BUCKET = re.compile(r'from\(\s*bucket\s*:\s*"([^"]+)"')


def _virtual(b: dict[str, Any]) -> dict[str, Any]:
    """``dbrp/service.go`` ``bucketToMapping``: db/rp from the bucket name (``db/rp`` or ``db`` + ``autogen``)."""
    db, sep, rp = b["name"].partition("/")
    return {
        "id": b["id"], "database": db, "retention_policy": rp if sep else "autogen", "default": not sep,
        "orgID": b["orgID"], "bucketID": b["id"], "virtual": True,
    }  # fmt: skip


def _readable(auth: dict, b: dict) -> bool:
    if b["type"] == "system":
        return allowed(auth, "read", "orgs", b["orgID"])
    return allowed(auth, "read", "buckets", b["id"], b["orgID"])


def find_options(q: dict[str, str]) -> tuple[int, int]:
    """``paging.go`` ``DecodeFindOptions``: (limit, offset)."""
    offset = 0
    if q.get("offset"):
        try:
            offset = int(q["offset"])
        except ValueError:
            raise ApiError("invalid", "offset is invalid") from None
    limit = DEFAULT_PAGE
    if q.get("limit"):
        try:
            limit = int(q["limit"])
        except ValueError:
            raise ApiError("invalid", "limit is invalid") from None
        if not 1 <= limit <= MAX_PAGE:
            raise ApiError("invalid", f"limit must be between 1 and {MAX_PAGE}")
    if q.get("descending") and q["descending"].lower() not in ("true", "false", "1", "0", "t", "f"):
        raise ApiError("invalid", "descending is invalid")
    return limit, offset


def _page(ordered: list[dict[str, Any]], limit: int, offset: int, after: str | None) -> list[dict[str, Any]]:
    """``listBucketsByOrg``: skip ``offset``, then everything up to and including ``after``, then ``limit``."""
    rest = ordered[offset:]
    if after:
        ids = [b["id"] for b in rest]
        rest = rest[ids.index(after) + 1 :] if after in ids else []
    return rest[:limit]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its keep-alive connection is normal; anything else is printed."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeInfluxV2Admin
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without this, Nagle + delayed ACK add 40 ms per request.
        import socket

        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = url.path.rstrip("/") or "/"
        resp = self.fake.handle(method, path, params, self.headers, raw)
        try:
            body = json.loads(raw) if raw and path not in ("/api/v2/write", "/query") else None
        except ValueError:
            body = None
        with self.fake.lock:
            self.fake.requests.append(Call(method, path, params, resp.status, body))
        send(self, resp)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


def init_like_the_official_image(url: str, env: dict[str, str]) -> dict[str, Any]:
    """What the official ``influxdb:2.9`` image's entrypoint does on a first start, against ``url``.

    ``influxdata/influxdata-docker`` ``influxdb/2.9/entrypoint.sh``: the ``*_FILE`` variables of the user
    name, password and admin token are read with ``$(cat FILE)`` (trailing newlines dropped; a missing
    file is skipped), ``DOCKER_INFLUXDB_INIT_{USERNAME,PASSWORD,ORG,BUCKET}`` are required, and
    ``setup_influxd`` runs ``influx setup --force ... [--retention R] [--token T]``, which (``influx-cli``
    ``clients/setup/setup.go`` ``Setup``) asks ``GET /api/v2/setup`` and then ``POST /api/v2/setup`` with
    ``retentionPeriodSeconds``. Returns the onboarding answer. (The IDs the entrypoint then exports
    for init scripts are not needed here.)
    """
    from gpulse.influx.downsample import parse_duration

    values = dict(env)
    for key in ("PASSWORD", "USERNAME", "ADMIN_TOKEN"):
        path = env.get(f"DOCKER_INFLUXDB_INIT_{key}_FILE")
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    values[f"DOCKER_INFLUXDB_INIT_{key}"] = f.read().rstrip("\n")
            except FileNotFoundError:
                pass  # "defined, but file not existing, skipping."
    if values.get("DOCKER_INFLUXDB_INIT_MODE") != "setup":
        raise ValueError("only DOCKER_INFLUXDB_INIT_MODE=setup is followed here")
    missing = [k for k in ("USERNAME", "PASSWORD", "ORG", "BUCKET") if not values.get(f"DOCKER_INFLUXDB_INIT_{k}")]
    if missing:
        raise ValueError(f"missing parameter, cannot init InfluxDB: {missing}")
    with urllib.request.urlopen(f"{url}/api/v2/setup", timeout=10) as r:
        if not json.loads(r.read())["allowed"]:
            raise ValueError("instance has already been set up")
    body: dict[str, Any] = {
        "username": values["DOCKER_INFLUXDB_INIT_USERNAME"],
        "password": values["DOCKER_INFLUXDB_INIT_PASSWORD"],
        "org": values["DOCKER_INFLUXDB_INIT_ORG"],
        "bucket": values["DOCKER_INFLUXDB_INIT_BUCKET"],
        "retentionPeriodSeconds": parse_duration(values.get("DOCKER_INFLUXDB_INIT_RETENTION") or "0") // 10**9,
    }
    if values.get("DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"):
        body["token"] = values["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"]
    req = urllib.request.Request(
        f"{url}/api/v2/setup",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())
