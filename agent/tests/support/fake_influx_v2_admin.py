"""A fake of the InfluxDB 2.x management HTTP API: what ``gpulse setup`` talks to.

Stands in for InfluxDB 2.x (no 2.x server can run in CI). It follows the documented API
(docs.influxdata.com/influxdb/v2/api, influxdb-client-python's models) for the endpoints setup
uses, with their payloads, status codes and error bodies:

* ``GET /ping`` (204, ``X-Influxdb-Version``/``X-Influxdb-Build``), ``GET /health`` (JSON),
  ``GET /api/v2/setup`` (``{"allowed": bool}``);
* ``/api/v2/orgs`` (``?org=`` -> 404 ``not found`` for an unknown name);
* ``/api/v2/buckets`` (GET ``?orgID=&name=``, POST -> 201 / 422 ``conflict``, PATCH ``/{id}``);
  infinite retention is reported as ``everySeconds: 0`` like the real server;
* ``/api/v2/dbrps`` (GET needs ``orgID`` or ``org`` else 400; includes the server's *virtual*
  mappings, one per bucket with rp ``autogen``; POST -> 201; PATCH ``/{id}`` -> ``{"content": ...}``;
  DELETE -> 204; a new default clears the old default of the database);
* ``/api/v2/tasks`` (GET ``?name=&orgID=``, POST parses ``option task = {name, every|cron, offset}``
  from the script like the server and answers 400 ``invalid`` without them; PATCH ``/{id}``);
* ``/api/v2/authorizations`` (GET without token values, as 2.9 stores hashes; POST returns the
  token once; DELETE);
* ``POST /api/v2/query`` (records the Flux, answers an empty annotated CSV).

Auth: ``Authorization: Token <t>``. Unknown token -> 401 ``{"code":"unauthorized","message":
"unauthorized access"}``. A read-only token sees only the buckets it may read and gets 401
``... is unauthorized`` for anything else, as 2.x does. Every request is logged in ``requests``.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VERSION = "v2.9.1"


def new_id() -> str:
    return secrets.token_hex(8)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_TASK_OPTION = re.compile(r"option\s+task\s*=\s*\{(?P<body>[^}]*)\}")


def parse_task_options(flux: str) -> dict[str, str]:
    """``name``, ``every``, ``cron``, ``offset`` from ``option task = {...}``, as the server extracts them."""
    m = _TASK_OPTION.search(flux)
    if not m:
        return {}
    out = {}
    for key, value in re.findall(r'(\w+)\s*:\s*("(?:[^"\\]|\\.)*"|[^,]+)', m.group("body")):
        out[key] = value.strip().strip('"')
    return out


@dataclass
class FakeState:
    org_name: str = "gpulse"
    operator_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    onboarded: bool = True
    orgs: list[dict[str, Any]] = field(default_factory=list)
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)
    dbrps: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    auths: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> authorization (with its token)
    queries: list[str] = field(default_factory=list)


class FakeInfluxV2Admin:
    """A threaded HTTP server on a free loopback port; ``with FakeInfluxV2Admin() as fake: fake.url``."""

    def __init__(self, org: str = "gpulse", *, onboarded: bool = True) -> None:
        self.state = FakeState(org_name=org, onboarded=onboarded)
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        if onboarded:
            org_doc = {"id": new_id(), "name": org, "description": "", "createdAt": _now(), "updatedAt": _now()}
            self.state.orgs.append(org_doc)
            # `influx setup` creates the initial bucket (compose: DOCKER_INFLUXDB_INIT_BUCKET, 30 d here).
            self.add_bucket(org, retention_s=30 * 86400)
            self.state.auths[new_id()] = {
                "token": self.state.operator_token,
                "orgID": org_doc["id"],
                "description": "admin's Token",
                "permissions": "all",
            }
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

    # -- inspection helpers for tests ------------------------------------------------------------
    @property
    def org_id(self) -> str:
        return self.state.orgs[0]["id"]

    def writes(self) -> list[tuple[str, str]]:
        """Requests that change state (POST/PATCH/PUT/DELETE), except queries."""
        return [(m, p) for m, p in self.requests if m != "GET" and not p.startswith("/api/v2/query")]

    def bucket(self, name: str) -> dict[str, Any] | None:
        return next((b for b in self.state.buckets.values() if b["name"] == name), None)

    def task(self, name: str) -> dict[str, Any] | None:
        return next((t for t in self.state.tasks.values() if t["name"] == name), None)

    def add_bucket(self, name: str, retention_s: int = 0) -> dict[str, Any]:
        b = {
            "id": new_id(),
            "orgID": self.state.orgs[0]["id"],
            "type": "user",
            "name": name,
            "description": "",
            "retentionRules": [{"type": "expire", "everySeconds": retention_s, "shardGroupDurationSeconds": 86400}],
            "createdAt": _now(),
            "updatedAt": _now(),
            "labels": [],
            "links": {},
        }
        self.state.buckets[b["id"]] = b
        return b

    def token_for(self, auth_id: str) -> str:
        return self.state.auths[auth_id]["token"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its keep-alive connection is normal; anything else is printed."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _public_auth(a_id: str, a: dict[str, Any], with_token: bool = False) -> dict[str, Any]:
    perms = a["permissions"]
    doc = {
        "id": a_id,
        "orgID": a["orgID"],
        "status": "active",
        "description": a.get("description", ""),
        "permissions": [] if perms == "all" else perms,
        "createdAt": _now(),
        "updatedAt": _now(),
        "links": {"self": f"/api/v2/authorizations/{a_id}"},
    }
    if with_token:
        doc["token"] = a["token"]
    return doc


class _Handler(BaseHTTPRequestHandler):
    fake: FakeInfluxV2Admin
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without this, Nagle + delayed ACK add 40 ms per request.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:
        pass

    # -- plumbing -------------------------------------------------------------------------------
    def _send(self, status: int, body: Any = None, content_type: str = "application/json; charset=utf-8") -> None:
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("X-Influxdb-Build", "OSS")
        self.send_header("X-Influxdb-Version", VERSION)
        if data:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, {"code": code, "message": message})

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    def _auth(self) -> dict[str, Any] | None:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Token "):
            return None
        token = header[len("Token ") :]
        return next((a for a in self.fake.state.auths.values() if a["token"] == token), None)

    def _can(self, auth: dict[str, Any], action: str, rtype: str, rid: str | None = None) -> bool:
        if auth["permissions"] == "all":
            return True
        for p in auth["permissions"]:
            r = p["resource"]
            if p["action"] == action and r["type"] == rtype:
                if r.get("id") in (None, rid):
                    return True
        return False

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        path = url.path.rstrip("/")
        with self.fake.lock:
            self.fake.requests.append((method, path))
            if path == "/ping" and method == "GET":
                return self._send(204)
            if path == "/health":
                return self._send(
                    200,
                    {"name": "influxdb", "message": "ready for queries and writes", "status": "pass", "checks": [],
                     "version": VERSION, "commit": "fake"},
                )  # fmt: skip
            if path == "/api/v2/setup" and method == "GET":
                return self._send(200, {"allowed": not self.fake.state.onboarded})
            auth = self._auth()
            if auth is None:
                return self._error(401, "unauthorized", "unauthorized access")
            parts = path.split("/")[3:]  # after /api/v2
            if not parts or path.split("/")[:3] != ["", "api", "v2"]:
                return self._error(404, "not found", "path not found")
            handler = getattr(self, f"_{parts[0]}", None)
            if handler is None:
                return self._error(404, "not found", "path not found")
            handler(method, parts[1:], q, auth)

    def _deny(self, action: str, what: str) -> None:
        self._error(401, "unauthorized", f"{action}:orgs/{self.fake.org_id}/{what} is unauthorized")

    # -- /api/v2/orgs ---------------------------------------------------------------------------
    def _orgs(self, method: str, rest: list[str], q: dict[str, str], auth: dict[str, Any]) -> None:
        if method != "GET" or rest:
            return self._error(405, "method not allowed", "method not allowed")
        orgs = [o for o in self.fake.state.orgs if auth["permissions"] == "all" or o["id"] == auth["orgID"]]
        if "org" in q:
            orgs = [o for o in orgs if o["name"] == q["org"]]
            if not orgs:
                return self._error(404, "not found", f'organization name "{q["org"]}" not found')
        self._send(200, {"links": {"self": "/api/v2/orgs"}, "orgs": orgs})

    # -- /api/v2/buckets ------------------------------------------------------------------------
    def _buckets(self, method: str, rest: list[str], q: dict[str, str], auth: dict[str, Any]) -> None:
        st = self.fake.state
        if method == "GET" and not rest:
            found = [
                b for b in st.buckets.values()
                if (not q.get("orgID") or b["orgID"] == q["orgID"]) and (not q.get("name") or b["name"] == q["name"])
                and self._can(auth, "read", "buckets", b["id"])
            ]  # fmt: skip
            return self._send(200, {"links": {"self": "/api/v2/buckets"}, "buckets": found})
        if not self._can(auth, "write", "buckets"):
            return self._deny("write", "buckets")
        if method == "POST" and not rest:
            body = self._body()
            if not body.get("name") or not body.get("orgID"):
                return self._error(400, "invalid", "bucket name and orgID are required")
            if self.fake.bucket(body["name"]):
                return self._error(422, "conflict", f"bucket with name {body['name']} already exists")
            rules = body.get("retentionRules") or []
            secs = rules[0].get("everySeconds", 0) if rules else 0
            b = self.fake.add_bucket(body["name"], secs)
            b["description"] = body.get("description") or ""
            return self._send(201, b)
        if method == "PATCH" and len(rest) == 1:
            b = st.buckets.get(rest[0])
            if b is None:
                return self._error(404, "not found", "bucket not found")
            body = self._body()
            if "retentionRules" in body:
                rules = body["retentionRules"] or []
                b["retentionRules"][0]["everySeconds"] = rules[0].get("everySeconds", 0) if rules else 0
            if body.get("name"):
                b["name"] = body["name"]
            if body.get("description") is not None:
                b["description"] = body["description"]
            b["updatedAt"] = _now()
            return self._send(200, b)
        self._error(405, "method not allowed", "method not allowed")

    # -- /api/v2/dbrps --------------------------------------------------------------------------
    def _dbrps(self, method: str, rest: list[str], q: dict[str, str], auth: dict[str, Any]) -> None:
        st = self.fake.state
        if method == "GET" and not rest:
            if not (q.get("orgID") or q.get("org")):
                return self._error(400, "invalid", "either 'org' or 'orgID' must be provided")
            real = list(st.dbrps.values())
            mapped = {d["bucketID"] for d in real}
            virtual = [
                {"id": b["id"], "orgID": b["orgID"], "bucketID": b["id"], "database": b["name"],
                 "retention_policy": "autogen", "default": True, "virtual": True}
                for b in st.buckets.values() if b["id"] not in mapped
            ]  # fmt: skip
            found = [
                d for d in real + virtual
                if (not q.get("db") or d["database"] == q["db"]) and (not q.get("rp") or d["retention_policy"] == q["rp"])
                and self._can(auth, "read", "buckets", d["bucketID"])
            ]  # fmt: skip
            return self._send(200, {"content": found})
        if not self._can(auth, "write", "dbrp"):
            return self._deny("write", "dbrp")
        if method == "POST" and not rest:
            body = self._body()
            missing = [k for k in ("orgID", "bucketID", "database", "retention_policy") if not body.get(k)]
            if missing:
                return self._error(400, "invalid", f"missing {', '.join(missing)}")
            if body["bucketID"] not in st.buckets:
                return self._error(404, "not found", "bucket not found")
            if any(
                d["database"] == body["database"] and d["retention_policy"] == body["retention_policy"]
                for d in st.dbrps.values()
            ):
                return self._error(409, "conflict", "another DBRP mapping with same orgID, db, and rp exists")
            d = {
                "id": new_id(), "orgID": body["orgID"], "bucketID": body["bucketID"], "database": body["database"],
                "retention_policy": body["retention_policy"], "default": bool(body.get("default")), "virtual": False,
            }  # fmt: skip
            self._set_default(d)
            st.dbrps[d["id"]] = d
            return self._send(201, d)
        if len(rest) == 1 and rest[0] in st.dbrps:
            if not q.get("orgID") and not q.get("org"):
                return self._error(400, "invalid", "either 'org' or 'orgID' must be provided")
            d = st.dbrps[rest[0]]
            if method == "PATCH":
                body = self._body()
                if "retention_policy" in body:
                    d["retention_policy"] = body["retention_policy"]
                if "default" in body:
                    d["default"] = bool(body["default"])
                    self._set_default(d)
                return self._send(200, {"content": d})
            if method == "DELETE":
                del st.dbrps[rest[0]]
                return self._send(204)
        self._error(404, "not found", "unable to find DBRP")

    def _set_default(self, d: dict[str, Any]) -> None:
        if d["default"]:
            for other in self.fake.state.dbrps.values():
                if other is not d and other["database"] == d["database"]:
                    other["default"] = False

    # -- /api/v2/tasks --------------------------------------------------------------------------
    def _tasks(self, method: str, rest: list[str], q: dict[str, str], auth: dict[str, Any]) -> None:
        st = self.fake.state
        if method == "GET" and not rest:
            found = [
                t for t in st.tasks.values()
                if (not q.get("name") or t["name"] == q["name"]) and (not q.get("orgID") or t["orgID"] == q["orgID"])
            ]  # fmt: skip
            return self._send(200, {"links": {"self": "/api/v2/tasks"}, "tasks": found})
        if not self._can(auth, "write", "tasks"):
            return self._deny("write", "tasks")
        if method == "POST" and not rest:
            body = self._body()
            opts = parse_task_options(body.get("flux") or "")
            if not opts.get("name") or not (opts.get("every") or opts.get("cron")):
                return self._error(400, "invalid", "failed to create task: task must have a name and every or cron")
            t = {
                "id": new_id(), "orgID": body.get("orgID"), "org": self.fake.state.org_name, "name": opts["name"],
                "description": body.get("description") or "", "status": body.get("status") or "active",
                "flux": body["flux"], "every": opts.get("every"), "offset": opts.get("offset"), "ownerID": new_id(),
                "createdAt": _now(), "updatedAt": _now(), "links": {},
            }  # fmt: skip
            st.tasks[t["id"]] = t
            return self._send(201, t)
        if method == "PATCH" and len(rest) == 1:
            t = st.tasks.get(rest[0])
            if t is None:
                return self._error(404, "not found", "task not found")
            body = self._body()
            if body.get("flux"):
                opts = parse_task_options(body["flux"])
                if not opts.get("name"):
                    return self._error(400, "invalid", "task must have a name")
                t.update(flux=body["flux"], name=opts["name"], every=opts.get("every"), offset=opts.get("offset"))
            if body.get("status"):
                t["status"] = body["status"]
            t["updatedAt"] = _now()
            return self._send(200, t)
        self._error(405, "method not allowed", "method not allowed")

    # -- /api/v2/authorizations -----------------------------------------------------------------
    def _authorizations(self, method: str, rest: list[str], q: dict[str, str], auth: dict[str, Any]) -> None:
        st = self.fake.state
        if not self._can(auth, "read", "authorizations"):
            return self._deny("read", "authorizations")
        if method == "GET" and not rest:
            found = [_public_auth(i, a) for i, a in st.auths.items() if not q.get("orgID") or a["orgID"] == q["orgID"]]
            return self._send(200, {"links": {"self": "/api/v2/authorizations"}, "authorizations": found})
        if method == "POST" and not rest:
            body = self._body()
            perms = body.get("permissions") or []
            if not body.get("orgID") or not perms:
                return self._error(400, "invalid", "orgID and permissions are required")
            for p in perms:
                if p.get("action") not in ("read", "write") or not (p.get("resource") or {}).get("type"):
                    return self._error(400, "invalid", f"invalid permission {p}")
            a_id = new_id()
            st.auths[a_id] = {
                "token": secrets.token_urlsafe(48), "orgID": body["orgID"],
                "description": body.get("description") or "", "permissions": perms,
            }  # fmt: skip
            return self._send(201, _public_auth(a_id, st.auths[a_id], with_token=True))
        if method == "DELETE" and len(rest) == 1:
            if st.auths.pop(rest[0], None) is None:
                return self._error(404, "not found", "authorization not found")
            return self._send(204)
        self._error(405, "method not allowed", "method not allowed")

    # -- /api/v2/query --------------------------------------------------------------------------
    def _query(self, method: str, rest: list[str], q: dict[str, str], auth: dict[str, Any]) -> None:
        if method != "POST" or rest:
            return self._error(405, "method not allowed", "method not allowed")
        if not (q.get("org") or q.get("orgID")):
            return self._error(400, "invalid", "Please provide either orgID or org")
        body = self._body()
        if not body.get("query"):
            return self._error(400, "invalid", "query is required")
        self.fake.state.queries.append(body["query"])
        self._send(200, b"\r\n", content_type="text/csv; charset=utf-8")
