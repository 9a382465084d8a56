"""``--api v1``: ``POST /write?db=&rp=&precision=n`` (InfluxDB 1.x, and 2.x's compatibility endpoint), gzipped.

Credentials (``user:password`` from the token file) travel as HTTP Basic auth, never in the URL.
"""

from __future__ import annotations

from gpulse.influx.connection import Connection
from gpulse.sinks.influx import InfluxSink


class InfluxV1Sink(InfluxSink):
    path = "/write"

    def __init__(
        self,
        url: str,
        database: str,
        retention_policy: str = "",
        credentials: tuple[str, str] | None = None,
        *,
        timeout_s: float = 10.0,
        verify_ssl: bool = True,
        token_source: str = "",
    ) -> None:
        self.database, self.retention_policy = database, retention_policy
        params = {"db": database, "precision": "n"}
        if retention_policy:
            params["rp"] = retention_policy
        bucket = f"{database}/{retention_policy}" if retention_policy else database
        token = ":".join(credentials) if credentials else ""
        conn = Connection(
            url=url.rstrip("/"),
            api="v1",
            bucket=bucket,
            token=token,
            token_source=token_source,
            timeout_s=timeout_s,
            verify_ssl=verify_ssl,
        )
        super().__init__(conn, params)

    def describe(self) -> str:
        rp = f"/{self.retention_policy}" if self.retention_policy else ""
        return f"InfluxDB v1 API at {self.url} (database {self.database}{rp})"
