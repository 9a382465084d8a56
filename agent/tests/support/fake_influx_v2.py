"""A stand-in for InfluxDB 2.9.1's ``POST /api/v2/write`` (no InfluxDB 2 can run in CI), with fault injection.

It follows the server's code at tag v2.9.1 (``influxdata/influxdb``), not the OpenAPI contract; each
behaviour names the source file and function it comes from. :class:`WriteAPI` is the write path
itself; :class:`FakeInfluxV2` serves it alone with one org and a set of bucket names (the sink and
delivery tests), and ``fake_influx_v2_admin.FakeInfluxV2Admin`` serves it next to the management API.

The write path, in the server's order (``http/write_handler.go`` ``handleWrite``):

1. the token (``http/authentication_middleware.go``): none or unknown -> 401 ``unauthorized access``
   (``http/errors.go`` ``UnauthorizedError``); ``Token`` and ``Bearer`` schemes (``http/tokens.go`` ``GetToken``);
2. ``decodeWriteRequest``: ``precision`` (default ns) must be ns/us/ms/s -> else 400 ``invalid precision;
   valid precision units are ns, us, ms, and s``; no ``bucket`` parameter -> 404 ``bucket not found``;
   ``Content-Encoding: gzip`` opens a gzip reader (``http/points/batch_reader.go`` ``BatchReadCloser``)
   whose bad header is a plain Go error -> 500 ``An internal error has occurred - check server logs``
   (``kit/transport/http/error_handler.go`` ``HandleHTTPError``). All three come before the org;
3. the org (``http/requests.go`` ``queryOrganization``): neither ``org`` nor ``orgID`` -> 400 ``Please
   provide either orgID or org`` (``organization.go`` ``ErrInvalidOrgFilter``); unknown name -> 404
   ``organization name "X" not found`` (``tenant/error_org.go`` ``OrgNotFoundByName``);
4. the bucket (``WriteHandler.findBucket``): unknown -> 404 ``bucket "X" not found``
   (``tenant/error_bucket.go`` ``ErrBucketNotFoundByName``);
5. ``checkBucketWritePermissions``: a token without write on the bucket -> 403 ``insufficient permissions
   for write``;
6. the body, decompressed, up to ``max_body_bytes`` (``http/points/points_parser.go`` ``readAll``): over it ->
   413 ``{"code":"request too large","message":"unable to read data: points batch is too large"}``, no
   other field. OSS 2.9.1 never sets that limit (``MaxBatchSizeBytes`` is not assigned by the launcher,
   ``cmd/influxd/launcher/launcher.go``), so ``max_body_bytes`` defaults to None: a 413 comes from
   something in front of InfluxDB (a proxy) or from InfluxDB Cloud;
7. every line is parsed (``models/points.go`` ``ParsePointsWithPrecision``, ported in
   :mod:`support.influx_points`): any bad line rejects the whole batch with 400 whose ``message`` lists
   every bad line as ``unable to parse '<line>': <why>``, joined by newlines; there is no ``line``,
   ``op`` or ``err`` field (``points_parser.go`` ``parsePoints`` wraps the error with an empty ``Msg``).
   An empty body has no points and no error: 204;
8. the points are stored (``PointsWriter.WritePoints``); a point whose field type differs from the
   type stored for that measurement is dropped and the others are written: 422 ``failure writing points
   to database: partial write: field type conflict: input field "f" on measurement "m" is type T,
   already exists as type U dropped=N`` (``write_handler.go`` wraps ``tsdb.PartialWriteError``,
   ``tsdb/field_validator.go`` ``ValidateAndCreateFields``, ``tsdb/shard.go``). InfluxDB 2.0.x answered 500
   instead (``conflict_status=500``);
9. 204 with no body.

Every error body is ``{"code": ..., "message": ...}`` with ``X-Platform-Error-Code``
(``kit/transport/http/error_handler.go`` ``WriteErrorResponse``), the status from its code.

Where it differs: field types are kept per bucket and measurement, the server's per shard (a
conflict across shard groups is refused here, accepted there: stricter, never more lenient); points
beyond the retention period are not dropped. OSS 2.9.1 never answers 429 or sends ``Retry-After`` on
writes (nothing in ``http/write_handler.go`` does): :meth:`FakeInfluxV2.push` scripts what a proxy in
front of InfluxDB, or InfluxDB Cloud, answers. Every request is logged in ``requests``; accepted lines
are kept in arrival order in ``lines`` and as the bucket stores them (series + timestamp) in ``points``.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import threading
import time
import urllib.parse
import zlib
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .influx_points import Point, parse_points

VERSION = "v2.9.1"
PRECISIONS = ("ns", "us", "ms", "s")  # models.ValidPrecision
#: kit/transport/http/error_handler.go influxDBErrorToStatusCode
ERROR_STATUS = {
    "internal error": 500,
    "not implemented": 501,
    "invalid": 400,
    "unprocessable entity": 422,
    "empty value": 400,
    "conflict": 422,
    "not found": 404,
    "unavailable": 503,
    "forbidden": 403,
    "too many requests": 429,
    "unauthorized": 401,
    "method not allowed": 405,
    "request too large": 413,
}
INTERNAL = "An internal error has occurred - check server logs"  # HandleHTTPError for a non-platform error


class ApiError(Exception):
    """An error the server answers with ``{"code", "message"}``; the status follows the code."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.status = status or ERROR_STATUS[code]


