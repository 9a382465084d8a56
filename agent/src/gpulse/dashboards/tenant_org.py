"""A tenant's Grafana place: its own organisation, with datasources that hold only its read credential.

In Grafana OSS every member of an org can query every datasource of that org (per-datasource
permissions are Enterprise/Cloud only), so a tenant is isolated by an org of its own whose
datasources carry the tenant's read-only InfluxDB credential. File provisioning cannot create
orgs (grafana/grafana#12119), so this goes through Grafana's HTTP API with a server admin's
``user:password``, re-runnably: each object is read first and written only on a difference.

* the org: ``GET /api/orgs/name/:name``, else ``POST /api/orgs`` (the creator becomes its Admin);
* the admin an Admin of it: the requests below name the org with ``X-Grafana-Org-Id``, and Grafana
  looks the user up in that org, so a server admin who is not its member (an org made by someone
  else) is refused there. ``GET /api/orgs/:id/users``, then ``POST /api/orgs/:id/users`` (not a
  member) or ``PATCH /api/orgs/:id/users/:userId`` (a lesser role), which a server admin may do in any org;
* one InfluxQL datasource per tier, the same uids as the fleet's so the dashboards work unchanged:
  ``GET /api/datasources/uid/:uid``, then ``POST /api/datasources`` or ``PUT /api/datasources/uid/:uid``.
  Grafana never answers a secret back (``secureJsonFields`` says only that one is set), so the
  credential is sent when a datasource is created, when it changes, or when ``credential_changed``
  (setup made new InfluxDB credentials in the same run);
* the dashboards: ``GET /api/dashboards/uid/:uid``, then ``POST /api/dashboards/db`` with ``overwrite``
  when the stored model differs from the generated one (``id`` and ``version`` are Grafana's own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpulse.dashboards import dashboards
from gpulse.dashboards.datasources import tier_datasources
from gpulse.influx.http import HttpClient, TransportError, basic_auth
from gpulse.influx.setup.common import SetupError, SetupReport

#: Fields Grafana keeps for a datasource that setup also sets (the rest are Grafana's: id, orgId, version...).
DATASOURCE_FIELDS = ("name", "type", "access", "url", "isDefault", "jsonData", "user")


@dataclass(frozen=True)
class TenantGrafana:
    """What the tenant's org needs: its name, where Grafana reaches InfluxDB, and the read credential."""

    org: str
    influx_url: str
    database: str
    #: v2/v3: a token (sent as ``Authorization: Token``); v1: ``user:password``
    read_credential: str
    api: str

    def datasources(self) -> list[dict[str, Any]]:
        header = self.api != "v1"
        out = tier_datasources(self.influx_url, lambda _tier: self.database, header=header)
        if not header:
            user = self.read_credential.partition(":")[0]
            out = [ds | {"user": user} for ds in out]
        return out

    def secure(self) -> dict[str, str]:
        if self.api == "v1":
            return {"password": self.read_credential.partition(":")[2]}
        return {"httpHeaderValue1": f"Token {self.read_credential}"}


class GrafanaAdmin:
    """Grafana's HTTP API as a server admin; a refusal becomes a :class:`SetupError` that says what to do."""

    def __init__(self, url: str, credentials: str, timeout_s: float = 10.0) -> None:
        user, sep, password = credentials.partition(":")
        if not sep:
            raise SetupError("the Grafana admin file must hold user:password of a Grafana server admin")
        self.url, self.login = url, user
        self.http = HttpClient(url, authorization=basic_auth(user, password), timeout_s=timeout_s)

    def __enter__(self) -> GrafanaAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def call(self, method: str, path: str, what: str, *, org_id: int | None = None, json: Any = None) -> Any | None:
        """The decoded answer, or None for a 404."""
        headers = {"X-Grafana-Org-Id": str(org_id)} if org_id is not None else None
        try:
            r = self.http.request(method, path, json=json, headers=headers)
        except TransportError as e:
            raise SetupError(f"cannot reach Grafana at {self.url} to {what}: {e.detail}") from None
        if r.status == 404:
            return None
        if r.status in (401, 403):
            raise SetupError(
                f"Grafana refused to {what} (HTTP {r.status} {r.message()}): the admin file must hold user:password "
                "of a Grafana server admin (e.g. the compose stack's admin)"
            )
        if not r.ok:
            raise SetupError(f"Grafana could not {what}: HTTP {r.status} {r.message()}")
        return r.json()


