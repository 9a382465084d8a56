"""Sinks from the shared connection settings and ``--record``."""

from __future__ import annotations

from collections.abc import Sequence

from gpulse.influx.connection import ConfigError, Connection
from gpulse.sinks.base import Sink
from gpulse.sinks.record import RecordSink
from gpulse.sinks.routing import RoutedSink, TenantRoute


def database_sink(conn: Connection) -> Sink:
    """The sink that writes to ``conn``'s database (its URL set)."""
    from gpulse.sinks.influx_v1 import InfluxV1Sink
    from gpulse.sinks.influx_v2 import InfluxV2Sink
    from gpulse.sinks.influx_v3 import InfluxV3Sink

    url = conn.url or ""
    options = {"timeout_s": conn.timeout_s, "verify_ssl": conn.verify_ssl, "token_source": conn.token_source}
    if conn.api == "v1":
        return InfluxV1Sink(url, conn.database, conn.retention_policy, conn.v1_credentials, **options)
    if conn.api == "v3":
        return InfluxV3Sink(url, conn.token, conn.bucket, **options)
    return InfluxV2Sink(url, conn.token, conn.org, conn.bucket, **options)


def build_sinks(
    conn: Connection | None,
    record_path: str | None,
    routes: Sequence[TenantRoute] = (),
    tenants: Sequence[tuple[str, Connection]] = (),
) -> list[Sink]:
    """The database sink for ``conn`` (none when ``conn`` or its URL is ``None``), with ``routes`` one more
    per tenant (:mod:`gpulse.sinks.routing`: each writes only its own lines), plus the record file (every line)."""
    sinks: list[Sink] = []
    if conn is not None and conn.url:
        fleet = database_sink(conn)
        sinks.append(RoutedSink(fleet, routes, None) if routes else fleet)
        sinks += [RoutedSink(database_sink(c), routes, name) for name, c in tenants]
    if record_path:
        sinks.append(RecordSink(record_path))
    if not sinks:
        raise ConfigError("nothing to write to: give --url (a database) or --record FILE (a local file), or both")
    return sinks
