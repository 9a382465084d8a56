"""Database checks, in the order one explains the next: the server (one probe decides v1, v2 or v3:
InfluxDB 3's own checks are in :mod:`gpulse.cli.checks.database_v3`),
the credentials, the bucket the agent writes to, the downsampling layout, its runs, the clock.

Every refusal is classified by :func:`gpulse.influx.server.diagnose`, so the doctor says what
``gpulse setup`` says: the wrong ``--api`` for this server, credentials (none given, or refused), or
the layout (a database, retention policy, bucket or org that does not exist: ``gpulse setup``).
A missing retention policy is a layout problem, never a credentials one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpulse.cli import advice
from gpulse.cli.checks import database_v3
from gpulse.cli.checks.answers import get_json, refusal
from gpulse.cli.checks.base import Check, Context, Result, fail, ok, skip
from gpulse.influx.connection import Connection

#: Clock skew beyond this breaks joins of GPU samples with steps and the downsampling windows.
MAX_SKEW_S = 2.0


def check_database(ctx: Context) -> Result:
    """The one server probe: something answers, it is InfluxDB, and of the generation ``--api`` needs."""
    from gpulse.influx.server import Problem, ServerProblem, probe_connection

    conn = ctx.conn
    try:
        info = probe_connection(conn)
    except ServerProblem as e:
        d = e.diagnosis
        ctx.database_problem = d.problem
        if d.problem is Problem.UNREACHABLE:
            without = advice.record_locally(ctx.simulate())
            return fail("database", d.detail, advice.no_database(conn, without))
        return fail("database", d.detail, d.fix)  # not InfluxDB, or the other generation than --api
    ctx.server = info
    return ok("database", f"{conn.url} answers ({info.describe()})")


@contextlib.contextmanager
def _influxql(ctx: Context) -> Iterator[Any]:
    """An InfluxQL client for the connection, told the probe's answer (so refusals are explained)."""
    from gpulse.influx.query import InfluxQL

    q = InfluxQL(ctx.conn)
    q.explainer.info = ctx.server
    try:
        yield q
    finally:
        q.close()


# -- credentials and the agent's bucket -----------------------------------------------------------------
def check_token(ctx: Context) -> Result:
    """The server accepts the credentials (v1 ``SHOW DATABASES``, v2 the buckets API)."""
    conn = ctx.conn
    if conn.api == "v3":
        return database_v3.check_token(ctx)
    if conn.api == "v1":
        from gpulse.influx.query import QueryError

        try:
            with _influxql(ctx) as q:
                q.rows("SHOW DATABASES", db="")
        except QueryError as e:
            return refusal("token", e.status, e.message, e.diagnosis)
        user = conn.v1_credentials
        return ok("token", f"credentials accepted as {user[0]!r}" if user else "the server asks for no credentials")
    from gpulse.influx.server import NONE_GIVEN

    if not conn.token:
        return fail("token", f"InfluxDB 2.x asks for a token and {NONE_GIVEN}", _credentials_fix(conn))
    got = get_json(ctx, "/api/v2/buckets", {"limit": 1})
    if isinstance(got, Result):
        return got
    return ok("token", f"token from {conn.token_source} accepted")


def _credentials_fix(conn: Connection) -> str:
    from gpulse.influx.server import credentials_fix

    return credentials_fix(conn)


def check_bucket(ctx: Context) -> Result:
    """What the agent writes to exists: v1 the database (and retention policy), v2 the org and bucket."""
    from gpulse.influx.server import missing_bucket, missing_database, missing_org, missing_retention_policy

    conn = ctx.conn
    if conn.api == "v3":
        return database_v3.check_bucket(ctx, _setup_fix(conn))
    if conn.api == "v1":
        from gpulse.influx.query import QueryError
        from gpulse.influx.quoting import quote_ident

        try:
            with _influxql(ctx) as q:
                names = {r["name"] for r in q.rows("SHOW DATABASES", db="")}
                if conn.database not in names:
                    return _layout_problem(missing_database(conn), _setup_fix(conn))
                if conn.retention_policy:
                    rps = {r["name"] for r in q.rows(f"SHOW RETENTION POLICIES ON {quote_ident(conn.database)}", db="")}
                    if conn.retention_policy not in rps:
                        whole = dataclasses.replace(conn, bucket=conn.database)
                        fix = (
                            f"name one of those with --bucket {conn.database}/POLICY, or give --bucket "
                            f"{conn.database} for its default; `{advice.setup_command(whole)}` makes raw (the "
                            "default), 1m and 1h"
                        )
                        return _layout_problem(missing_retention_policy(conn), fix, have=sorted(rps))
        except QueryError as e:
            return refusal("bucket", e.status, e.message, e.diagnosis)
        return ok("bucket", f"database {conn.bucket!r} exists")
    orgs = get_json(ctx, "/api/v2/orgs", {"org": conn.org}, name="bucket")
    if isinstance(orgs, Result):
        return orgs
    if not (orgs or {}).get("orgs"):
        return _layout_problem(missing_org(conn), missing_org(conn).fix)
    found = get_json(ctx, "/api/v2/buckets", {"org": conn.org, "name": conn.bucket}, name="bucket")
    if isinstance(found, Result):
        return found
    if not (found or {}).get("buckets"):
        return _layout_problem(missing_bucket(conn), f"{_setup_fix(conn)}, or check --bucket")
    return ok("bucket", f"bucket {conn.bucket!r} exists in org {conn.org!r}")


