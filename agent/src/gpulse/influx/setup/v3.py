"""`gpulse setup --api v3` on InfluxDB 3 Core or Enterprise: databases, the downsampling plugin, its triggers, tokens.

Creates, or brings up to date:

* one database per tier, each with its retention period (retention is per database in 3.x):
  ``<db>`` (raw), ``<db>/1m`` and ``<db>/1h`` (:func:`gpulse.influx.engine_plugin.database_name`);
* the plugin file ``gpulse_downsample.py`` (:func:`gpulse.influx.engine_plugin.plugin_text`) and its
  triggers (:func:`gpulse.influx.engine_plugin.triggers`, with the edition's look-back);
* the tokens the nodes and Grafana use: on Enterprise, a resource token that writes the raw database
  (``--node-token-file``) and one that reads the tiers (``--grafana-token-file``), made and kept by
  :mod:`gpulse.influx.setup.tokens_v3`; Core has only admin tokens, so the admin token is written there.

Every step reads first (``system.databases``, ``system.plugin_files``, ``system.processing_engine_triggers``
and ``..._trigger_arguments`` through ``/api/v3/query_sql``: ``influxdb3_system_tables/src``) and writes
only on a difference, so a second run sends no mutating request. The server lists a plugin file by
its size only (``plugin_files``, and only the files of triggers), so a changed plugin of the same
size goes unnoticed. Each call names the handler in ``influxdb3_server/src/http.rs`` that answers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulse.influx import engine_plugin
from gpulse.influx.connection import Connection
from gpulse.influx.engine_plugin import Edition, Trigger, database_name
from gpulse.influx.http import HTTPStatusError, TransportError
from gpulse.influx.server import ServerInfo, ServerProblem, probe_connection
from gpulse.influx.setup.common import SetupError, SetupReport, influx_duration, retentions
from gpulse.influx.setup.tokens_v3 import (
    GRAFANA_FLAG,
    INTERNAL_DB,
    ROTATE_FLAG,
    ensure_resource_tokens,
    wanted_tokens,
)
from gpulse.influx.setup.v2 import QUERY_TIMEOUT_S, AdminAPI, read_secret, write_secret
from gpulse.influx.tiers import ALL_TIERS, TIERS

PLUGIN_FILE = Path(engine_plugin.PLUGIN_PATH).name
#: ``TriggerSettings`` (``influxdb3_catalog/src/log/versions/v4.rs``): a failed run is logged; the next
#: run's look-back covers its windows again
TRIGGER_SETTINGS = {"run_async": False, "error_behavior": "log"}


@dataclass(frozen=True)
class ExistingTrigger:
    """A row of ``system.processing_engine_triggers`` with its arguments."""

    name: str
    plugin_filename: str
    specification: str
    disabled: bool
    arguments: dict[str, str]

    def matches(self, want: Trigger) -> bool:
        return (self.plugin_filename, self.specification, self.disabled, self.arguments) == (
            PLUGIN_FILE,
            want.specification,
            False,
            want.arguments,
        )


class AdminAPIv3(AdminAPI):
    """The InfluxDB 3 management calls with the admin token; a refusal says what to do."""

    def refusal(self, what: str, status: int, message: str) -> SetupError:
        if status in (401, 403):
            return SetupError(
                f"InfluxDB 3 at {self.conn.url} refused the token from {self.conn.token_source or 'nowhere'} while "
                f"trying to {what} (HTTP {status}{': ' + message if message else ''}): setup needs an admin token "
                "in --token-file"
            )
        return SetupError(f"cannot {what}: HTTP {status} {message}")

    def system(self, db: str, table: str) -> list[dict[str, Any]]:
        """``SELECT * FROM system.<table>`` of ``db`` (H ``query_sql``), as JSON rows."""
        rows = self.call(
            "GET", "/api/v3/query_sql", f"read system.{table}", params={"db": db, "q": f"SELECT * FROM system.{table}", "format": "json"}
        )  # fmt: skip
        return rows if isinstance(rows, list) else []


def check_server(conn: Connection) -> ServerInfo:
    """InfluxDB 3 that takes the token; its probe (edition and version)."""
    try:
        return probe_connection(conn, admin=True)
    except ServerProblem as e:
        raise SetupError(str(e)) from None


# -- databases -------------------------------------------------------------------------------------
def ensure_databases(conn: Connection, api: AdminAPIv3, secs: dict[str, int], report: SetupReport) -> None:
    """H ``create_database`` (POST, 409 when it exists) and ``update_database`` (PUT: sets the retention
    period, or clears it when none is given)."""
    have = {
        r["database_name"]: int(r.get("retention_period_ns") or 0) // 10**9
        for r in api.system(INTERNAL_DB, "databases")
        if not r.get("deleted")
    }
    for tier in ALL_TIERS:
        name, want = database_name(conn.bucket, tier), secs[tier]
        what = f"database {name} (retention {influx_duration(want)})"
        body: dict[str, Any] = {"db": name}
        if want:
            body["retention_period"] = influx_duration(want)  # humantime reads 30d, 400d
        if name not in have:
            api.call("POST", "/api/v3/configure/database", f"create {what}", json=body)
            report.add("created", what)
        elif have[name] != want:
            api.call("PUT", "/api/v3/configure/database", f"update {what}", json=body)
            report.add("updated", what)
        else:
            report.add("unchanged", what)


# -- the plugin and its triggers -------------------------------------------------------------------
def ensure_plugin(api: AdminAPIv3, report: SetupReport) -> None:
    """H ``create_plugin_file`` (POST: write the file) when no trigger uses it yet, ``update_plugin_file``
    (PUT: replace the file of the trigger named) when its size differs from the generated plugin's."""
    content = engine_plugin.plugin_text()
    size = len(content.encode("utf-8"))
    files = [r for r in api.system(INTERNAL_DB, "plugin_files") if r.get("file_name") == PLUGIN_FILE]
    what = f"plugin file {PLUGIN_FILE}"
    if not files:
        body = {"plugin_name": PLUGIN_FILE, "content": content}
        api.call("POST", "/api/v3/plugins/files", f"upload {what}", json=body)
        report.add("created", what)
    elif any(int(r.get("size_bytes") or -1) != size for r in files):
        body = {"plugin_name": files[0]["plugin_name"], "content": content}
        api.call("PUT", "/api/v3/plugins/files", f"replace {what}", json=body)
        report.add("updated", what)
    else:
        report.add("unchanged", what)


