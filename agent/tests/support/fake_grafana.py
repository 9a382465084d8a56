"""A stand-in for Grafana OSS's HTTP API: the org, org user, datasource and dashboard endpoints ``gpulse setup --tenant`` uses.

Grafana cannot run here. Each route follows grafana/grafana's source as stored (a version of
``main`` with RBAC-only routes; Grafana 13.2.3 itself, commit 90ffed056f08, is not stored):
``pkg/api/api.go`` ``registerRoutes`` for the route and the permission it needs, and the handler
named below for the answer. Every refusal is as strict as Grafana's.

* Authentication (``pkg/services/authn/clients/password.go`` ``errPasswordAuthFailed``, written by
  ``pkg/middleware/auth.go`` ``unauthorized``): Basic ``user:password`` of a known user, else 401
  ``{"message":"Invalid username or password","messageId":"password-auth.failed","statusCode":401,
  "traceID":""}``.
* The request's org (``pkg/services/authn/authnimpl/service.go`` ``orgIDFromRequest``): the
  ``X-Grafana-Org-Id`` header when it is an integer, else the user's current org (1). The user is
  looked up in that org (``sync/user_sync.go`` ``FetchSyncedUserHook`` →
  ``pkg/services/user/userimpl/store.go`` ``GetSignedInUser``): a user who is not a member of it,
  server admin or not, gets org -1 and no role, so every org-scoped permission below is refused.
* Permissions (``pkg/services/accesscontrol/middleware.go`` ``authorize``/``deny``): refused is 403
  ``{"title":"Access denied","message":"You'll need additional permissions to perform this action.
  Permissions needed: <action>","accessErrorId":"ACE..."}``. The org's Admin holds
  ``datasources:*``, ``dashboards:*``; an Editor ``dashboards:*`` and ``datasources:read``; a Viewer
  ``dashboards:read`` and ``datasources:read``; a server admin, in the global org
  (``authorizeInOrg(ac.UseGlobalOrg, ...)``), ``orgs:read`` and ``orgs:create``, and in any org named
  by the path (``ac.UseOrgFromContextParams``) ``org.users:read``, ``org.users:add``,
  ``org.users:write``. ``allow_org_create`` is off (Grafana's default), so only server admins create orgs.
* ``GET /api/orgs/name/:name`` (``pkg/api/org.go`` ``GetOrgByName``): 200 ``{"id","name","address":
  {...}}`` or 404 ``{"message":"Organization not found"}``.
* ``POST /api/orgs`` (``org.go`` ``CreateOrg``): 200 ``{"message":"Organization created","orgId"}``, the
  creator becoming the new org's Admin (``CreateWithMember``); a taken name 409 ``{"message":
  "Organization name taken"}``.
* An org id in the path that no org has is not refused by the middleware: a user who is a member of
  no such org is authorized on their global permissions (``authorizeInOrg``), which a server admin's
  hold. The handlers then answer from the store as for an org with no members (below).
* ``GET /api/orgs/:orgId/users`` (``pkg/api/org_users.go`` ``GetOrgUsers``): 200, a list of ``{"orgId",
  "userId","login","email","name","role"}`` (empty for an unknown org: the store selects ``org_user``
  rows by org id).
* ``POST /api/orgs/:orgId/users`` (``AddOrgUser``, ``addOrgUserHelper``): 200 ``{"message":"User added
  to organization","userId"}``; 409 ``{"message":"User is already member of this organization","userId"}``;
  404 ``{"message":"User not found"}``; 400 ``{"message":"Invalid role specified"}``; an unknown org 500
  ``{"message":"Could not add user to organization"}`` (``pkg/services/org/orgimpl/store.go``
  ``AddOrgUser`` returns ``ErrOrgNotFound``, which the handler does not map).
* ``PATCH /api/orgs/:orgId/users/:userId`` (``UpdateOrgUser``, ``updateOrgUserHelper``): 200
  ``{"message":"Organization user updated"}``; 400 for an invalid role; a user who is not a member of
  the org, or an unknown org, 500 ``{"message":"Failed update org user"}`` (the store's ``UpdateOrgUser``
  returns ``ErrOrgUserNotFound``, which the handler does not map); demoting the org's last Admin 400
  ``{"message":"Cannot change role so that there is no organization admin left"}`` (the store's
  ``validateOneAdminLeftInOrg`` returns ``ErrLastOrgAdmin`` and the update is rolled back).
* ``GET /api/datasources/uid/:uid`` (``pkg/api/datasources.go`` ``GetDataSourceByUID``): 200 the
  datasource with ``secureJsonFields`` (``{key: true}``), never a secret; 404 ``{"message":"Data
  source not found"}``.
* ``POST /api/datasources`` (``AddDataSource``): 200 ``{"datasource","id","message":"Datasource added",
  "name"}``; a name or uid taken in the org 409 ``data source with the same name already exists`` /
  ``... uid ...`` (``datasources.ErrDataSourceNameExists``/``ErrDataSourceUidExists``).
* ``PUT /api/datasources/uid/:uid`` (``UpdateDataSourceByUID``): 200 ``{"datasource","id","message":
  "Datasource updated","name"}``; the fields sent replace the stored ones, secrets not sent are kept
  (``fillWithSecureJSONData``); a ``version`` older than the stored one 409 ``Datasource has already
  been updated by someone else. Please reload and try again``; 404 as above.
* ``GET /api/dashboards/uid/:uid`` (``pkg/api/dashboard.go`` ``GetDashboard``): 200 ``{"dashboard",
  "meta"}`` with Grafana's ``id``, ``uid`` and ``version`` in the model; 404 ``{"message":"Dashboard not
  found"}`` (``dashboards.ErrDashboardNotFound``).
* ``POST /api/dashboards/db`` (``PostDashboard``): 200 ``{"folderUid","id","slug","status":"success",
  "uid","url","version"}``; an ``id`` that is not the stored one's for its uid 400 ``{"message":"A
  dashboard with the same uid already exists"}``; a ``version`` that is not the stored one without
  ``overwrite`` 412 ``{"message":"The dashboard has been changed by someone else","status":
  "version-mismatch"}`` (``pkg/services/dashboards/errors.go``).

Known differences: the dashboard service's title-in-folder check (``name-exists``), folders, teams,
permissions on single objects, provisioning (read-only datasources), URL validation, dashboard schema
migration and the datasource health check are not modelled; a dashboard is stored as sent, with
Grafana's ``id``, ``uid`` and ``version`` set (Grafana 12+ may answer the model through its k8s
dashboard API with more keys; then ``gpulse setup`` rewrites the dashboards on each run, which this
stand-in would not show). A 404 body may carry more keys in Grafana (``title``, ``status``). Every
request is logged in ``requests``.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DATASOURCE_KEYS = ("name", "type", "access", "url", "user", "database", "basicAuth", "isDefault", "jsonData", "uid")
ROLES = ("Viewer", "Editor", "Admin")
#: What each basic role may do in its org (``pkg/api/accesscontrol.go`` ``declareFixedRoles``: the fixed roles
#: and the basic roles they are granted to).
ROLE_ACTIONS = {
    "Admin": {"datasources:read", "datasources:create", "datasources:write", "dashboards:read", "dashboards:create",
              "dashboards:write"},
    "Editor": {"datasources:read", "dashboards:read", "dashboards:create", "dashboards:write"},
    "Viewer": {"datasources:read", "dashboards:read"},
}  # fmt: skip
#: A server admin's global permissions (``orgs:*`` in the global org; org users of any org named by the path).
SERVER_ADMIN_GLOBAL = {"orgs:read", "orgs:create"}
SERVER_ADMIN_IN_ORG = {"org.users:read", "org.users:add", "org.users:write"}
REFUSED_LOGIN = {
    "message": "Invalid username or password",
    "messageId": "password-auth.failed",
    "statusCode": 401,
    "traceID": "",
}


class Refused(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.status, self.body = status, body


def error(status: int, message: str, **extra: Any) -> Refused:
    """``response.Error``: ``{"message": ...}``."""
    return Refused(status, {"message": message, **extra})


def denied(action: str) -> Refused:
    """``accesscontrol`` ``deny``: what RBAC answers a request without the permission."""
    return Refused(
        403,
        {
            "title": "Access denied",
            "message": f"You'll need additional permissions to perform this action. Permissions needed: {action}",
            "accessErrorId": f"ACE{uuid.uuid4().int % 10**10:010d}",
        },
    )


@dataclass
class User:
    id: int
    login: str
    password: str
    server_admin: bool


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
        self.users = {"admin": User(1, "admin", admin_password, True)}
        self.orgs: dict[int, Org] = {1: Org(1, "Main Org.", {"admin": "Admin"})}
        self.requests: list[tuple[str, str, int | None]] = []  # method, path, org id of the request
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

    # -- what tests set up and read ---------------------------------------------------------------
    def add_user(self, login: str, password: str, *, server_admin: bool = False) -> User:
        self.users[login] = User(self.new_id(), login, password, server_admin)
        return self.users[login]

    def add_org(self, name: str, members: dict[str, str]) -> Org:
        """An org made by someone else (another admin, the UI): ``members`` login -> role."""
        o = Org(self.new_id(), name, dict(members))
        self.orgs[o.id] = o
        return o

    def writes(self) -> list[tuple[str, str, int | None]]:
        return [r for r in self.requests if r[0] != "GET"]

    def org(self, name: str) -> Org | None:
        return next((o for o in self.orgs.values() if o.name == name), None)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- dispatch ---------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: Any, body: Any) -> tuple[int, Any]:
        user = self._login(headers.get("Authorization") or "")
        header = (headers.get("X-Grafana-Org-Id") or "").strip()
        org_id = int(header) if re.fullmatch(r"-?\d+", header) and int(header) != 0 else 1
        org = self.orgs.get(org_id)
        role = org.members.get(user.login) if org is not None else None  # None: org -1, no role
        self.requests.append((method, path, org.id if org is not None and role is not None else None))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "orgs"]:
            return self._orgs(method, parts[2:], user, body)
        actions = ROLE_ACTIONS.get(role or "", set())
        if parts[:2] == ["api", "datasources"]:
            return self._datasources(method, parts[2:], org, actions, body)
        if parts[:2] == ["api", "dashboards"]:
            return self._dashboards(method, parts[2:], org, actions, body)
        raise error(404, "Not found")

    def _login(self, authorization: str) -> User:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "basic":
            login, _, password = base64.b64decode(value).decode().partition(":")
            user = self.users.get(login)
            if user is not None and user.password == password:
                return user
        raise Refused(401, REFUSED_LOGIN)

    @staticmethod
    def _need(action: str, held: set[str]) -> None:
        if action not in held:
            raise denied(action)

    # -- orgs and their users ---------------------------------------------------------------------
    def _orgs(self, method: str, rest: list[str], user: User, body: Any) -> tuple[int, Any]:
        admin_global = SERVER_ADMIN_GLOBAL if user.server_admin else set()
        if method == "GET" and len(rest) == 2 and rest[0] == "name":
            self._need("orgs:read", admin_global)
            found = self.org(rest[1])
            if found is None:
                raise error(404, "Organization not found")
            address = dict.fromkeys(("address1", "address2", "city", "zipCode", "state", "country"), "")
            return 200, {"id": found.id, "name": found.name, "address": address}
        if method == "POST" and not rest:
            self._need("orgs:create", admin_global)
            if self.org(body["name"]) is not None:
                raise error(409, "Organization name taken")
            new = self.add_org(body["name"], {user.login: "Admin"})
            return 200, {"message": "Organization created", "orgId": new.id}
        if len(rest) >= 2 and rest[1] == "users" and rest[0].isdigit():
            return self._org_users(method, rest[2:], int(rest[0]), self.orgs.get(int(rest[0])), user, body)
        raise error(404, "Not found")

    def _org_users(
        self, method: str, rest: list[str], org_id: int, org: Org | None, user: User, body: Any
    ) -> tuple[int, Any]:
        """An unknown org (``org`` None) is answered as the store answers it: an org with no members."""
        held = SERVER_ADMIN_IN_ORG if user.server_admin else set()
        members = org.members if org is not None else {}
        if method == "GET" and not rest:
            self._need("org.users:read", held)
            return 200, [
                {"orgId": org_id, "userId": u.id, "login": u.login, "email": "", "name": u.login, "role": role}
                for login, role in members.items()
                for u in [self.users[login]]
            ]
        if method == "POST" and not rest:
            self._need("org.users:add", held)
            if body.get("role") not in ROLES:
                raise error(400, "Invalid role specified")
            added = self.users.get(body.get("loginOrEmail", ""))
            if added is None:
                raise error(404, "User not found")
            if added.login in members:
                raise error(409, "User is already member of this organization", userId=added.id)
            if org is None:
                raise error(500, "Could not add user to organization")
            org.members[added.login] = body["role"]
            return 200, {"message": "User added to organization", "userId": added.id}
        if method == "PATCH" and len(rest) == 1 and rest[0].isdigit():
            self._need("org.users:write", held)
            if body.get("role") not in ROLES:
                raise error(400, "Invalid role specified")
            login = next((u.login for u in self.users.values() if u.id == int(rest[0])), None)
            if org is None or login is None or login not in org.members:
                raise error(500, "Failed update org user")
            if body["role"] != "Admin" and [m for m, r in org.members.items() if r == "Admin"] == [login]:
                raise error(400, "Cannot change role so that there is no organization admin left")
            org.members[login] = body["role"]
            return 200, {"message": "Organization user updated"}
        raise error(404, "Not found")

    # -- datasources ------------------------------------------------------------------------------
    def _datasources(self, method: str, rest: list[str], org: Org | None, held: set[str], body: Any) -> tuple[int, Any]:
        if method == "GET" and len(rest) == 2 and rest[0] == "uid":
            self._need("datasources:read", held)
            assert org is not None
            ds = org.datasources.get(rest[1])
            if ds is None:
                raise error(404, "Data source not found")
            return 200, ds | {"secureJsonFields": dict.fromkeys(org.secrets.get(rest[1], {}), True)}
        if method == "POST" and not rest:
            self._need("datasources:create", held)
            assert org is not None
            if any(d["name"] == body["name"] for d in org.datasources.values()):
                raise error(409, "data source with the same name already exists")
            if body.get("uid") in org.datasources:
                raise error(409, "data source with the same uid already exists")
            ds = self._store_datasource(org, body | {"uid": body.get("uid") or uuid.uuid4().hex[:14]}, self.new_id(), 1)
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added", "name": ds["name"]}
        if method == "PUT" and len(rest) == 2 and rest[0] == "uid":
            self._need("datasources:write", held)
            assert org is not None
            cur = org.datasources.get(rest[1])
            if cur is None:
                raise error(404, "Data source not found")
            if body.get("version") and cur["version"] > body["version"]:
                raise error(409, "Datasource has already been updated by someone else. Please reload and try again")
            ds = self._store_datasource(org, body | {"uid": rest[1]}, cur["id"], cur["version"] + 1)
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource updated", "name": ds["name"]}
        raise error(404, "Not found")

    @staticmethod
    def _store_datasource(org: Org, body: dict[str, Any], ds_id: int, version: int) -> dict[str, Any]:
        ds = {k: body[k] for k in DATASOURCE_KEYS if k in body}
        ds |= {"id": ds_id, "orgId": org.id, "version": version, "readOnly": False}
        ds.setdefault("jsonData", {})
        org.datasources[ds["uid"]] = ds
        org.secrets[ds["uid"]] = org.secrets.get(ds["uid"], {}) | (body.get("secureJsonData") or {})
        return ds

    # -- dashboards -------------------------------------------------------------------------------
    def _dashboards(self, method: str, rest: list[str], org: Org | None, held: set[str], body: Any) -> tuple[int, Any]:
        if method == "GET" and len(rest) == 2 and rest[0] == "uid":
            self._need("dashboards:read", held)
            assert org is not None
            d = org.dashboards.get(rest[1])
            if d is None:
                raise error(404, "Dashboard not found")
            return 200, {"dashboard": d, "meta": {"slug": _slug(d["title"]), "folderUid": "", "version": d["version"]}}
        if method == "POST" and rest == ["db"]:
            if not held & {"dashboards:create", "dashboards:write"}:
                raise denied("any of dashboards:create, dashboards:write")
            assert org is not None
            model = dict(body["dashboard"])
            if not model.get("title"):
                raise Refused(400, {"message": "Dashboard title cannot be empty", "status": "empty-name"})
            uid = model.get("uid") or uuid.uuid4().hex[:14]
            cur = org.dashboards.get(uid)
            if cur is not None and model.get("id") and model["id"] != cur["id"]:
                raise error(400, "A dashboard with the same uid already exists")
            if cur is not None and model.get("version") != cur["version"] and not body.get("overwrite"):
                raise Refused(
                    412, {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"}
                )
            model |= {
                "uid": uid,
                "id": cur["id"] if cur else self.new_id(),
                "version": cur["version"] + 1 if cur else 1,
            }
            org.dashboards[uid] = model
            slug = _slug(model["title"])
            return 200, {
                "folderUid": "", "id": model["id"], "slug": slug, "status": "success", "uid": uid,
                "url": f"/d/{uid}/{slug}", "version": model["version"],
            }  # fmt: skip
        raise error(404, "Not found")


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


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

    do_GET = do_POST = do_PUT = do_PATCH = _serve
