"""A loopback reverse proxy in front of a real influxd that logs every write it passes on.

Why a proxy: a fleet test must know *when* the database received *what*, per node, to the request:
the write rate second by second (is the replay after an outage a thundering herd?) and the lines
the database acknowledged (was a batch sent again after its 204?). influxd 1.6 keeps neither per
client. The proxy changes nothing on the way: each request goes to influxd as it came, and influxd's
answer goes back as it came. When influxd is down, the proxy closes the client's connection without
an answer, as a TCP pass-through or a load balancer with no healthy backend does; the agent sees a
broken connection instead of "connection refused", a transient error all the same.
"""

from __future__ import annotations

import gzip
import http.client
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpulse.lineprotocol.parse import parse_line

#: hop-by-hop headers a proxy does not pass on (RFC 9110 section 7.6.1), plus the length it recomputes
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


@dataclass(frozen=True)
class Write:
    """One ``/write`` request the proxy passed on, and influxd's answer (0: none, influxd was down)."""

    at: float  # time.monotonic() when the answer came back (or the forward failed)
    host: str  # the ``host`` tag of its first line
    lines: int
    wire_bytes: int  # the request body as sent (gzipped)
    lp_bytes: int  # the line protocol, uncompressed
    newest_ns: int  # the newest timestamp in the batch
    status: int

    @property
    def accepted(self) -> bool:
        return self.status == 204


@dataclass
class CountingProxy:
    """``url`` forwards to ``upstream`` (``http://127.0.0.1:PORT``); ``writes`` logs every write."""

    upstream: str
    writes: list[Write] = field(default_factory=list)
    #: requests of any kind that could not be passed on (influxd down)
    unanswered: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        target = urllib.parse.urlsplit(self.upstream)
        self._target = (target.hostname or "127.0.0.1", target.port or 8086)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="counting-proxy", daemon=True)

    def start(self) -> CountingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def snapshot(self) -> list[Write]:
        with self._lock:
            return list(self.writes)

    # -- called by the handler threads ------------------------------------------------------------
    def forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(*self._target, timeout=60)
        conn.request(method, path, body=body or None, headers=dict(headers))
        return conn.getresponse()

    def log_write(self, body: bytes, encoding: str, status: int) -> None:
        lp = gzip.decompress(body) if encoding == "gzip" else body
        lines = [line for line in lp.decode().split("\n") if line]
        host = parse_line(lines[0]).tags.get("host", "") if lines else ""
        newest = max((int(line.rsplit(" ", 1)[1]) for line in lines), default=0)
        w = Write(time.monotonic(), host, len(lines), len(body), len(lp), newest, status)
        with self._lock:
            self.writes.append(w)
        if status == 0:
            self.log_unanswered()

    def log_unanswered(self) -> None:
        with self._lock:
            self.unanswered += 1


def _handler(proxy: CountingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the agent's client expects

        def _pass_on(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP]
            is_write = self.command == "POST" and urllib.parse.urlsplit(self.path).path in ("/write", "/api/v2/write")
            try:
                resp = proxy.forward(self.command, self.path, headers, body)
                data = resp.read()
            except (OSError, http.client.HTTPException):
                if is_write:
                    proxy.log_write(body, self.headers.get("Content-Encoding", ""), 0)
                else:
                    proxy.log_unanswered()
                self.close_connection = True  # no answer: the client sees the connection close
                return
            if is_write:
                proxy.log_write(body, self.headers.get("Content-Encoding", ""), resp.status)
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP and k.lower() not in ("date", "server"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _pass_on

        def log_message(self, format: str, *args: object) -> None:
            pass  # the log is ``proxy.writes``

    return Handler
