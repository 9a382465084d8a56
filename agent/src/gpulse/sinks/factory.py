"""Sinks from the shared connection settings and ``--record``."""

from __future__ import annotations

from gpulse.influx.connection import ConfigError, Connection
from gpulse.sinks.base import Sink
from gpulse.sinks.record import RecordSink


def build_sinks(conn: Connection | None, record_path: str | None) -> list[Sink]:
    """The database sink for ``conn`` (none when ``conn`` or its URL is ``None``) plus the record file."""
    sinks: list[Sink] = []
    if conn is not None and conn.url:
        from gpulse.sinks.influx_v1 import InfluxV1Sink
        from gpulse.sinks.influx_v2 import InfluxV2Sink
        from gpulse.sinks.influx_v3 import InfluxV3Sink

        options = {"timeout_s": conn.timeout_s, "verify_ssl": conn.verify_ssl, "token_source": conn.token_source}
        if conn.api == "v1":
            sinks.append(InfluxV1Sink(conn.url, conn.database, conn.retention_policy, conn.v1_credentials, **options))
        elif conn.api == "v3":
            sinks.append(InfluxV3Sink(conn.url, conn.token, conn.bucket, **options))
        else:
            sinks.append(InfluxV2Sink(conn.url, conn.token, conn.org, conn.bucket, **options))
    if record_path:
        sinks.append(RecordSink(record_path))
    if not sinks:
        raise ConfigError("nothing to write to: give --url (a database) or --record FILE (a local file), or both")
    return sinks