def _layout_problem(d: Any, fix: str, have: list[str] | None = None) -> Result:
    """What the agent writes to is missing (the diagnosis of :mod:`gpulse.influx.server`), with the
    fix for this very connection: its ``gpulse setup`` command."""
    detail = d.detail + (f" (it has {', '.join(have)})" if have else "")
    return fail("bucket", detail, fix)


# -- the downsampling layout ---------------------------------------------------------------------------
def _setup_fix(conn: Connection) -> str:
    return f"run `{advice.setup_command(conn)}` (idempotent: it only adds what is missing)"


def check_layout(ctx: Context) -> Result:
    """v1: the retention policies of the tiers, raw the default; v2: the tiers' buckets and the DBRP
    mappings Grafana's InfluxQL needs."""
    from gpulse.influx.tiers import ALL_TIERS, RAW

    conn = ctx.conn
    tiers = list(ALL_TIERS)
    fix = _setup_fix(conn)
    if conn.api == "v3":
        return database_v3.check_layout(ctx, fix)
    if conn.api == "v1":
        from gpulse.influx.query import QueryError
        from gpulse.influx.quoting import quote_ident

        try:
            with _influxql(ctx) as q:
                rows = q.rows(f"SHOW RETENTION POLICIES ON {quote_ident(conn.database)}", db="")
        except QueryError as e:
            return fail("layout", f"cannot list retention policies on {conn.database!r}: {e}", fix)
        have = {r["name"]: r for r in rows}
        missing = [t for t in tiers if t not in have]
        if missing:
            return fail("layout", f"database {conn.database!r} lacks retention policies {', '.join(missing)}", fix)
        default = next((n for n, r in have.items() if r.get("default")), "?")
        if default != RAW:
            return fail("layout", f"the default retention policy of {conn.database!r} is {default!r}, not {RAW!r}", fix)
        spans = ", ".join(f"{t} ({_rp_duration(str(have[t].get('duration')))})" for t in tiers)
        return ok("layout", f"database {conn.database!r}: retention policies {spans}, default {RAW}")
    return _layout_v2(ctx, tiers, fix)


def _layout_v2(ctx: Context, tiers: list[str], fix: str) -> Result:
    from gpulse.influx.tiers import bucket_name

    conn = ctx.conn
    orgs = get_json(ctx, "/api/v2/orgs", {"org": conn.org}, name="layout")
    if isinstance(orgs, Result):
        return orgs
    org_id = ((orgs or {}).get("orgs") or [{}])[0].get("id")
    spans, missing = [], []
    for t in tiers:
        name = bucket_name(conn.bucket, t)
        found = get_json(ctx, "/api/v2/buckets", {"orgID": org_id, "name": name}, name="layout")
        if isinstance(found, Result):
            return found
        buckets = (found or {}).get("buckets") or []
        if not buckets:
            missing.append(name)
            continue
        rules = buckets[0].get("retentionRules") or []
        spans.append(f"{name} ({_human_seconds(rules[0].get('everySeconds') if rules else 0)})")
    if missing:
        return fail("layout", f"org {conn.org!r} lacks bucket(s) {', '.join(missing)}", fix)
    dbrps = get_json(ctx, "/api/v2/dbrps", {"orgID": org_id, "db": conn.database}, name="layout")
    if isinstance(dbrps, Result):
        return dbrps
    rps = {d.get("retention_policy") for d in (dbrps or {}).get("content") or []}
    lacking = [t for t in tiers if t not in rps]
    if lacking:
        return fail(
            "layout",
            f"no DBRP mapping for {conn.database}/{', '.join(lacking)}: Grafana's InfluxQL panels will be empty",
            fix,
        )
    return ok(
        "layout", f"org {conn.org!r}: buckets {', '.join(spans)}; InfluxQL sees {conn.database} with {', '.join(tiers)}"
    )


