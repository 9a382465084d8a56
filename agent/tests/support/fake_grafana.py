"""A stand-in for Grafana OSS's HTTP API: the org, datasource and dashboard endpoints ``gpulse setup --tenant`` uses.

Grafana cannot run here. This server follows grafana/grafana's routes (``pkg/api/api.go``) and
handlers as read from the source and the HTTP API docs; it was never run against a real Grafana.

* Authentication: Basic ``user:password`` of a known user, else 401 ``{"message":"Invalid username or
  password"}`` (``pkg/services/authn/clients/basic.go``, ``errInvalidPassword``).
* ``X-Grafana-Org-Id`` selects the request's org (``pkg/services/authn/authnimpl`` ``orgIDFromHeader``);
  without it, the user's current org (1).
* ``GET /api/orgs/name/:name`` (``pkg/api/org.go`` ``GetOrgByName``, server admin only): 200 ``{"id",
  "name","address"}`` or 404 ``{"message":"Organization not found"}``.
* ``POST /api/orgs`` (``pkg/api/org.go`` ``CreateOrg``): 200 ``{"message":"Organization created",
  "orgId"}``, the creator becoming the new org's Admin (``org.CreateWithMember``); a taken name is 409
  ``{"message":"Organization name taken"}``; a non-admin 403 (``allow_org_create`` off, the default).
* ``GET /api/datasources/uid/:uid`` (``pkg/api/datasources.go`` ``GetDataSourceByUID``): 200 the datasource
  with ``secureJsonFields`` (``{key: true}``), never the secret; 404 ``{"message":"Data source not found"}``.
* ``POST /api/datasources`` (``AddDataSource``): 200 ``{"datasource","id","message":"Datasource added",
  "name"}``; a name or uid taken in the org is 409 ``data source with the same name already exists`` /
  ``... uid ...`` (``pkg/services/datasources`` ``ErrDataSourceNameExists``/``ErrDataSourceUidExists``).
* ``PUT /api/datasources/uid/:uid`` (``UpdateDataSourceByUID``): 200 ``{"datasource","id","message":
  "Datasource updated","name"}``; secrets not sent are kept; 404 as above.
* ``GET /api/dashboards/uid/:uid`` (``pkg/api/dashboard.go`` ``GetDashboard``): 200 ``{"dashboard",
  "meta"}`` with Grafana's ``id`` and ``version`` in the model; 404 ``{"message":"Dashboard not found"}``.
* ``POST /api/dashboards/db`` (``PostDashboard``): 200 ``{"id","slug","status":"success","uid","url",
  "version"}``; an existing uid without ``overwrite`` is 412 ``{"message":"A dashboard with the same uid
  already exists","status":"name-exists"}`` (``dashboards.ErrDashboardWithSameUIDExists``).
* Roles: the org's Admin (or Editor for dashboards) may write; anyone else 403 ``{"message":"Permission
  denied"}``.

Known differences: a server admin who is not a member of the org named by ``X-Grafana-Org-Id`` is
refused here (403); the real server's answer depends on the version's authn code and was not
checked. Folders, teams, permissions, provisioning, dashboard schema migration and the datasource
health check are not modelled; a dashboard is stored as sent (Grafana's API stores the JSON model
as given, the browser migrates it). Every request is logged in ``requests``.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DATASOURCE_KEYS = ("name", "type", "access", "url", "user", "database", "basicAuth", "isDefault", "jsonData", "uid")


class Refused(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.body = status, {"message": message, **extra}


@dataclass
class Org:
    id: int
    name: str
    members: dict[str, str] = field(default_factory=dict)  # login -> role
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> stored datasource
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # uid -> secureJsonData
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> model


class FakeGrafana:
    """Grafana OSS with one server admin ``admin`` in the Main Org (id 1)."""

    def __init__(self, admin_password: str = "admin-pw") -> None:
        self.users = {"admin": (admin_password, True)}  # login -> (password, server admin)
        self.orgs: dict[int, Org] = {1: Org(1, "Main Org.", {"admin": "Admin"})}
        self.requests: list[tuple[str, str, int | None]] = []  # method, path, org id
        self.lock = threading.Lock()
        self._next_id = 1
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.fake = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeGrafana:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def writes(self) -> list[tuple[str, str, int | None]]:
        return [r for r in self.requests if r[0] != "GET"]

    def org(self, name: str) -> Org | None:
        return next((o for o in self.orgs.values() if o.name == name), None)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- dispatch -------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: Any, body: Any) -> tuple[int, Any]:
        login = self._login(headers.get("Authorization") or "")
        org = self.orgs.get(int(headers.get("X-Grafana-Org-Id") or 1))
        self.requests.append((method, path, org.id if org else None))
        admin = self.users[login][1]
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "orgs", "name"] and len(parts) == 4 and method == "GET":
            if not admin:
                raise Refused(403, "Permission denied")
            found = self.org(parts[3])
            if found is None:
                raise Refused(404, "Organization not found")
            return 200, {"id": found.id, "name": found.name, "address": {}}
        if parts == ["api", "orgs"] and method == "POST":
            if not admin:
                raise Refused(403, "Access denied")
            if self.org(body["name"]) is not None:
                raise Refused(409, "Organization name taken")
            new = Org(self.new_id(), body["name"], {login: "Admin"})
            self.orgs[new.id] = new
            return 200, {"message": "Organization created", "orgId": new.id}
        if org is None or login not in org.members:
            raise Refused(403, "Permission denied")
        role = org.members[login]
        if parts[:2] == ["api", "datasources"]:
            return self._datasources(method, parts[2:], org, role, body)
        if parts[:2] == ["api", "dashboards"]:
            return self._dashboards(method, parts[2:], org, role, body)
        raise Refused(404, "Not found")

    def _login(self, authorization: str) -> str:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "basic":
            user, _, password = base64.b64decode(value).decode().partition(":")
            if user in self.users and self.users[user][0] == password:
                return user
        raise Refused(401, "Invalid username or password")

    def _datasources(self, method: str, rest: list[str], org: Org, role: str, body: Any) -> tuple[int, Any]:
        if method == "GET" and len(rest) == 2 and rest[0] == "uid":
            ds = org.datasources.get(rest[1])
            if ds is None:
                raise Refused(404, "Data source not found")
            return 200, ds | {"secureJsonFields": dict.fromkeys(org.secrets.get(rest[1], {}), True)}
        if role != "Admin":
            raise Refused(403, "Permission denied")
        if method == "POST" and not rest:
            if any(d["name"] == body["name"] for d in org.datasources.values()):
                raise Refused(409, "data source with the same name already exists")
            if body.get("uid") in org.datasources:
                raise Refused(409, "data source with the same uid already exists")
            ds = self._store_datasource(org, body, self.new_id(), 1)
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added", "name": ds["name"]}
        if method == "PUT" and len(rest) == 2 and rest[0] == "uid":
            cur = org.datasources.get(rest[1])
            if cur is None:
                raise Refused(404, "Data source not found")
            ds = self._store_datasource(org, body | {"uid": rest[1]}, cur["id"], cur["version"] + 1)
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource updated", "name": ds["name"]}
        raise Refused(404, "Not found")

    def _store_datasource(self, org: Org, body: dict[str, Any], ds_id: int, version: int) -> dict[str, Any]:
        ds = {k: body[k] for k in DATASOURCE_KEYS if k in body} | {"id": ds_id, "orgId": org.id, "version": version}
        ds.setdefault("jsonData", {})
        org.datasources[ds["uid"]] = ds
        org.secrets[ds["uid"]] = org.secrets.get(ds["uid"], {}) | (body.get("secureJsonData") or {})
        return ds

    def _dashboards(self, method: str, rest: list[str], org: Org, role: str, body: Any) -> tuple[int, Any]:
        if method == "GET" and len(rest) == 2 and rest[0] == "uid":
            d = org.dashboards.get(rest[1])
            if d is None:
                raise Refused(404, "Dashboard not found")
            return 200, {"dashboard": d, "meta": {"slug": d["title"].lower().replace(" ", "-"), "folderId": 0}}
        if method == "POST" and rest == ["db"]:
            if role not in ("Admin", "Editor"):
                raise Refused(403, "Permission denied")
            model = dict(body["dashboard"])
            cur = org.dashboards.get(model["uid"])
            if cur is not None and not body.get("overwrite"):
                raise Refused(412, "A dashboard with the same uid already exists", status="name-exists")
            model["id"] = cur["id"] if cur else self.new_id()
            model["version"] = cur["version"] + 1 if cur else 1
            org.dashboards[model["uid"]] = model
            slug = model["title"].lower().replace(" ", "-")
            return 200, {
                "id": model["id"], "slug": slug, "status": "success", "uid": model["uid"],
                "url": f"/d/{model['uid']}/{slug}", "version": model["version"],
            }  # fmt: skip
        raise Refused(404, "Not found")


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        fake: FakeGrafana = self.server.fake  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            with fake.lock:
                status, answer = fake.handle(
                    self.command, self.path.split("?")[0], self.headers, json.loads(raw or b"null")
                )
        except Refused as e:
            status, answer = e.status, e.body
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _serve
