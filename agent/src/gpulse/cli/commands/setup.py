"""``gpulse setup``: buckets, retention policies or databases, DBRP mappings, downsampling and the Grafana token.

Idempotent: safe to run on every ``docker compose up`` (the stack's ``setup`` service does). Prints
one line per object with what it did, then a summary; exits 1 with a clear message on a problem.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from gpulse.agent.connection_config import add_connection_flags
from gpulse.cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from gpulse.influx.setup.common import SetupReport
    from gpulse.influx.setup.tenant import TenantPlace

EXIT_CODES = (
    ExitCode(0, "everything is set up (nothing changed where it already was)"),
    ExitCode(1, "the database refused a step (the message says which, and the fix)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_flags(parser)
    parser.add_argument(
        "--raw-retention", default="30d", metavar="DURATION", help="keep raw samples this long (default 30d)"
    )
    parser.add_argument(
        "--minute-retention",
        metavar="DURATION",
        help="keep the 1-minute tier this long (default 400d; the 1h tier is kept forever)",
    )
    parser.add_argument(
        "--grafana-token-file",
        metavar="PATH",
        help="v2: write a read-only token for Grafana here (0600) when the file is missing, empty or its token no "
        "longer works; v3 Enterprise: a token that reads the tiers, made once; v3 Core: the admin token (Core has "
        "only admin tokens)",
    )
    parser.add_argument(
        "--node-token-file",
        metavar="PATH",
        help="v3 Enterprise: write a token that may only write the raw database here (0600), made once, for the "
        "nodes' --token-file; v3 Core: the admin token",
    )
    parser.add_argument(
        "--rotate-tokens",
        action="store_true",
        help="v3 Enterprise: delete the nodes' and Grafana's tokens and make new ones, e.g. when a file was lost",
    )
    parser.add_argument(
        "--run-downsampling",
        metavar="DURATION",
        help="also downsample the last DURATION now (e.g. 7d), instead of waiting for the tasks / continuous queries",
    )
    parser.add_argument(
        "--tenant",
        metavar="NAME",
        help="set up one team instead of the fleet: its bucket gpulse-NAME (v1: database gpulse_NAME) with the "
        "tiers, a write-only and a read-only credential in SECRETS/tenants/NAME/ (0600, never printed)",
    )
    parser.add_argument(
        "--secrets-dir", default="secrets", metavar="SECRETS", help="with --tenant: where tenants/NAME/ goes"
    )
    parser.add_argument(
        "--rotate-tenant-tokens",
        action="store_true",
        help="with --tenant: make new credentials (the old 2.x tokens are deleted), e.g. when a file was lost",
    )
    g = parser.add_argument_group("with --tenant: the tenant's Grafana organisation (through Grafana's HTTP API)")
    g.add_argument(
        "--grafana-url", metavar="URL", help="Grafana to make the tenant's org in (e.g. http://127.0.0.1:3000)"
    )
    g.add_argument(
        "--grafana-admin-file", metavar="PATH", help="file (0600) holding user:password of a Grafana server admin"
    )
    g.add_argument(
        "--grafana-influx-url",
        default="http://influxdb:8086",
        metavar="URL",
        help="InfluxDB as Grafana reaches it (default http://influxdb:8086, the compose network's)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the changes and the summary")


def run(args: argparse.Namespace) -> int:
    from gpulse.agent.config import load_connection
    from gpulse.influx.connection import ConfigError
    from gpulse.influx.durations import parse_duration
    from gpulse.influx.setup import downsample_now
    from gpulse.influx.setup.common import SetupError

    conn = load_connection(args)
    if conn.api != "v3" and (args.node_token_file or args.rotate_tokens):
        print(
            "gpulse setup: --node-token-file and --rotate-tokens are for InfluxDB 3 (--api v3); ignored",
            file=sys.stderr,
        )
    try:
        if args.tenant:
            from gpulse.influx.setup.tenant import setup_tenant, tenant_place

            place = tenant_place(args.tenant, args.secrets_dir)
            report = setup_tenant(
                conn,
                place,
                raw_retention=args.raw_retention,
                minute_retention=args.minute_retention,
                rotate=args.rotate_tenant_tokens,
            )
            if args.grafana_url:
                _grafana_tenant(args, conn.api, place, report)
        elif conn.api == "v1":
            from gpulse.influx.setup.v1 import setup_v1

            if args.grafana_token_file:
                print("gpulse setup: --grafana-token-file is for InfluxDB 2.x; ignored with --api v1", file=sys.stderr)
            report = setup_v1(conn, raw_retention=args.raw_retention, minute_retention=args.minute_retention)
        else:
            from gpulse.influx.setup.v2 import setup_v2
            from gpulse.influx.setup.v3 import setup_v3

            layout = {"raw_retention": args.raw_retention, "minute_retention": args.minute_retention}
            grafana = args.grafana_token_file
            if conn.api == "v3":
                tokens = {"node_token_file": args.node_token_file, "rotate_tokens": args.rotate_tokens}
                report = setup_v3(conn, **layout, grafana_token_file=grafana, **tokens)
            else:
                report = setup_v2(conn, **layout, grafana_token_file=grafana)
        for line in report.lines():
            if not (args.quiet and line.startswith("unchanged")):
                print(line)
        print(f"gpulse setup: {conn.describe()}: {report.summary()}")
        if args.run_downsampling:
            end = time.time_ns()
            target = conn
            if args.tenant:  # the tenant's own bucket or database, not the fleet's
                target = replace(conn, bucket=place.database if conn.api == "v1" else place.bucket)
            downsample_now(target, end - parse_duration(args.run_downsampling), end)
            print(f"gpulse setup: downsampled the last {args.run_downsampling}")
    except (SetupError, ValueError, ConfigError) as e:
        print(f"gpulse setup: {e}", file=sys.stderr)
        return 1
    return 0


def _grafana_tenant(args: argparse.Namespace, api: str, place: TenantPlace, report: SetupReport) -> None:
    """The tenant's Grafana org, its datasources holding the tenant's read credential, and the dashboards."""
    from gpulse.agent.connection_config import read_token_file
    from gpulse.dashboards.tenant_org import GrafanaAdmin, TenantGrafana, setup_grafana_tenant
    from gpulse.influx.setup.common import SetupError

    if not args.grafana_admin_file:
        raise SetupError("--grafana-url needs --grafana-admin-file (user:password of a Grafana server admin, 0600)")
    tenant = TenantGrafana(
        org=place.name,
        influx_url=args.grafana_influx_url,
        database=place.database if api == "v1" else place.bucket,
        read_credential=read_token_file(place.read_file),
        api=api,
    )
    new_credential = any(a in ("created", "updated") and str(place.read_file) in w for a, w in report.actions)
    with GrafanaAdmin(args.grafana_url, read_token_file(args.grafana_admin_file)) as admin:
        setup_grafana_tenant(admin, tenant, report, credential_changed=new_credential)
