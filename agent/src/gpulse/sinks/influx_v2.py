"""``--api v2``: ``POST /api/v2/write?org=&bucket=&precision=ns`` (InfluxDB 2.x, 3.x, Cloud, 1.8+), gzipped.

Exactly one request per call, ``Authorization: Token …``: the delivery owns retries, spooling and
batching (a client library's batching mode would keep its own unbounded queue and retry on its own).
"""

from __future__ import annotations

from gpulse.influx.connection import Connection
from gpulse.sinks.influx import InfluxSink


class InfluxV2Sink(InfluxSink):
    path = "/api/v2/write"

    def __init__(
        self,
        url: str,
        token: str,
        org: str,
        bucket: str,
        *,
        timeout_s: float = 10.0,
        verify_ssl: bool = True,
        token_source: str = "",
    ) -> None:
        self.org, self.bucket = org, bucket
        conn = Connection(
            url=url.rstrip("/"),
            api="v2",
            org=org,
            bucket=bucket,
            token=token,
            token_source=token_source,
            timeout_s=timeout_s,
            verify_ssl=verify_ssl,
        )
        params = {"org": org, "bucket": bucket, "precision": "ns"}
        super().__init__(conn, params)

    def describe(self) -> str:
        return f"InfluxDB v2 API at {self.url} (org {self.org}, bucket {self.bucket})"
