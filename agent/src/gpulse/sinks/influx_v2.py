"""``--api v2``: ``POST /api/v2/write?org=&bucket=&precision=ns`` (InfluxDB 2.x, 3.x, Cloud, 1.8+), gzipped.

Exactly one request per call, ``Authorization: Token …``: the delivery owns retries, spooling and
batching (a client library's batching mode would keep its own unbounded queue and retry on its own).
"""

from __future__ import annotations

from typing import Any

from gpulse.sinks.influx import InfluxSink


class InfluxV2Sink(InfluxSink):
    path = "/api/v2/write"

    def __init__(self, url: str, token: str, org: str, bucket: str, **options: Any) -> None:
        """``options``: ``timeout_s``, ``verify_ssl``, ``token_source`` (see :class:`InfluxSink`)."""
        self.org, self.bucket = org, bucket
        params = {"org": org, "bucket": bucket, "precision": "ns"}
        super().__init__(url, "v2", params, org=org, bucket=bucket, token=token, **options)

    def describe(self) -> str:
        return f"InfluxDB v2 API at {self.url} (org {self.org}, bucket {self.bucket})"
