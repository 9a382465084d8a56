"""``--api v1``: ``POST /write?db=&rp=&precision=n`` (InfluxDB 1.x), gzipped, over one keep-alive connection.

Credentials (``user:password`` from the token file) travel as HTTP Basic auth, never in the URL.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import urllib.parse
from collections.abc import Sequence

from gpulse.sinks.base import ErrorKind, Sink, WriteError, encode_body, gzip_body
from gpulse.sinks.errors import classify_http


class InfluxV1Sink(Sink):
    name = "influx"

    def __init__(
        self,
        url: str,
        database: str,
        retention_policy: str = "",
        credentials: tuple[str, str] | None = None,
        *,
        timeout_s: float = 10.0,
        verify_ssl: bool = True,
    ) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url, self.database, self.retention_policy = url, database, retention_policy
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port
        self._timeout = timeout_s
        self._ssl = ssl.create_default_context() if verify_ssl else ssl._create_unverified_context()
        params = {"db": database, "precision": "n"}
        if retention_policy:
            params["rp"] = retention_policy
        self._path = u.path.rstrip("/") + "/write?" + urllib.parse.urlencode(params)
        self._headers = {
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Encoding": "gzip",
            "User-Agent": "gpulse",
        }
        if credentials is not None:
            raw = f"{credentials[0]}:{credentials[1]}".encode()
            self._headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout, context=self._ssl
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._conn

    def write(self, lines: Sequence[str]) -> None:
        body = gzip_body(encode_body(lines))
        try:
            conn = self._connection()
            conn.request("POST", self._path, body=body, headers=self._headers)
            resp = conn.getresponse()
            data = resp.read()
            status, headers = resp.status, resp.headers
            if resp.will_close:
                self.close()
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            self.close()
            raise WriteError(ErrorKind.TRANSIENT, f"{type(e).__name__}: {e}") from None
        if 200 <= status < 300:
            return
        raise classify_http(status, headers, data, lines)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def describe(self) -> str:
        rp = f"/{self.retention_policy}" if self.retention_policy else ""
        return f"InfluxDB v1 API at {self.url} (database {self.database}{rp})"
