"""The tokens `gpulse setup --api v3` makes on InfluxDB 3 Enterprise: one that writes for the nodes, one that reads for Grafana.

Enterprise gives a token permissions on named databases (``POST /api/v3/enterprise/configure/token``,
InfluxData's docs ``influxdb3/enterprise/admin/tokens/resource/create``; the body names
``resource_names``: the ``resource_identifier`` that older docs showed is refused, docs-v2#7063).
The permission model is ``influxdb3_authz/src/permissions.rs``. Setup makes two tokens, by name:

* ``<db>-nodes``: ``write`` on the raw database, where agents and training runs write, and nothing
  else to read; plus ``system:ping:read``, because every gpulse command asks ``/ping`` first and
  Enterprise answers it only to a token allowed to (docs ``content/shared/identify-version.md``;
  ``SystemResourceIdentifier::PING``);
* ``<db>-grafana``: ``read`` on the three tier databases, plus ``system:ping:read``.

The server shows a token's string once, when it makes it, and keeps a hash (``system.tokens`` lists
the name and the hash's first 9 hex digits: ``influxdb3_system_tables/src/tokens.rs``). So setup
writes the string to the file given (0600, never printed), and a later run finds the token by name,
checks the file against the hash, and changes nothing. A token whose file is lost cannot be written
again: setup stops and says to run it with ``--rotate-tokens``, which deletes gpulse's tokens
(``DELETE /api/v3/configure/token``) and makes new ones. An expired token is made again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulse.influx.engine_plugin import database_name
from gpulse.influx.setup.common import SetupError, SetupReport
from gpulse.influx.setup.v2 import read_secret, write_secret
from gpulse.influx.tiers import ALL_TIERS

if TYPE_CHECKING:
    from gpulse.influx.setup.v3 import AdminAPIv3

INTERNAL_DB = "_internal"  # where system.tokens, system.databases and system.plugin_files live (INTERNAL_DB_NAME)
CREATE_PATH = "/api/v3/enterprise/configure/token"
DELETE_PATH = "/api/v3/configure/token"
ROTATE_FLAG = "--rotate-tokens"
NODE_FLAG = "--node-token-file"
GRAFANA_FLAG = "--grafana-token-file"


@dataclass(frozen=True)
class Permission:
    """One permission of a token: a resource type (``db`` or ``system``), its names and the actions on them."""

    resource_type: str
    names: tuple[str, ...]
    actions: tuple[str, ...]

    def json(self) -> dict[str, Any]:
        return {"resource_type": self.resource_type, "resource_names": list(self.names), "actions": list(self.actions)}

    def __str__(self) -> str:
        """As ``influxdb3 create token --permission`` takes it: ``db:DB1,DB2:read``."""
        return f"{self.resource_type}:{','.join(self.names)}:{','.join(self.actions)}"


PING = Permission("system", ("ping",), ("read",))


@dataclass(frozen=True)
class WantedToken:
    """A token setup keeps: who uses it, its name on the server, its permissions, the file that holds it."""

    role: str
    name: str
    permissions: tuple[Permission, ...]
    path: Path | None
    flag: str

    def describe(self) -> str:
        return f"{self.role} token {self.name} ({' '.join(map(str, self.permissions))})"


@dataclass(frozen=True)
class ListedToken:
    """A row of ``system.tokens``: the name, the first hex digits of the SHA-512 of its string, its expiry."""

    name: str
    hash_prefix: str
    expiry: datetime | None

    @staticmethod
    def from_row(row: dict[str, Any]) -> ListedToken:
        return ListedToken(str(row["name"]), str(row.get("hash") or ""), _instant(row.get("expiry"), row["name"]))

    def expired(self, now: datetime) -> bool:
        return self.expiry is not None and self.expiry <= now

    def holds(self, token: str) -> bool:
        """Is ``token`` this one? Without a listed hash (a server started without auth) any token is taken for it."""
        return hashlib.sha512(token.encode()).hexdigest().startswith(self.hash_prefix)


def _instant(value: Any, name: str) -> datetime | None:
    """A time of ``system.tokens``: arrow's JSON writes a timestamp without zone, which is UTC."""
    if value is None or value == "":
        return None
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise SetupError(f"system.tokens lists expiry {value!r} for token {name}, which is not a time") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def wanted_tokens(bucket: str, node_file: str | None, grafana_file: str | None) -> list[WantedToken]:
    """The nodes' token (write on the raw database) and Grafana's (read on every tier), each where its flag says."""
    tiers = tuple(database_name(bucket, t) for t in ALL_TIERS)
    return [
        WantedToken(
            "nodes'", f"{bucket}-nodes", (Permission("db", (tiers[0],), ("write",)), PING),
            Path(node_file) if node_file else None, NODE_FLAG,
        ),
        WantedToken(
            "Grafana's", f"{bucket}-grafana", (Permission("db", tiers, ("read",)), PING),
            Path(grafana_file) if grafana_file else None, GRAFANA_FLAG,
        ),
    ]  # fmt: skip


def _file_holds(path: Path, listed: ListedToken) -> bool:
    """Whether ``path`` holds the token the server lists (an empty or missing file holds none)."""
    held = read_secret(path)
    return bool(held) and listed.holds(held)


def ensure_resource_tokens(
    api: AdminAPIv3, wanted: list[WantedToken], rotate: bool, report: SetupReport, now: datetime | None = None
) -> None:
    """Make each wanted token that is missing, expired, or (with ``rotate``) there; keep the others."""
    now = now or datetime.now(UTC)
    listed = {t.name: t for t in map(ListedToken.from_row, api.system(INTERNAL_DB, "tokens"))}
    kept = {t.name for t in wanted if t.name in listed and not rotate and not listed[t.name].expired(now)}
    lost = [t for t in wanted if t.path and t.name in kept and not _file_holds(t.path, listed[t.name])]
    if lost:
        raise SetupError(_lost_message(api.conn.url or "", lost))
    for t in wanted:
        if t.path is None:
            report.add("unchanged", f"{t.describe()}: not made, no {t.flag} given")
            continue
        if t.name in kept:
            report.add("unchanged", f"{t.describe()} in {t.path}")
            continue
        cur = listed.get(t.name)
        if cur is not None:
            api.call("DELETE", DELETE_PATH, f"delete the previous token {t.name}", params={"token_name": t.name})
        body = {"token_name": t.name, "permissions": [p.json() for p in t.permissions]}
        created = api.call("POST", CREATE_PATH, f"create the {t.describe()}", json=body)
        token = created.get("token") if isinstance(created, dict) else None
        if not token:
            raise SetupError(
                f"InfluxDB created token {t.name} but returned no token string; run setup with {ROTATE_FLAG}"
            )
        write_secret(t.path, str(token))
        why = "" if cur is None else " (the previous one had expired)" if cur.expired(now) else " (rotated)"
        report.add("created" if cur is None else "updated", f"{t.describe()} in {t.path}{why}")


def _lost_message(url: str, lost: list[WantedToken]) -> str:
    which = "; ".join(
        f"{t.describe()} exists on {url} but {t.path} is missing, empty or holds another token" for t in lost
    )
    return (
        f"{which}. InfluxDB keeps only a hash of a token, so it cannot be written again: run "
        f"`gpulse setup --api v3 {ROTATE_FLAG}` with the same connection and token-file flags, which deletes "
        "gpulse's tokens and makes new ones, then give the new files to the nodes and to Grafana"
    )
