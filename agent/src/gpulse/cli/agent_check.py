"""``gpulse agent --check``: would the agent run as configured? One verdict per item, exit 0 only if all pass.

Each check is a function returning ``(ok, detail)``; the detail of a failure says what to fix.
The database check talks to the server the way the agent will: ``/ping`` for reachability, then
for ``--api v1`` ``SHOW DATABASES`` (InfluxQL, with the user:password) and for ``--api v2`` the
buckets API (with the token), which proves both the credentials and the bucket.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TextIO

from gpulse.agent.config import AgentConfig
from gpulse.influx.connection import Connection

Check = tuple[str, Callable[[], tuple[bool, str]]]


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def check_writable_dir(path: str, what: str) -> tuple[bool, str]:
    """The directory exists and is writable, or could be created (nothing is created here)."""
    base = _nearest_existing(path)
    if not os.path.isdir(base):
        return False, f"{what} {path}: {base} is not a directory"
    if not os.access(base, os.W_OK | os.X_OK):
        return False, f"{what} {path}: {base} is not writable by this user"
    return True, f"{what} {path} is writable" + ("" if base == os.path.abspath(path) else " (will be created)")


def check_gpus(cfg: AgentConfig) -> tuple[bool, str]:
    from gpulse.agent.loop import make_source, no_gpu_message
    from gpulse.sources.base import SourceUnavailable

    source = make_source(cfg)
    try:
        gpus = source.open()
    except SourceUnavailable as e:
        return False, no_gpu_message(e)
    finally:
        source.close()
    if not gpus:
        return False, "no GPU found"
    models = sorted({g.model for g in gpus})
    kind = "simulated" if cfg.simulate else "NVML"
    return True, f"{len(gpus)} GPU(s) via {kind}: {', '.join(models)}"


def ping(conn: Connection) -> tuple[bool, str]:
    """The shared server probe (``/ping``, no auth): reachable, InfluxDB, and the generation ``--api`` needs."""
    from gpulse.influx.server import ServerProblem, probe_connection

    try:
        info = probe_connection(conn)
    except ServerProblem as e:
        return False, str(e)
    return True, f"{conn.url} answers (InfluxDB {info.version})"


def check_v1(conn: Connection) -> tuple[bool, str]:
    from gpulse.influx.query import InfluxQL, QueryError, quote_ident

    q = InfluxQL(conn)
    who = f"as {conn.v1_credentials[0]!r}" if conn.v1_credentials else "without credentials"
    try:
        names = {r["name"] for r in q.rows("SHOW DATABASES", db="")}
    except QueryError as e:
        if e.status in (401, 403):
            return (
                False,
                f"authentication failed {who} ({e}); check user:password in {conn.token_source or 'GPULSE_TOKEN'}",
            )
        return False, str(e)
    if conn.database not in names:
        return (
            False,
            f"database {conn.database!r} does not exist (or {who} cannot see it); create it with 'gpulse setup'",
        )
    if conn.retention_policy:
        try:
            rps = {r["name"] for r in q.rows(f"SHOW RETENTION POLICIES ON {quote_ident(conn.database)}", db="")}
        except QueryError as e:
            return False, str(e)
        if conn.retention_policy not in rps:
            return False, f"retention policy {conn.retention_policy!r} does not exist on {conn.database!r}"
    creds = f"credentials accepted {who}" if conn.token else "the server asks for no credentials"
    return True, f"database {conn.bucket!r} exists, {creds}"


def check_v2(conn: Connection) -> tuple[bool, str]:
    from influxdb_client import InfluxDBClient
    from influxdb_client.rest import ApiException

    if not conn.token:
        return False, "no token: set --token-file or GPULSE_TOKEN"
    with InfluxDBClient(url=conn.url, token=conn.token, org=conn.org, timeout=int(conn.timeout_s * 1000)) as client:
        try:
            bucket = client.buckets_api().find_bucket_by_name(conn.bucket)
        except ApiException as e:
            if e.status in (401, 403):
                return (
                    False,
                    f"token from {conn.token_source} rejected (HTTP {e.status}): check the token and its permissions",
                )
            return False, f"buckets API answered HTTP {e.status}: {e.message or e.reason}"
        except Exception as e:  # urllib3 connection errors and the like
            return False, f"cannot query buckets at {conn.url}: {e}"
    if bucket is None:
        return False, f"bucket {conn.bucket!r} not found in org {conn.org!r}; create it with 'gpulse setup'"
    return True, f"bucket {conn.bucket!r} exists in org {conn.org!r}, token accepted"


def database_checks(conn: Connection) -> list[Check]:
    reach: Check = ("database", lambda: ping(conn))
    auth: Check = ("credentials+bucket", lambda: check_v1(conn) if conn.api == "v1" else check_v2(conn))
    return [reach, auth]


def run_checks(cfg: AgentConfig, out: TextIO | None = None) -> int:
    """Print one verdict per item; 0 only if all pass (a failed reachability skips the auth check)."""
    out = out if out is not None else sys.stdout
    checks: list[Check] = [
        ("config", lambda: (True, cfg.describe())),
        ("gpus", lambda: check_gpus(cfg)),
        ("spool", lambda: check_writable_dir(cfg.spool_dir, "spool directory")),
    ]
    if cfg.record:
        checks.append(
            ("record", lambda: check_writable_dir(os.path.dirname(os.path.abspath(cfg.record)), "record directory"))
        )
    if cfg.connection.url:
        checks += database_checks(cfg.connection)
    else:
        checks.append(("database", lambda: (True, "none configured: recording only")))
    failed = 0
    skip_rest_of_db = False
    for name, fn in checks:
        if skip_rest_of_db and name == "credentials+bucket":
            print(f"  SKIP {name}: database unreachable", file=out)
            failed += 1
            continue
        try:
            ok, detail = fn()
        except Exception as e:  # a check must report, never crash the verdict
            ok, detail = False, f"{type(e).__name__}: {e}"
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}", file=out)
        if not ok:
            failed += 1
            skip_rest_of_db = skip_rest_of_db or name == "database"
    total = len(checks)
    verdict = f"all {total} checks passed" if not failed else f"{failed} of {total} checks failed"
    print(f"gpulse agent --check: {verdict}", file=out, flush=True)
    return 0 if not failed else 1
