"""``--api v2``: ``POST /api/v2/write`` (InfluxDB 2.x, 3.x, Cloud, and 1.8+'s compatibility endpoint).

Uses ``influxdb-client``'s *synchronous* write API only: its batching mode keeps an unbounded
queue in memory, retries inside one shared thread and drops a batch after 180 s. Here the client
makes exactly one gzipped request per call (``retries=False``: the delivery owns retries) with
``precision=ns``, ``org``, ``bucket`` and ``Authorization: Token …``.
"""

from __future__ import annotations

from collections.abc import Sequence

import urllib3
from influxdb_client import InfluxDBClient, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from gpulse.sinks.base import ErrorKind, Sink, WriteError, encode_body
from gpulse.sinks.errors import classify_http


class InfluxV2Sink(Sink):
    name = "influx"

    def __init__(
        self, url: str, token: str, org: str, bucket: str, *, timeout_s: float = 10.0, verify_ssl: bool = True
    ) -> None:
        self.url, self.org, self.bucket = url, org, bucket
        self._client = InfluxDBClient(
            url=url,
            token=token,
            org=org,
            timeout=int(timeout_s * 1000),
            enable_gzip=True,
            retries=False,
            verify_ssl=verify_ssl,
        )
        self._api = self._client.write_api(write_options=SYNCHRONOUS)

    def write(self, lines: Sequence[str]) -> None:
        try:
            self._api.write(
                bucket=self.bucket, org=self.org, record=encode_body(lines), write_precision=WritePrecision.NS
            )
        except ApiException as e:
            raise classify_http(e.status or 0, e.headers, e.body, lines) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise WriteError(ErrorKind.TRANSIENT, f"{type(e).__name__}: {e}") from None

    def close(self) -> None:
        self._api.close()
        self._client.close()

    def describe(self) -> str:
        return f"InfluxDB v2 API at {self.url} (org {self.org}, bucket {self.bucket})"