def _rp_duration(go: str) -> str:
    """``720h0m0s`` -> ``30d``, ``0s`` -> ``INF``: as `gpulse setup` spells retentions."""
    from gpulse.influx.durations import parse_duration
    from gpulse.influx.setup.common import influx_duration

    try:
        return influx_duration(parse_duration(go) // 10**9)
    except ValueError:
        return go


def _human_seconds(secs: int | None) -> str:
    if not secs:
        return "forever"
    return f"{secs // 86400}d" if secs % 86400 == 0 else f"{secs}s"


def check_downsampling(ctx: Context) -> Result:
    """v1: the continuous queries exist; v2: the tasks exist, are active, and their last run succeeded."""
    from gpulse.influx.downsample import continuous_queries
    from gpulse.influx.tiers import TIERS, task_name

    conn = ctx.conn
    fix = _setup_fix(conn)
    if conn.api == "v3":
        return database_v3.check_downsampling(ctx, fix)
    if conn.api == "v1":
        from gpulse.influx.query import QueryError

        try:
            with _influxql(ctx) as q:
                rows = q.rows("SHOW CONTINUOUS QUERIES", db="")
        except QueryError as e:
            return fail("downsampling", f"cannot list continuous queries: {e}", fix)
        have = {r["name"] for r in rows if r.get("_measurement") == conn.database}
        want = set(continuous_queries(conn.database))
        missing = sorted(want - have)
        if missing:
            return fail(
                "downsampling", f"{len(missing)} of {len(want)} continuous queries missing, e.g. {missing[0]}", fix
            )
        return ok(
            "downsampling", f"{len(want)} continuous queries on {conn.database!r} ({', '.join(t.name for t in TIERS)})"
        )
    names = [task_name(t) for t in TIERS]
    found = get_json(ctx, "/api/v2/tasks", {"org": conn.org, "limit": 500}, name="downsampling")
    if isinstance(found, Result):
        return found
    by_name = {t.get("name"): t for t in (found or {}).get("tasks") or [] if t.get("name") in names}
    missing = [n for n in names if n not in by_name]
    if missing:
        return fail("downsampling", f"task(s) {', '.join(missing)} missing", fix)
    states = []
    for n in names:
        t = by_name[n]
        if t.get("status") != "active":
            return fail(
                "downsampling",
                f"task {n} is {t.get('status')}",
                f"activate it: `influx task update --id {t.get('id')} --status active`",
            )
        if t.get("lastRunStatus") == "failed":
            return fail(
                "downsampling",
                f"the last run of task {n} failed: {t.get('lastRunError') or 'no message'}",
                f"read its log with `influx task log list --task-id {t.get('id')}`, then re-run `{advice.setup_command(conn)}`",
            )
        states.append(f"{n} {t.get('lastRunStatus') or 'not run yet'}")
    return ok("downsampling", "; ".join(states))


def check_clock(ctx: Context, now: Callable[[], float] = time.time) -> Result:
    """Compare this host's clock with the server's ``Date`` header (1 s resolution, so ±1 s)."""
    from gpulse.influx.server import ServerProblem, probe_with

    conn = ctx.conn
    t0 = now()
    try:
        date = probe_with(conn).date
    except ServerProblem as e:
        return skip("clock", f"{e.diagnosis.detail}, skew not measured")
    t1 = now()
    if not date:
        return skip("clock", "the server sends no Date header, skew not measured")
    server = email.utils.parsedate_to_datetime(date).timestamp() + 0.5  # the header truncates to the second
    skew = (t0 + t1) / 2 - server
    if abs(skew) > MAX_SKEW_S + (t1 - t0) / 2:
        return fail(
            "clock",
            f"this host's clock is {skew:+.1f}s off the database's",
            "enable time sync on both machines (`timedatectl set-ntp true`, chrony or systemd-timesyncd)",
        )
    return ok("clock", f"within {max(abs(skew), 0.5):.1f}s of the database (limit {MAX_SKEW_S:g}s)")


DATABASE = Check("database", check_database, needs_database=True)
TOKEN = Check("token", check_token, needs=("database",), needs_database=True)
BUCKET = Check("bucket", check_bucket, needs=("database", "token"), needs_database=True)
LAYOUT = Check("layout", check_layout, needs=("database", "token", "bucket"), needs_database=True)
DOWNSAMPLING = Check("downsampling", check_downsampling, needs=("database", "token", "bucket"), needs_database=True)
CLOCK = Check("clock", check_clock, needs=("database",), needs_database=True)
