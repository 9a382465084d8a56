"""``gpulse setup --tenant NAME``: one team's own database and its two credentials.

A tenant gets the fleet's layout under its own name (2.x bucket ``gpulse-NAME`` with its ``_1m``/``_1h``
tiers, DBRP mappings and tasks; 1.x database ``gpulse_NAME`` with its retention policies and
continuous queries), a write-only credential for its nodes or jobs and a read-only one for its
dashboards. The server enforces the split: a tenant's credentials hold permissions on its own
bucket/database only, so they can neither read nor write another's.

Credentials go to files (0600) under ``<secrets-dir>/tenants/NAME/`` and are never printed:
``influx-write-token`` and ``influx-read-token`` (2.x: a token; 1.x: ``user:password``, as every
``--token-file`` for ``--api v1``). A re-run keeps them: InfluxDB 2.8+ stores tokens hashed
(``--use-hashed-tokens``, ``cmd/influxd/launcher/cmd.go``), so a token can be captured only when it is
created. When the credential exists on the server but its file is lost, setup stops and says to
rotate (``--rotate-tenant-tokens``): new credentials, files rewritten, the old 2.x tokens deleted.

InfluxDB 3 Core has only admin tokens, so it cannot give a tenant a token bounded to its database.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from gpulse.influx.connection import Connection
from gpulse.influx.query import InfluxQL
from gpulse.influx.quoting import quote_ident
from gpulse.influx.setup.common import SetupError, SetupReport, retentions
from gpulse.influx.setup.v1 import run_statement, setup_v1
from gpulse.influx.setup.v2 import (
    AdminAPI,
    Bucket,
    Org,
    check_server,
    ensure_buckets,
    ensure_dbrps,
    ensure_tasks,
    find_org,
    read_secret,
    write_secret,
)
from gpulse.influx.tiers import RAW

#: A tenant name becomes part of bucket, database, user and Grafana org names: keep it plain.
TENANT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
WRITE_FILE = "influx-write-token"
READ_FILE = "influx-read-token"
ROTATE_FLAG = "--rotate-tenant-tokens"


@dataclass(frozen=True)
class TenantPlace:
    """Where a tenant's points live and where its credentials are kept."""

    name: str
    secrets_dir: Path

    @property
    def bucket(self) -> str:
        """2.x bucket ``gpulse-NAME`` (its tiers ``gpulse-NAME_1m``, ``gpulse-NAME_1h``)."""
        return f"gpulse-{self.name}"

    @property
    def database(self) -> str:
        """1.x database ``gpulse_NAME``."""
        return f"gpulse_{self.name}"

    @property
    def folder(self) -> Path:
        return self.secrets_dir / "tenants" / self.name

    @property
    def write_file(self) -> Path:
        return self.folder / WRITE_FILE

    @property
    def read_file(self) -> Path:
        return self.folder / READ_FILE


def tenant_place(name: str, secrets_dir: str | Path = "secrets") -> TenantPlace:
    if not TENANT_NAME.fullmatch(name):
        raise SetupError(
            f"tenant name {name!r} is not allowed: use 1-40 lower-case letters, digits, '-' or '_', starting with a letter"
        )
    return TenantPlace(name, Path(secrets_dir))


def setup_tenant(
    conn: Connection,
    place: TenantPlace,
    *,
    raw_retention: str = "30d",
    minute_retention: str | None = None,
    rotate: bool = False,
) -> SetupReport:
    """Create or bring up to date the tenant ``place`` on the server ``conn`` (with the admin credentials)."""
    if conn.api == "v1":
        return _setup_v1(conn, place, raw_retention, minute_retention, rotate)
    if conn.api == "v3":
        raise SetupError(
            "InfluxDB 3 Core has only admin tokens (every token reads and writes every database), so it cannot "
            "isolate a tenant; InfluxDB 3 Enterprise has resource tokens (read or write on named databases): "
            "use InfluxDB 2.x or 1.x for tenants, or give each tenant its own InfluxDB 3 Core server"
        )
    return _setup_v2(conn, place, raw_retention, minute_retention, rotate)


def _lost(place: TenantPlace, path: Path, what: str) -> SetupError:
    return SetupError(
        f"tenant {place.name}'s {what} exists on the server but {path} is missing; the server keeps no readable "
        f"copy, so it cannot be written again: run `gpulse setup --tenant {place.name} {ROTATE_FLAG}` (same "
        "connection flags) to make new credentials, then give the new file to the tenant's nodes or Grafana"
    )


# -- InfluxDB 2.x --------------------------------------------------------------------------------------
def _description(place: TenantPlace, action: str) -> str:
    return f"gpulse tenant {place.name}: {action}-only (managed by gpulse setup)"


