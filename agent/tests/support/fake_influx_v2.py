"""A fault-injecting stand-in for InfluxDB 2.x's ``POST /api/v2/write`` (no InfluxDB 2 can run in CI).

It follows the documented contract (influxdb ``http/write_handler.go``, the OpenAPI
``WriteService`` and the docs' "write data" pages), request by request:

* ``Authorization: Token <token>`` is required (401 ``unauthorized`` otherwise; ``forbidden``
  names tokens without write permission: 403 ``insufficient permissions for write``);
* ``org`` (or ``orgID``) and ``bucket`` are required (400 / 404 ``not found`` naming the resource);
  ``precision`` is ``ns`` (default) ``us`` ``ms`` or ``s`` (400 ``invalid precision`` otherwise);
* ``Content-Encoding: gzip`` bodies are gunzipped; a body over ``max_body_bytes`` (decompressed)
  gets 413 with a ``LineProtocolLengthError`` (``maxLength``);
* each line is parsed minimally (measurement, fields, optional integer timestamp); a malformed line
  rejects the **whole** request with 400 and a ``LineProtocolError`` body naming it (``line`` is
  1-based); comments and blank lines are skipped;
* a field whose type differs from the type already stored for that measurement is a type conflict:
  the other points are stored and the answer is 422 ``partial write … dropped=N`` (InfluxDB 2.0.x
  answered 500 instead: ``conflict_status=500``);
* 204 with no body when everything was written.

Faults are scripted with :meth:`FakeInfluxV2.push` (the next requests get that answer: any status,
headers such as ``Retry-After``, a delay) or ``delay_s`` (every answer is slow). Accepted lines are
kept in arrival order in ``lines`` and deduplicated as the bucket stores them in ``points``; every request is logged in ``requests``.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PRECISIONS = ("ns", "us", "ms", "s")


@dataclass
class Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    delay_s: float = 0.0


@dataclass
class Request:
    status: int
    lines: int
    gzip: bool
    params: dict[str, str]
    headers: dict[str, str]
    at: float  # time.monotonic() when the request arrived


def _split_unescaped(s: str, sep: str) -> list[str]:
    """Split on ``sep`` outside double quotes and not preceded by a backslash."""
    out, cur, quoted, i = [], [], False, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            cur.append(s[i : i + 2])
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        if c == sep and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return out


def parse_line(line: str) -> tuple[str, dict[str, str]]:
    """(measurement, {field: type}) of one line, or ValueError with InfluxDB's reason."""
    parts = _split_unescaped(line, " ")
    if len(parts) < 2 or not parts[1]:
        raise ValueError("missing fields")
    if len(parts) > 3:
        raise ValueError("invalid field format")
    if len(parts) == 3:
        try:
            int(parts[2])
        except ValueError:
            raise ValueError("bad timestamp") from None
    measurement = _split_unescaped(parts[0], ",")[0]
    if not measurement:
        raise ValueError("missing measurement")
    types: dict[str, str] = {}
    for f in _split_unescaped(parts[1], ","):
        kv = _split_unescaped(f, "=")
        if len(kv) != 2 or not kv[0] or not kv[1]:
            raise ValueError("invalid field format")
        v = kv[1]
        if v.startswith('"'):
            if len(v) < 2 or not v.endswith('"'):
                raise ValueError("invalid field format")
            t = "string"
        elif v.endswith("i"):
            int(v[:-1])
            t = "integer"
        elif v in ("t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE"):
            t = "boolean"
        else:
            try:
                float(v)
            except ValueError:
                raise ValueError("invalid number") from None
            t = "float"
        types[kv[0]] = t
    return measurement, types