def setup_grafana_tenant(
    admin: GrafanaAdmin, tenant: TenantGrafana, report: SetupReport, *, credential_changed: bool = False
) -> int:
    """Find or create the tenant's org, its datasources and dashboards; returns the org id."""
    found = admin.call("GET", f"/api/orgs/name/{tenant.org}", f"look up org {tenant.org}")
    if found is None:
        org_id = int(admin.call("POST", "/api/orgs", f"create org {tenant.org}", json={"name": tenant.org})["orgId"])
        report.add("created", f"Grafana org {tenant.org} ({org_id})")
    else:
        org_id = int(found["id"])
        report.add("unchanged", f"Grafana org {tenant.org} ({org_id})")
    _ensure_admin_member(admin, org_id, tenant.org, report)
    for ds in tenant.datasources():
        _ensure_datasource(admin, org_id, tenant, ds, credential_changed, report)
    for dashboard in dashboards():
        _ensure_dashboard(admin, org_id, tenant.org, dashboard.to_json(), report)
    return org_id


def _ensure_admin_member(admin: GrafanaAdmin, org_id: int, org: str, report: SetupReport) -> None:
    """The admin is an Admin of the org, so that the datasource and dashboard calls in it are allowed."""
    users = admin.call("GET", f"/api/orgs/{org_id}/users", f"list the users of org {org}") or []
    me = next((u for u in users if u.get("login") == admin.login), None)
    what = f"Grafana user {admin.login} an Admin of org {org}"
    if me is None:
        body = {"loginOrEmail": admin.login, "role": "Admin"}
        admin.call("POST", f"/api/orgs/{org_id}/users", f"add {admin.login} to org {org}", json=body)
        report.add("created", what)
    elif me.get("role") != "Admin":
        path = f"/api/orgs/{org_id}/users/{me['userId']}"
        admin.call("PATCH", path, f"make {admin.login} an Admin of org {org}", json={"role": "Admin"})
        report.add("updated", f"{what} (was {me.get('role')})")


def _ensure_datasource(
    admin: GrafanaAdmin, org_id: int, tenant: TenantGrafana, want: dict[str, Any], secret: bool, report: SetupReport
) -> None:
    uid, what = want["uid"], f"Grafana datasource {want['name']} in org {tenant.org} (database {tenant.database})"
    have = admin.call("GET", f"/api/datasources/uid/{uid}", f"look up datasource {uid}", org_id=org_id)
    body = want | {"secureJsonData": tenant.secure()}
    if have is None:
        admin.call("POST", "/api/datasources", f"create datasource {uid}", org_id=org_id, json=body)
        report.add("created", what)
    elif secret or any(have.get(k) != want.get(k) for k in DATASOURCE_FIELDS if k in want):
        admin.call("PUT", f"/api/datasources/uid/{uid}", f"update datasource {uid}", org_id=org_id, json=body)
        report.add("updated", what + (" (new credential)" if secret else ""))
    else:
        report.add("unchanged", what)


def _ensure_dashboard(admin: GrafanaAdmin, org_id: int, org: str, want: dict[str, Any], report: SetupReport) -> None:
    uid, what = want["uid"], f"Grafana dashboard {want['title']} in org {org}"
    have = admin.call("GET", f"/api/dashboards/uid/{uid}", f"look up dashboard {uid}", org_id=org_id)
    if have is not None and _model(have["dashboard"]) == _model(want):
        report.add("unchanged", what)
        return
    body = {"dashboard": want | {"id": None, "version": None}, "overwrite": True, "message": "gpulse setup --tenant"}
    admin.call("POST", "/api/dashboards/db", f"save dashboard {uid}", org_id=org_id, json=body)
    report.add("created" if have is None else "updated", what)


def _model(dashboard: dict[str, Any]) -> str:
    """The dashboard without what Grafana assigns (``id``, ``version``), comparable as text."""
    return json.dumps({k: v for k, v in dashboard.items() if k not in ("id", "version")}, sort_keys=True)