def _setup_v2(
    conn: Connection, place: TenantPlace, raw_retention: str, minute_retention: str | None, rotate: bool
) -> SetupReport:
    secs = retentions(raw_retention, minute_retention)
    check_server(conn)
    tconn = replace(conn, bucket=place.bucket)
    report = SetupReport()
    with AdminAPI(tconn) as api:
        org = find_org(tconn, api)
        buckets = ensure_buckets(tconn, api, org, secs, report)
        ensure_dbrps(tconn, api, org, buckets, report)
        ensure_tasks(tconn, api, org, report, tenant=place.name)
        listed = api.call("GET", "/api/v2/authorizations", "list authorizations", params={"orgID": org.id})
        auths = listed.get("authorizations") or []
        # write on the raw bucket (where points arrive); read on the raw bucket and its tiers (dashboards)
        _ensure_token(api, org, place, "write", [buckets[RAW]], place.write_file, auths, rotate, report)
        _ensure_token(api, org, place, "read", list(buckets.values()), place.read_file, auths, rotate, report)
    return report


def _ensure_token(
    api: AdminAPI,
    org: Org,
    place: TenantPlace,
    action: str,
    buckets: list[Bucket],
    path: Path,
    auths: list[dict],
    rotate: bool,
    report: SetupReport,
) -> None:
    """``POST /api/v2/authorizations`` with ``action`` on ``buckets`` only (``authorization/http_server.go``)."""
    description = _description(place, action)
    have = [a["id"] for a in auths if a.get("description") == description]
    what = f"tenant {place.name} {action}-only token ({action} on {', '.join(b.name for b in buckets)}) in {path}"
    has_file = path.exists() and path.read_text(encoding="utf-8").strip() != ""
    if have and not rotate:
        if not has_file:
            raise _lost(place, path, f"{action}-only token")
        report.add("unchanged", what)
        return
    permissions = [{"action": action, "resource": {"type": "buckets", "id": b.id, "orgID": org.id}} for b in buckets]
    body = {"orgID": org.id, "permissions": permissions, "description": description}
    created = api.call("POST", "/api/v2/authorizations", f"create tenant {place.name}'s {action} token", json=body)
    if not created.get("token"):
        raise SetupError(f"InfluxDB created tenant {place.name}'s {action} authorization but returned no token")
    write_secret(path, created["token"])
    report.add("created", what)
    for auth_id in have:  # rotation: the old tokens' only copies are gone, so they can never be used again
        api.call("DELETE", f"/api/v2/authorizations/{auth_id}", f"delete tenant {place.name}'s previous token")
        report.add("deleted", f"tenant {place.name}'s previous {action}-only token {auth_id}")


# -- InfluxDB 1.x --------------------------------------------------------------------------------------
def _setup_v1(
    conn: Connection, place: TenantPlace, raw_retention: str, minute_retention: str | None, rotate: bool
) -> SetupReport:
    report = setup_v1(
        replace(conn, bucket=place.database), raw_retention=raw_retention, minute_retention=minute_retention
    )
    ql = InfluxQL(conn)
    try:
        users = {r["user"] for r in run_statement(ql, "SHOW USERS", "list users")}
        for privilege, path in (("WRITE", place.write_file), ("READ", place.read_file)):
            user = f"{place.database}_{'writer' if privilege == 'WRITE' else 'reader'}"
            _ensure_user(ql, place, user, privilege, path, user in users, rotate, report)
    finally:
        ql.close()
    return report


def _ensure_user(
    ql: InfluxQL,
    place: TenantPlace,
    user: str,
    privilege: str,
    path: Path,
    exists: bool,
    rotate: bool,
    report: SetupReport,
) -> None:
    """A non-admin user with one grant on the tenant's database (1.x ``GRANT``, every retention policy)."""
    text = read_secret(path)
    kept = text.partition(":")[2] if text.startswith(f"{user}:") else ""
    what = f"user {user} ({privilege} on {place.database}) in {path}"
    if exists and not kept and not rotate:
        raise _lost(place, path, f"user {user}")
    password = kept if kept and not rotate else secrets.token_urlsafe(24)  # [A-Za-z0-9_-]: safe in quotes
    if not exists:
        run_statement(ql, f"CREATE USER {quote_ident(user)} WITH PASSWORD '{password}'", f"create user {user}")
        report.add("created", what)
    elif password != kept:
        run_statement(ql, f"SET PASSWORD FOR {quote_ident(user)} = '{password}'", f"set the password of {user}")
        report.add("updated", f"{what} (new password)")
    else:
        report.add("unchanged", what)
    if password != kept:
        write_secret(path, f"{user}:{password}")
    grants = {
        r["database"]: r["privilege"] for r in run_statement(ql, f"SHOW GRANTS FOR {quote_ident(user)}", "list grants")
    }
    if grants.get(place.database) != privilege:
        run_statement(
            ql,
            f"GRANT {privilege} ON {quote_ident(place.database)} TO {quote_ident(user)}",
            f"grant {user} {privilege}",
        )
        report.add("created", f"grant {privilege} on {place.database} to {user}")