@dataclass
class Response:
    status: int
    body: Any = None  # JSON-able, bytes, or None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json; charset=utf-8"

    @classmethod
    def error(cls, e: ApiError) -> Response:
        return cls(e.status, {"code": e.code, "message": e.message}, {"X-Platform-Error-Code": e.code})


def unauthorized() -> ApiError:
    return ApiError("unauthorized", "unauthorized access")  # http/errors.go UnauthorizedError


def token_of(headers: Any) -> str | None:
    """``http/tokens.go`` ``GetToken``: ``Token <t>`` or ``Bearer <t>``, schemes case-insensitive."""
    header = headers.get("Authorization") or ""
    for scheme in ("Token ", "Bearer "):
        if header[: len(scheme)].lower() == scheme.lower():
            return header[len(scheme) :]
    return None


@dataclass
class Request:
    status: int
    lines: int
    gzip: bool
    params: dict[str, str]
    headers: dict[str, str]
    at: float  # time.monotonic() when the request arrived


@dataclass
class Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    delay_s: float = 0.0


class MemoryStorage:
    """What buckets hold: points by series and timestamp, and each measurement's field types."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {}  # bucket -> accepted lines in arrival order
        self.points: dict[str, dict[str, str]] = {}  # bucket -> "series time" -> line (a re-send overwrites)
        self.field_types: dict[tuple[str, str, str], str] = {}  # (bucket, measurement, field) -> type

    def write(self, bucket: str, points: list[Point]) -> tuple[int, str]:
        """Store what fits; (points dropped, reason of the first drop) as ``tsdb/shard.go`` reports them."""
        dropped, reason = 0, ""
        for p in points:
            clash = [
                (f, t, self.field_types[(bucket, p.measurement, f)])
                for f, (t, _) in p.fields.items()
                if self.field_types.get((bucket, p.measurement, f), t) != t
            ]
            if clash:
                f, t, have = clash[0]
                dropped += 1
                reason = reason or (
                    f'field type conflict: input field "{f}" on measurement "{p.measurement}" is type {t}, '
                    f"already exists as type {have}"
                )
                continue
            for f, (t, _) in p.fields.items():
                self.field_types[(bucket, p.measurement, f)] = t
            self.lines.setdefault(bucket, []).append(p.line + "\n")
            self.points.setdefault(bucket, {})[f"{p.series} {p.time_ns}"] = p.line + "\n"
        return dropped, reason


class WriteAPI:
    """``POST /api/v2/write`` over a server's state; a subclass says who may write where."""

    max_body_bytes: int | None = None
    conflict_status = 422

    # -- what the server's state answers ---------------------------------------------------------
    def write_auth(self, token: str | None) -> Any:
        """The authorization of a token, or raise 401."""
        raise NotImplementedError

    def write_org(self, org: str, org_id: str) -> Any:
        raise NotImplementedError

    def write_bucket(self, org: Any, bucket: str) -> str:
        """The storage key of ``bucket`` in ``org``, or raise 404."""
        raise NotImplementedError

    def may_write(self, auth: Any, org: Any, bucket: str) -> bool:
        raise NotImplementedError

    def store(self, bucket: str, points: list[Point]) -> tuple[int, str]:
        raise NotImplementedError

    # -- the handler -----------------------------------------------------------------------------
    def write(self, params: dict[str, str], headers: Any, raw: bytes) -> Response:
        try:
            auth = self.write_auth(token_of(headers))
            precision = params.get("precision") or "ns"
            if precision not in PRECISIONS:
                raise ApiError("invalid", "invalid precision; valid precision units are ns, us, ms, and s")
            if not params.get("bucket"):
                raise ApiError("not found", "bucket not found")
            encoding = headers.get("Content-Encoding") or ""
            if encoding in ("gzip", "x-gzip") and (len(raw) < 10 or raw[:2] != b"\x1f\x8b"):
                raise ApiError("internal error", INTERNAL)  # gzip.NewReader's ErrHeader, not a platform error
            org = self.write_org(params.get("org") or "", params.get("orgID") or "")
            bucket = self.write_bucket(org, params["bucket"])
            if not self.may_write(auth, org, bucket):
                raise ApiError("forbidden", "insufficient permissions for write")
            data = self._read(raw, encoding)
            points, failed = parse_points(data, precision, time.time_ns())
            if failed:
                raise ApiError("invalid", "\n".join(failed))
            dropped, reason = self.store(bucket, points)
            if dropped:
                code = "unprocessable entity" if self.conflict_status == 422 else "internal error"
                message = f"failure writing points to database: partial write: {reason} dropped={dropped}"
                raise ApiError(code, message, self.conflict_status)
        except ApiError as e:
            return Response.error(e)
        return Response(204)

    def _read(self, raw: bytes, encoding: str) -> bytes:
        """``points_parser.go`` ``readAll`` through the limited (and maybe gzip) reader."""
        limit = self.max_body_bytes
        if encoding in ("gzip", "x-gzip"):
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                data = d.decompress(raw, (limit + 1) if limit else 0)
            except zlib.error as e:  # a bad stream after a good header: gzip.ErrChecksum is EInvalid, others internal
                code = "invalid" if "incorrect data check" in str(e) else "internal error"
                raise ApiError(code, f"unable to read data: {e}") from None
            if not d.eof and not (limit and len(data) > limit):
                raise ApiError("internal error", "unable to read data: unexpected EOF")  # io.ErrUnexpectedEOF
        else:
            data = raw
        if limit and len(data) > limit:
            raise ApiError("request too large", "unable to read data: points batch is too large")
        return data


