"""``[tenants]`` in the agent's TOML file: which jobs are which team's, and where each team's points go.

The table looks like :data:`EXAMPLE`. Everything is checked at start, so a missing credential file
stops the agent with what to run instead of losing the tenant's points later.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpulse.agent.connection_config import read_token_file
from gpulse.influx.connection import ConfigError, Connection
from gpulse.influx.setup.common import SetupError
from gpulse.influx.setup.tenant import tenant_place
from gpulse.sinks.routing import TenantRoute

EXAMPLE = """\
[tenants]
secrets_dir = "/etc/gpulse/secrets"   # holds tenants/NAME/influx-write-token

[[tenants.route]]
tenant = "vision"
slurm_account = "vision"

[[tenants.route]]
tenant = "speech"
k8s_namespace = "speech"
"""
#: What a reader of the configuration reference needs to know (``docs/configuration.md``).
SUMMARY = (
    "A tenant's jobs write to the server of `[connection]`: to the tenant's bucket `gpulse-NAME` (v1: database "
    "`gpulse_NAME`) with its write-only credential, which `gpulse setup --tenant NAME` puts in "
    "`secrets/tenants/NAME/influx-write-token`; copy it to the nodes' `secrets_dir`. The agent checks every "
    "route and credential at start."
)
ROUTE_KEYS = ("tenant", "slurm_account", "k8s_namespace")
ROUTE_DOCS = {
    "tenant": "the tenant's name, as given to `gpulse setup --tenant NAME`",
    "slurm_account": "a Slurm job of this account (the `account` tag) is the tenant's",
    "k8s_namespace": "a pod in this Kubernetes namespace (the `namespace` tag) is the tenant's; exactly one of the two",
}


def parse_tenants(
    table: Any, where: str, conn: Connection
) -> tuple[tuple[TenantRoute, ...], tuple[tuple[str, Connection], ...]]:
    """The routes and each tenant's connection (``conn`` with the tenant's bucket and write credential)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [tenants] must be a table")
    bad = set(table) - {"secrets_dir", "route"}
    if bad:
        raise ConfigError(f"{where}: unknown key(s) in [tenants]: {', '.join(sorted(bad))} (known: secrets_dir, route)")
    routes = []
    for i, r in enumerate(table.get("route") or []):
        if not isinstance(r, dict) or set(r) - set(ROUTE_KEYS) or not r.get("tenant"):
            raise ConfigError(
                f"{where}: [[tenants.route]] number {i + 1} must have tenant and only {', '.join(ROUTE_KEYS)}"
            )
        if bool(r.get("slurm_account")) == bool(r.get("k8s_namespace")):
            raise ConfigError(
                f"{where}: [[tenants.route]] for {r['tenant']} needs exactly one of slurm_account, k8s_namespace"
            )
        routes.append(TenantRoute(str(r["tenant"]), r.get("slurm_account"), r.get("k8s_namespace")))
    if not routes:
        return (), ()
    if not conn.url:
        raise ConfigError(f"{where}: [tenants] routes points to databases: set url in [connection]")
    if conn.api == "v3":
        raise ConfigError(f"{where}: [tenants] needs InfluxDB 2.x or 1.x (InfluxDB 3 Core has only admin tokens)")
    destinations = []
    for name in dict.fromkeys(r.tenant for r in routes):
        try:
            place = tenant_place(name, str(table.get("secrets_dir") or "secrets"))
        except SetupError as e:
            raise ConfigError(f"{where}: {e}") from None
        if not place.write_file.exists():
            raise ConfigError(
                f"{where}: tenant {name}'s write credential {place.write_file} does not exist: run "
                f"`gpulse setup --tenant {name} --secrets-dir {place.secrets_dir}` and copy the file there"
            )
        bucket = place.database if conn.api == "v1" else place.bucket
        token = read_token_file(place.write_file)
        destinations.append((name, replace(conn, bucket=bucket, token=token, token_source=str(place.write_file))))
    return tuple(routes), tuple(destinations)