def existing_triggers(api: AdminAPIv3, db: str) -> dict[str, ExistingTrigger]:
    triggers = api.system(db, "processing_engine_triggers")
    return existing_triggers_from_rows(triggers, api.system(db, "processing_engine_trigger_arguments"))


def existing_triggers_from_rows(
    triggers: list[dict[str, Any]], arguments: list[dict[str, Any]]
) -> dict[str, ExistingTrigger]:
    """The rows of ``system.processing_engine_triggers`` and ``..._trigger_arguments`` as typed records."""
    args: dict[str, dict[str, str]] = {}
    for r in arguments:
        args.setdefault(r["trigger_name"], {})[r["argument_key"]] = r["argument_value"]
    return {
        r["trigger_name"]: ExistingTrigger(
            r["trigger_name"], r["plugin_filename"], r["trigger_specification"], bool(r.get("disabled")),
            args.get(r["trigger_name"], {}),
        )
        for r in triggers
    }  # fmt: skip


def ensure_triggers(conn: Connection, api: AdminAPIv3, edition: Edition, report: SetupReport) -> None:
    """H ``configure_processing_engine_trigger`` (POST) for a missing trigger; a differing one is deleted
    (``delete_processing_engine_trigger`` with ``force``: the catalog cannot change a trigger) and made again."""
    db = conn.bucket
    have = existing_triggers(api, db)
    for t in engine_plugin.triggers(edition, db):
        what = f"trigger {t.name} ({t.specification}) on {db}"
        cur = have.get(t.name)
        if cur is not None and cur.matches(t):
            report.add("unchanged", what)
            continue
        if cur is not None:
            params = {"db": db, "trigger_name": t.name, "force": "true"}
            api.call("DELETE", "/api/v3/configure/processing_engine_trigger", f"delete {what}", params=params)
        body = {
            "db": db,
            "plugin_filename": PLUGIN_FILE,
            "trigger_name": t.name,
            "trigger_specification": t.specification,
            "trigger_arguments": t.arguments,
            "trigger_settings": TRIGGER_SETTINGS,
            "disabled": False,
        }
        api.call("POST", "/api/v3/configure/processing_engine_trigger", f"create {what}", json=body)
        report.add("updated" if cur is not None else "created", what)