class FakeInfluxV2(WriteAPI):
    """The write endpoint alone: one org, bucket names in ``buckets``, a write token and tokens without write.

    ``push`` scripts the next answers (any status and headers, a delay): what a proxy or InfluxDB Cloud
    may send and OSS never does (429, ``Retry-After``), or a server that fails (500/503).
    """

    def __init__(
        self, *, token: str = "secret-token", org: str = "gpulse", bucket: str = "gpulse", port: int = 0
    ) -> None:
        self.token = token
        self.forbidden_tokens: set[str] = set()  # tokens that authenticate but may not write
        self.orgs = {org}
        self.buckets = {bucket}
        self.delay_s = 0.0
        self.requests: list[Request] = []
        self.storage = MemoryStorage()
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

    # -- what tests read -------------------------------------------------------------------------
    @property
    def lines(self) -> list[str]:
        """Every accepted line, in arrival order (re-sends included), across the buckets."""
        return [line for lines in self.storage.lines.values() for line in lines]

    @property
    def points(self) -> dict[str, str]:
        """What the buckets hold: series + timestamp -> line (a re-send overwrites)."""
        return {k: v for pts in self.storage.points.values() for k, v in pts.items()}

    def statuses(self) -> list[int]:
        with self._lock:
            return [r.status for r in self.requests]

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

    # -- WriteAPI --------------------------------------------------------------------------------
    def write_auth(self, token: str | None) -> str:
        if token is None or token not in ({self.token} | self.forbidden_tokens):
            raise unauthorized()
        return token

    def write_org(self, org: str, org_id: str) -> str:
        name = org or org_id
        if not name:
            raise ApiError("invalid", "Please provide either orgID or org")
        if name not in self.orgs:
            raise ApiError("not found", f'organization name "{name}" not found')
        return name

    def write_bucket(self, org: str, bucket: str) -> str:
        if bucket not in self.buckets:
            raise ApiError("not found", f'bucket "{bucket}" not found')
        return bucket

    def may_write(self, auth: str, org: str, bucket: str) -> bool:
        return auth not in self.forbidden_tokens

    def store(self, bucket: str, points: list[Point]) -> tuple[int, str]:
        with self._lock:
            return self.storage.write(bucket, points)

    # -- HTTP ------------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        at = time.monotonic()
        u = urllib.parse.urlsplit(h.path)
        params = dict(urllib.parse.parse_qsl(u.query))
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        delay = scripted.delay_s if scripted else self.delay_s
        if delay:
            time.sleep(delay)
        if u.path != "/api/v2/write":
            resp = Response.error(ApiError("not found", "path not found"))
        elif scripted is not None and scripted.status:
            body = scripted.body
            if body is None and scripted.status >= 400:
                body = {"code": "internal error" if scripted.status >= 500 else "invalid", "message": "scripted"}
            resp = Response(scripted.status, body, dict(scripted.headers))
        else:
            resp = self.write(params, h.headers, raw)
        is_gzip = h.headers.get("Content-Encoding", "") == "gzip"
        with self._lock:
            self.requests.append(Request(resp.status, count_lines(raw, is_gzip), is_gzip, params, dict(h.headers), at))
        send(h, resp)