class FakeInfluxV2:
    def __init__(
        self, *, token: str = "secret-token", org: str = "gpulse", bucket: str = "gpulse", port: int = 0
    ) -> None:
        self.token = token
        self.forbidden_tokens: set[str] = set()
        self.orgs = {org}
        self.buckets = {bucket}
        self.max_body_bytes: int | None = None
        self.conflict_status = 422
        self.delay_s = 0.0
        self.lines: list[str] = []  # every accepted line, in arrival order (re-sends included)
        self.points: dict[str, str] = {}  # what the bucket holds: series + timestamp -> line (re-sends overwrite)
        self.requests: list[Request] = []
        self.field_types: dict[tuple[str, str], str] = {}
        self._script: deque[Scripted] = deque()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with fake._lock:
                    fake._conns.add(self.connection)

            def finish(self) -> None:
                with fake._lock:
                    fake._conns.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                fake._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # a client that gave up is not an error
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> FakeInfluxV2:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Go away like a stopped server: stop listening and drop every open (keep-alive) connection."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def push(
        self,
        status: int,
        *,
        times: int = 1,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """The next ``times`` requests get this answer (after their body is read), whatever they hold.

        ``status=0`` means "answer normally", e.g. to make only the next answers slow with ``delay_s``."""
        with self._lock:
            for _ in range(times):
                self._script.append(Scripted(status, dict(headers or {}), body, delay_s))

    def statuses(self) -> list[int]:
        with self._lock:
            return [r.status for r in self.requests]

    # -- the handler -----------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        at = time.monotonic()
        u = urllib.parse.urlsplit(h.path)
        params = dict(urllib.parse.parse_qsl(u.query))
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        is_gzip = h.headers.get("Content-Encoding", "identity") == "gzip"
        status, headers, body, nlines = self._answer(u.path, params, dict(h.headers), raw, is_gzip)
        with self._lock:
            self.requests.append(Request(status, nlines, is_gzip, params, dict(h.headers), at))
        payload = json.dumps(body).encode() if body is not None else b""
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if body is not None:
            h.send_header("Content-Type", "application/json; charset=utf-8")
            h.send_header("X-Platform-Error-Code", str(body.get("code", "")))
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _answer(self, path: str, params: dict[str, str], headers: dict[str, str], raw: bytes, is_gzip: bool):
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        delay = scripted.delay_s if scripted else self.delay_s
        if delay:
            time.sleep(delay)
        if path != "/api/v2/write":
            return 404, {}, {"code": "not found", "message": "path not found"}, 0
        if scripted is not None and scripted.status:
            body = scripted.body
            if body is None and scripted.status >= 400:
                body = {
                    "code": "internal error" if scripted.status >= 500 else "invalid",
                    "message": f"scripted {scripted.status}",
                }
            return scripted.status, scripted.headers, body, 0
        auth = headers.get("Authorization", "")
        if not auth.startswith("Token ") or auth[6:] not in ({self.token} | self.forbidden_tokens):
            return 401, {}, {"code": "unauthorized", "message": "unauthorized access"}, 0
        if auth[6:] in self.forbidden_tokens:
            return 403, {}, {"code": "forbidden", "message": "insufficient permissions for write"}, 0
        org = params.get("org") or params.get("orgID")
        if not org:
            return 400, {}, {"code": "invalid", "message": "Please provide either orgID or org"}, 0
        if org not in self.orgs:
            return 404, {}, {"code": "not found", "message": f'organization name "{org}" not found'}, 0
        bucket = params.get("bucket")
        if not bucket or bucket not in self.buckets:
            return 404, {}, {"code": "not found", "message": f'bucket "{bucket}" not found'}, 0
        if params.get("precision", "ns") not in PRECISIONS:
            return (
                400,
                {},
                {"code": "invalid", "message": "invalid precision; valid precision units are ns, us, ms, and s"},
                0,
            )
        try:
            data = gzip.decompress(raw) if is_gzip else raw
        except (OSError, EOFError):
            return 400, {}, {"code": "invalid", "message": "gzip: invalid header"}, 0
        if self.max_body_bytes is not None and len(data) > self.max_body_bytes:
            return (
                413,
                {},
                {
                    "code": "request too large",
                    "message": "unable to read data: points batch is too large",
                    "maxLength": self.max_body_bytes,
                },
                0,
            )
        text = data.decode("utf-8")
        lines = [ln for ln in text.split("\n") if ln.strip() and not ln.startswith("#")]
        parsed = []
        for n, line in enumerate(text.split("\n"), start=1):
            if not line.strip() or line.startswith("#"):
                continue
            try:
                parsed.append((line, *parse_line(line)))
            except ValueError as e:
                msg = f"unable to parse '{line}': {e}"
                return 400, {}, {"code": "invalid", "message": msg, "op": "writing", "err": msg, "line": n}, len(lines)
        if not parsed:
            return 400, {}, {"code": "invalid", "message": "writing requires points"}, 0
        dropped, conflict = 0, ""
        with self._lock:
            for line, m, types in parsed:
                clash = [(f, t) for f, t in types.items() if self.field_types.get((m, f), t) != t]
                if clash:
                    dropped += 1
                    f, t = clash[0]
                    conflict = (
                        f'field type conflict: input field "{f}" on measurement "{m}" is type {t}, '
                        f"already exists as type {self.field_types[(m, f)]}"
                    )
                    continue
                for f, t in types.items():
                    self.field_types[(m, f)] = t
                self.lines.append(line + "\n")
                head = _split_unescaped(line, " ")
                self.points[f"{head[0]} {head[2] if len(head) == 3 else len(self.lines)}"] = line + "\n"
        if dropped:
            code = "unprocessable entity" if self.conflict_status == 422 else "internal error"
            return (
                self.conflict_status,
                {},
                {"code": code, "message": f"partial write: {conflict} dropped={dropped}"},
                len(lines),
            )
        return 204, {}, None, len(lines)