# -- tokens ------------------------------------------------------------------------------------------
def _token_works(conn: Connection, token: str) -> bool:
    """Does ``token`` read the databases list (H ``show_databases``)? 401/403 mean it does not."""
    with AdminAPIv3(conn, token) as api:
        try:
            api.http.call("GET", "/api/v3/configure/database", params={"format": "json"})
        except HTTPStatusError as e:
            if e.status in (401, 403):
                return False
            raise api.refusal("check a token file", e.status, e.response.message()) from None
        except TransportError as e:
            raise SetupError(f"cannot reach {conn.url} to check a token file: {e.detail}") from None
    return True


def ensure_admin_token_files(conn: Connection, files: dict[str, str | None], report: SetupReport) -> None:
    """Core has only admin tokens: each file given (whose token -> path) gets the admin token, unless it
    already holds a token that works."""
    for role, token_file in files.items():
        if not token_file:
            report.add("unchanged", f"{role} token (no {GRAFANA_FLAG} given)")
            continue
        path = Path(token_file)
        current = read_secret(path)
        if current and _token_works(conn, current):
            report.add("unchanged", f"{role} token in {path}")
            continue
        write_secret(path, conn.token)
        report.add("created", f"{role} token in {path}: the admin token (InfluxDB 3 Core has only admin tokens)")


def setup_v3(
    conn: Connection,
    *,
    raw_retention: str = "30d",
    minute_retention: str | None = None,
    grafana_token_file: str | None = None,
    node_token_file: str | None = None,
    rotate_tokens: bool = False,
) -> SetupReport:
    """Create or bring up to date everything gpulse needs on an InfluxDB 3 server."""
    secs = retentions(raw_retention, minute_retention)
    info = check_server(conn)
    edition = Edition(info.edition)
    report = SetupReport()
    with AdminAPIv3(conn) as api:
        ensure_databases(conn, api, secs, report)
        ensure_plugin(api, report)
        ensure_triggers(conn, api, edition, report)
        if edition is Edition.ENTERPRISE:  # the tokens name the databases, so they come after them
            wanted = wanted_tokens(conn.bucket, node_token_file, grafana_token_file)
            ensure_resource_tokens(api, wanted, rotate_tokens, report)
    if edition is not Edition.ENTERPRISE:
        files = {"Grafana's": grafana_token_file} | ({"nodes'": node_token_file} if node_token_file else {})
        ensure_admin_token_files(conn, files, report)
        if rotate_tokens:
            report.add("unchanged", f"tokens: {ROTATE_FLAG} is for InfluxDB 3 Enterprise (Core has only admin tokens)")
    return report


def downsample_now(conn: Connection, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """Run the plugin's aggregation once over ``[start, end)``, 1m then 1h, through its ``request:`` trigger
    (``/api/v3/engine/gpulse_recompute``, H ``processing_engine_request_plugin``); each tier's answer."""
    out = []
    with AdminAPIv3(conn) as api:
        for tier in TIERS:
            params = {"tier": tier.name, "start": str(start_ns), "stop": str(end_ns)}
            path = f"/api/v3/engine/{engine_plugin.RECOMPUTE_PATH}"
            what = f"downsample to {database_name(conn.bucket, tier.name)}"
            out.append(api.call("GET", path, what, params=params, timeout_s=QUERY_TIMEOUT_S))
    return out