def count_lines(raw: bytes, is_gzip: bool) -> int:
    """Lines of line protocol in a request body (blank lines and comments do not count)."""
    try:
        text = (gzip.decompress(raw) if is_gzip else raw).decode("utf-8", "replace")
    except (OSError, EOFError, zlib.error):
        return 0
    return sum(1 for ln in text.split("\n") if ln.strip() and not ln.lstrip().startswith("#"))


def send(h: BaseHTTPRequestHandler, resp: Response) -> None:
    """Write a response with the build headers every 2.x answer carries (``http/handler.go`` ``buildHeader``)."""
    if resp.body is None:
        payload = b""
    elif isinstance(resp.body, bytes):
        payload = resp.body
    else:
        payload = json.dumps(resp.body).encode()
    h.send_response(resp.status)
    h.send_header("X-Influxdb-Build", "OSS")
    h.send_header("X-Influxdb-Version", VERSION)
    for k, v in resp.headers.items():
        h.send_header(k, v)
    if payload:
        h.send_header("Content-Type", resp.content_type)
    h.send_header("Content-Length", str(len(payload)))
    h.end_headers()
    h.wfile.write(payload)


_ID = re.compile(r"[0-9a-f]{16}")


def is_id(text: str) -> bool:
    """A platform ID as the API spells it: 16 lowercase hex digits (``kit/platform/id.go`` ``IDFromString``)."""
    return bool(_ID.fullmatch(text)) and text != "0" * 16
