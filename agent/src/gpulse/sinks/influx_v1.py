"""``--api v1``: ``POST /write?db=&rp=&precision=n`` (InfluxDB 1.x, and 2.x's compatibility endpoint), gzipped.

Credentials (``user:password`` from the token file) travel as HTTP Basic auth, never in the URL.
"""

from __future__ import annotations

from typing import Any

from gpulse.sinks.influx import InfluxSink


class InfluxV1Sink(InfluxSink):
    path = "/write"

    def __init__(
        self,
        url: str,
        database: str,
        retention_policy: str = "",
        credentials: tuple[str, str] | None = None,
        **options: Any,
    ) -> None:
        """``options``: ``timeout_s``, ``verify_ssl``, ``token_source`` (see :class:`InfluxSink`)."""
        self.database, self.retention_policy = database, retention_policy
        params = {"db": database, "precision": "n"}
        if retention_policy:
            params["rp"] = retention_policy
        bucket = f"{database}/{retention_policy}" if retention_policy else database
        token = ":".join(credentials) if credentials else ""
        super().__init__(url, "v1", params, bucket=bucket, token=token, **options)

    def describe(self) -> str:
        rp = f"/{self.retention_policy}" if self.retention_policy else ""
        return f"InfluxDB v1 API at {self.url} (database {self.database}{rp})"
