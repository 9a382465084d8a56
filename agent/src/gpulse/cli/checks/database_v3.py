"""The database checks on InfluxDB 3 (``--api v3``): what ``gpulse setup --api v3`` makes, read back.

InfluxDB 3 has no buckets, DBRP mappings, retention policies, tasks nor continuous queries: each tier is
its own database with its retention period, and the processing engine's triggers run the downsampling
plugin. So: the token lists the databases (``GET /api/v3/configure/database``), the agent's database
exists, the tiers' databases exist (``system.databases``: their retention), and the triggers and the
plugin file are there as this gpulse generates them (``system.processing_engine_triggers``,
``..._trigger_arguments``, ``system.plugin_files``; ``influxdb3_system_tables/src``).

On Enterprise a resource token (the nodes' write-only one, :mod:`gpulse.influx.setup.tokens_v3`) may
be refused the databases list (403) although the server knows it (the probe passed with it): the token
check says so and passes, and the database checks, which that token cannot make, are skipped.
"""

from __future__ import annotations

from typing import Any

from gpulse.cli.checks.answers import get_json
from gpulse.cli.checks.base import Context, Result, fail, ok, skip

#: the databases list was refused to a token the server knows (403): an Enterprise resource token
NOT_LISTED = object()


def _get(ctx: Context, path: str, params: dict[str, Any], name: str) -> Any:
    return get_json(ctx, path, params, name=name)


def _system(ctx: Context, db: str, table: str, name: str) -> list[dict[str, Any]] | Result:
    rows = _get(ctx, "/api/v3/query_sql", {"db": db, "q": f"SELECT * FROM system.{table}", "format": "json"}, name)
    return rows if isinstance(rows, Result) else list(rows or [])


def _databases(ctx: Context, name: str) -> Any:
    """The database names, a failed :class:`Result`, or :data:`NOT_LISTED` (Enterprise refused this token the list)."""
    forbidden = NOT_LISTED if getattr(ctx.server, "edition", "") == "enterprise" else None
    rows = get_json(ctx, "/api/v3/configure/database", {"format": "json"}, name=name, forbidden=forbidden)
    return rows if isinstance(rows, Result) or rows is NOT_LISTED else {r.get("iox::database") for r in rows or []}


def check_token(ctx: Context) -> Result:
    names = _databases(ctx, "token")
    if isinstance(names, Result):
        return names
    conn = ctx.conn
    if names is NOT_LISTED:
        return ok(
            "token",
            f"token from {conn.token_source} accepted on /ping; it may not list the databases (an InfluxDB 3 "
            "Enterprise resource token, like the nodes' write-only one): a write shows what it may write",
        )
    return ok("token", f"token from {conn.token_source} accepted" if conn.token else "the server asks for no token")


def check_bucket(ctx: Context, setup_fix: str) -> Result:
    from gpulse.influx.server import missing_database

    names = _databases(ctx, "bucket")
    if isinstance(names, Result):
        return names
    if names is NOT_LISTED:
        return skip("bucket", "not checked: this token may not list the databases (an admin token can)")
    conn = ctx.conn
    if conn.bucket not in names:
        return fail("bucket", missing_database(ctx.conn).detail, setup_fix)
    return ok("bucket", f"database {conn.bucket!r} exists")


def check_layout(ctx: Context, setup_fix: str) -> Result:
    from gpulse.influx.engine_plugin import database_name
    from gpulse.influx.setup.common import influx_duration
    from gpulse.influx.setup.v3 import INTERNAL_DB
    from gpulse.influx.tiers import ALL_TIERS

    rows = _system(ctx, INTERNAL_DB, "databases", "layout")
    if isinstance(rows, Result):
        return rows
    have = {
        r.get("database_name"): int(r.get("retention_period_ns") or 0) // 10**9 for r in rows if not r.get("deleted")
    }
    want = [database_name(ctx.conn.bucket, t) for t in ALL_TIERS]
    missing = [n for n in want if n not in have]
    if missing:
        return fail(
            "layout", f"database(s) {', '.join(missing)} missing: the downsampled tiers have nowhere to go", setup_fix
        )
    spans = ", ".join(f"{n} ({influx_duration(have[n]).replace('INF', 'forever')})" for n in want)
    return ok("layout", f"databases {spans}")


def check_downsampling(ctx: Context, setup_fix: str) -> Result:
    from gpulse.influx.engine_plugin import Edition, plugin_text, triggers
    from gpulse.influx.setup.v3 import INTERNAL_DB, PLUGIN_FILE, existing_triggers_from_rows

    db = ctx.conn.bucket
    listed = _system(ctx, db, "processing_engine_triggers", "downsampling")
    if isinstance(listed, Result):
        return listed
    arguments = _system(ctx, db, "processing_engine_trigger_arguments", "downsampling")
    if isinstance(arguments, Result):
        return arguments
    have = existing_triggers_from_rows(listed, arguments)
    edition = Edition(getattr(ctx.server, "edition", "") or "core")
    want = triggers(edition, db)
    missing = [t.name for t in want if t.name not in have]
    if missing:
        return fail("downsampling", f"trigger(s) {', '.join(missing)} missing on {db!r}", setup_fix)
    differ = [t.name for t in want if not have[t.name].matches(t)]
    if differ:
        return fail(
            "downsampling",
            f"trigger(s) {', '.join(differ)} differ from this gpulse's ({edition.value}) or are disabled",
            setup_fix,
        )
    files = _system(ctx, INTERNAL_DB, "plugin_files", "downsampling")
    if isinstance(files, Result):
        return files
    size = len(plugin_text().encode("utf-8"))
    sizes = {int(r.get("size_bytes") or -1) for r in files if r.get("file_name") == PLUGIN_FILE}
    if sizes != {size}:
        found = "is missing from the plugin directory" if not sizes else "differs from this gpulse's"
        return fail("downsampling", f"the plugin file {PLUGIN_FILE} {found}", setup_fix)
    specs = ", ".join(f"{t.name} ({t.specification})" for t in want)
    return ok("downsampling", f"triggers {specs} on {db!r} run {PLUGIN_FILE} ({edition.value} look-back)")
