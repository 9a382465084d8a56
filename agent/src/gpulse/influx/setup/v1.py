"""`gpulse setup --api v1`: the database, three retention policies and the continuous queries on InfluxDB 1.x.

Retention policies: ``raw`` (the default, where the agent writes), ``1m`` and ``1h``. The continuous
queries come from :mod:`gpulse.influx.downsample`, so they write exactly the fields the 2.x tasks write.
A continuous query cannot be altered in 1.x: a changed one is dropped and created again. The
server's own rendering of a query is compared with ours after removing quotes, so re-running
setup changes nothing.
"""

from __future__ import annotations

import re

from gpulse.influx.connection import Connection
from gpulse.influx.downsample import continuous_queries, downsampled_measurements, influxql_select
from gpulse.influx.durations import parse_duration
from gpulse.influx.query import InfluxQL, QueryError
from gpulse.influx.quoting import quote_ident
from gpulse.influx.server import refused_credentials
from gpulse.influx.setup.common import (
    SetupError,
    SetupReport,
    influx_duration,
    probe,
    retentions,
    shard_group_seconds,
)
from gpulse.influx.tiers import ALL_TIERS, RAW, TIERS

_MANAGED_CQ = re.compile("gpulse_(" + "|".join(re.escape(t.name) for t in TIERS) + ")_")


def _normalize(statement: str) -> str:
    return " ".join(statement.replace('"', "").split())


def run_statement(ql: InfluxQL, q: str, what: str) -> list[dict]:
    try:
        return ql.rows(q, db="")
    except QueryError as e:
        if e.status == 401:
            refused = refused_credentials(ql.conn, 401)
            raise SetupError(
                f"{refused.detail} (HTTP 401: {e.message}): for --api v1 the token file holds user:password of an admin user"
            ) from None
        if e.status == 403:
            raise SetupError(f"cannot {what}: the user lacks the admin privilege setup needs (403)") from None
        raise SetupError(f"cannot {what}: {e}") from None


def setup_v1(conn: Connection, *, raw_retention: str = "30d", minute_retention: str | None = None) -> SetupReport:
    """Create or bring up to date everything gpulse needs on an InfluxDB 1.x server."""
    wrong = probe(conn).mismatch("v1", admin=True)
    if wrong is not None:
        raise SetupError(str(wrong))
    secs = retentions(raw_retention, minute_retention)
    ql = InfluxQL(conn)
    db = conn.database
    report = SetupReport()

    names = {r["name"] for r in run_statement(ql, "SHOW DATABASES", "list databases")}
    if db in names:
        report.add("unchanged", f"database {db}")
    else:
        run_statement(ql, f"CREATE DATABASE {quote_ident(db)}", f"create database {db}")
        report.add("created", f"database {db}")

    have = {
        r["name"]: r
        for r in run_statement(ql, f"SHOW RETENTION POLICIES ON {quote_ident(db)}", "list retention policies")
    }
    for rp in ALL_TIERS:
        duration, default = influx_duration(secs[rp]), rp == RAW
        spec = f"DURATION {duration} REPLICATION 1" + (" DEFAULT" if default else "")
        cur = have.get(rp)
        what = f"retention policy {db}.{rp} ({duration}{', default' if default else ''})"
        if cur is None:
            run_statement(
                ql, f"CREATE RETENTION POLICY {quote_ident(rp)} ON {quote_ident(db)} {spec}", f"create {what}"
            )
            report.add("created", what)
        elif _rp_seconds(cur["duration"]) != secs[rp] or (default and not cur["default"]):
            alter = f"DURATION {duration}" if _rp_seconds(cur["duration"]) != secs[rp] else ""
            if alter:  # a shorter duration than the current shard duration is refused without a new one
                alter += f" SHARD DURATION {influx_duration(shard_group_seconds(secs[rp]))}"
            alter += " DEFAULT" if default else ""
            run_statement(
                ql, f"ALTER RETENTION POLICY {quote_ident(rp)} ON {quote_ident(db)} {alter.strip()}", f"alter {what}"
            )
            report.add("updated", what)
        else:
            report.add("unchanged", what)

    want = continuous_queries(db)
    existing = {
        r["name"]: r["query"]
        for r in run_statement(ql, "SHOW CONTINUOUS QUERIES", "list continuous queries")
        if r["_measurement"] == db
    }
    for name in existing:
        if _MANAGED_CQ.match(name) and name not in want:
            run_statement(ql, f"DROP CONTINUOUS QUERY {quote_ident(name)} ON {quote_ident(db)}", f"drop {name}")
            report.add("deleted", f"continuous query {name} (no longer in the schema)")
    for name, statement in want.items():
        if name not in existing:
            run_statement(ql, statement, f"create continuous query {name}")
            report.add("created", f"continuous query {name}")
        elif _normalize(existing[name]) != _normalize(statement):
            run_statement(ql, f"DROP CONTINUOUS QUERY {quote_ident(name)} ON {quote_ident(db)}", f"drop {name}")
            run_statement(ql, statement, f"create continuous query {name}")
            report.add("updated", f"continuous query {name}")
        else:
            report.add("unchanged", f"continuous query {name}")
    return report


def _rp_seconds(go_duration: str) -> int:
    return parse_duration(go_duration) // 10**9


def downsample_now(conn: Connection, start_ns: int, end_ns: int) -> int:
    """Run the continuous queries' ``SELECT ... INTO`` once over ``[start, end)`` (1m, then 1h); points written.

    Continuous queries only look back ``RESAMPLE FOR``; this fills the downsampled retention
    policies for older data at once (``gpulse recompute``, ``gpulse demo``). Windows are widened to whole windows.
    """
    ql = InfluxQL(conn)
    written = 0
    try:
        for tier in TIERS:
            for m in downsampled_measurements():
                q = influxql_select(tier, m.name, conn.database, start_ns, end_ns)
                for row in run_statement(ql, q, f"downsample {m.name} to {tier.name}"):
                    written += int(row.get("written") or 0)
    finally:
        ql.close()
    return written
