"""What the v1, v2 and v3 sinks share: one gzipped POST per batch through :class:`gpulse.influx.http.HttpClient`.

Every write ends within the connection's ``timeout_s`` however the server behaves (the client's total
deadline), reads at most a small answer, and a write slower than half its deadline is logged with
its duration. A refusal that a person must fix (401/403/404, a missing retention policy) asks the
server once what it is (``/ping``), so the error says "wrong --api", "no credentials given" or
"run gpulse setup" instead of a bare "HTTP 404: 404 page not found". ``close`` never blocks: it aborts
a request in flight (an agent's SIGTERM must not wait for a stalled server).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gpulse.influx.connection import Connection
from gpulse.influx.http import Failure, TransportError, with_query
from gpulse.influx.server import Explainer
from gpulse.sinks.base import Sink, encode_body
from gpulse.sinks.errors import ErrorKind, WriteError, classify_http
from gpulse.util.countlog import CountedLog

log = logging.getLogger("gpulse.sinks")

#: a write that took longer than this share of its deadline is logged (with its duration)
SLOW_SHARE = 0.5
#: transport failures that no retry within a one-shot command will cure
_NOT_TRANSIENT = {Failure.TLS: ErrorKind.CONFIG}
_TEXT = {"Content-Type": "text/plain; charset=utf-8"}


class InfluxSink(Sink):
    """A database sink over HTTP; subclasses say where (``path``, ``params``); the connection says who."""

    name = "influx"
    path = "/"

    def __init__(
        self,
        url: str,
        api: str,
        params: Mapping[str, str],
        *,
        timeout_s: float = 10.0,
        verify_ssl: bool = True,
        token_source: str = "",
        **where: str,
    ) -> None:
        """``where``: the :class:`Connection` fields that name the destination (bucket, org, token)."""
        conn = Connection(
            url=url.rstrip("/"), api=api, timeout_s=timeout_s, verify_ssl=verify_ssl, token_source=token_source, **where
        )
        self.conn = conn
        self.url = conn.url or ""
        self.params = dict(params)
        self._write_target = with_query(self.path, self.params)  # encoded once, as each request would
        self.http = conn.http_client()
        self.explainer = Explainer(conn)
        self._log = CountedLog(log)

    def write(self, lines: Sequence[str]) -> None:
        try:
            r = self.http.request("POST", self._write_target, body=encode_body(lines), headers=_TEXT, gzip=True)
        except TransportError as e:
            raise WriteError(
                _NOT_TRANSIENT.get(e.failure, ErrorKind.TRANSIENT), e.describe(), failure=e.failure
            ) from None
        if r.elapsed_s > SLOW_SHARE * self.conn.timeout_s:
            self._log.log(
                "slow",
                logging.WARNING,
                "%s: a write of %d lines took %.1f s (deadline %g s)",
                self.describe(),
                len(lines),
                r.elapsed_s,
                self.conn.timeout_s,
            )
        if r.ok:
            return
        error = classify_http(r.status, r.headers, r.body, lines)
        if error.kind is ErrorKind.CONFIG:
            error.diagnosis = self.explainer.diagnose(r.status, error.message)
        raise error

    def close(self) -> None:
        self.http.close()
