"""The one HTTP client gpulse talks to InfluxDB with: writes (v1 and v2), InfluxQL, probes, setup's admin API.

Why our own client on :mod:`http.client`, and no ``influxdb-client`` (decided for issues 9 and 15):

* **A total deadline per request.** Every request ends within its ``timeout_s`` however the server
  behaves: connect, send, status line, headers and body together. Socket timeouts (all that
  urllib, urllib3 and so ``influxdb-client`` offer) restart at every byte received, so a server that
  sends one byte every 5 s holds a request open forever. Here a watchdog thread shuts the socket
  down at the deadline, which ends any blocked send or receive at once.
* **Bounded answers.** A body is read up to ``max_body`` bytes (64 KiB unless the caller needs
  more, like InfluxQL results); a larger one is cut (``Response.truncated``) and its connection
  dropped, so a 400 MB answer to a write costs 64 KiB, not 400 MB.
* **A close that never blocks.** :meth:`HttpClient.close` from another thread aborts the request in
  flight (it shuts the socket down) instead of waiting for it: an agent's shutdown is never held by
  a stalled server.
* **One stack for both APIs.** ``influxdb-client`` speaks only the v2 API; the v1 sink, InfluxQL and
  the probes needed their own code anyway (three stacks, three ways to read an error). Its import
  is heavy (``bench/bench_import.py``, figures in BENCHMARKS.md) for what is here a few POSTs and GETs, and
  its ping/health/version helpers swallow the headers that tell InfluxDB 1.x from 2.x. So it is
  not a runtime dependency; it stays in the ``test`` extra as the benchmarks' baseline.

The API (stable: setup, the sinks, InfluxQL and the probe all use it)::

    client = HttpClient("http://127.0.0.1:8086", authorization=token_auth(token), timeout_s=10)
    client = conn.http_client()                       # the same from a Connection (URL, credentials, TLS)
    r = client.request("POST", "/api/v2/write", params={"org": o, "bucket": b}, body=data, gzip=True)
    r.status, r.headers, r.body, r.ok, r.message()      # Response; r.json() decodes the body
    doc = client.call("GET", "/api/v2/buckets", params={"name": "gpulse"})   # JSON in and out
    client.close()

``request`` returns a :class:`Response` for every status; only a failure to get a complete answer
raises (:class:`TransportError`, with a :class:`Failure` saying which). ``call`` (and its short forms
``get_json``, ``post_json``, ``patch_json``, ``delete``) sends ``json=`` and decodes the answer (up to
16 MiB, ``max_body=`` for more), raising :class:`HTTPStatusError` for a non-2xx status. One client holds one keep-alive
connection and sends one request at a time (a lock serialises callers).
"""

from __future__ import annotations

import base64
import enum
import errno
import gzip as _gzip
import heapq
import http.client
import itertools
import json as _json
import math
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

from gpulse import __version__

DEFAULT_TIMEOUT_S = 10.0
#: what an answer to a write or a probe may hold before it is cut
DEFAULT_MAX_BODY = 64 * 1024
#: what a JSON answer (:meth:`HttpClient.call`: setup's lists of buckets, tasks with their scripts) may hold
JSON_MAX_BODY = 16 * 1024 * 1024
USER_AGENT = f"gpulse/{__version__}"
_READ_CHUNK = 64 * 1024


# -- errors ------------------------------------------------------------------------------------------
class Failure(str, enum.Enum):
    """Why no complete answer came: what a caller decides on (retry, fail fast, explain)."""

    REFUSED = "refused"  # nothing listens at that host and port
    UNRESOLVED = "unresolved"  # the host name does not resolve
    TIMEOUT = "timeout"  # the total deadline passed (connect, send, or a slow or trickling answer)
    TLS = "tls"  # TLS handshake or certificate verification failed
    BROKEN = "broken"  # reset, closed mid-answer, or not HTTP
    CLOSED = "closed"  # the client was closed (shutdown) while or before sending


class TransportError(Exception):
    """No complete HTTP answer: the message names the URL and the reason, never a credential."""

    def __init__(self, url: str, failure: Failure, detail: str, elapsed_s: float = 0.0) -> None:
        self.url, self.failure, self.detail, self.elapsed_s = url, failure, detail, elapsed_s
        super().__init__(self.describe())

    def describe(self) -> str:
        if self.failure in (Failure.REFUSED, Failure.UNRESOLVED):
            return f"cannot reach {self.url}: {self.detail}"
        return f"{self.url}: {self.detail}"


class HTTPStatusError(Exception):
    """A complete answer with a non-2xx status, from :meth:`HttpClient.call`."""

    def __init__(self, response: Response) -> None:
        self.response = response
        self.status = response.status
        super().__init__(f"HTTP {response.status}: {response.message()}")


# -- answers -----------------------------------------------------------------------------------------
def header_value(headers: Mapping[str, str] | Message | None, name: str) -> str | None:
    """A header from a :class:`Message` or a plain mapping, ignoring case."""
    if not headers:
        return None
    if isinstance(headers, Message):
        return headers.get(name)
    lowered = name.lower()
    for k, v in headers.items():
        if str(k).lower() == lowered:
            return str(v)
    return None


def error_message(headers: Mapping[str, str] | Message | None, body: bytes | str | None) -> str:
    """The server's error text: the JSON body's ``message``/``error``, else the error headers, else the body.

    InfluxDB 2.x answers ``{"code": …, "message": …}``; 1.x ``{"error": …}`` plus ``X-Influxdb-Error``
    (``services/httpd/handler.go`` ``httpError``); proxies answer HTML or plain text.
    """
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        doc = _json.loads(text) if text.strip().startswith("{") else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("message", "error"):
            if isinstance(doc.get(key), str) and doc[key]:
                return doc[key]
    for h in ("X-Influx-Error", "X-InfluxDB-Error", "X-Platform-Error-Code"):
        v = header_value(headers, h)
        if v:
            return v
    return " ".join(text.split())[:500] or "(no message)"


@dataclass(frozen=True)
class Response:
    status: int
    headers: Message = field(repr=False)
    body: bytes = field(repr=False)
    #: the body was longer than the client's ``max_body``: ``body`` holds its first ``max_body`` bytes
    truncated: bool = False
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def json(self) -> Any:
        """The decoded JSON body (``None`` for an empty one); ValueError when it is not JSON."""
        if self.truncated:
            raise ValueError(f"the answer is larger than the {len(self.body)} bytes read")
        return _json.loads(self.body) if self.body.strip() else None

    def message(self) -> str:
        return error_message(self.headers, self.body)


# -- requests ----------------------------------------------------------------------------------------
def token_auth(token: str) -> str:
    """``Authorization`` for InfluxDB 2.x (and 1.8+'s v2 endpoints): ``Token <token>``."""
    return f"Token {token}"


def basic_auth(user: str, password: str) -> str:
    """``Authorization`` for InfluxDB 1.x: HTTP Basic with ``user:password``."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def gzip_body(body: bytes) -> bytes:
    """gzip at level 1: line protocol compresses well even so, and the agent's CPU matters more."""
    return _gzip.compress(body, compresslevel=1, mtime=0)


@dataclass(frozen=True)
class Target:
    """The parts of a base URL a connection needs."""

    scheme: str
    host: str
    port: int | None
    prefix: str  # a path the server is mounted under, without the trailing slash


def parse_url(url: str) -> Target:
    """An ``http(s)://host[:port][/prefix]`` URL; credentials in it are refused (they would be echoed)."""
    u = urllib.parse.urlsplit(url)
    if "@" in u.netloc:
        raise ValueError(
            "credentials in the URL are refused (they would show in logs, `gpulse status` and `ps`): "
            "remove 'user:password@' from --url and put the credentials in a file (chmod 600) named "
            "by --token-file (user:password for --api v1, the token for --api v2)"
        )
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    try:
        port = u.port
    except ValueError:
        raise ValueError(f"bad port in URL {u.scheme}://{u.netloc}") from None
    return Target(u.scheme, u.hostname, port, u.path.rstrip("/"))


def with_query(path: str, params: Mapping[str, Any] | None) -> str:
    """``path`` with ``params`` as its query string (a list value repeats its key), as every request sends it."""
    return f"{path}?{urllib.parse.urlencode(params, doseq=True)}" if params else path


class HttpClient:
    """One keep-alive connection to one server; every request bounded by a total deadline."""

    def __init__(
        self,
        url: str,
        *,
        authorization: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        verify_tls: bool = True,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.target = parse_url(url)
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_body = max_body
        self._authorization = authorization
        self._tls = (
            (ssl.create_default_context() if verify_tls else ssl._create_unverified_context())
            if self.target.scheme == "https"
            else None
        )
        self._lock = threading.Lock()  # one request at a time on the connection
        self._state = threading.Lock()  # guards _conn/_closed between request() and close()
        self._conn: http.client.HTTPConnection | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"HttpClient({self.url!r})"  # never the authorization

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the JSON helpers --------------------------------------------------------------------------
    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        timeout_s: float | None = None,
        max_body: int = JSON_MAX_BODY,
    ) -> Any:
        """Send ``json`` (if any), return the decoded JSON answer (``None`` when empty).

        Raises :class:`HTTPStatusError` for a non-2xx answer, :class:`TransportError` without one
        (also for an answer that is not JSON, or larger than ``max_body``)."""
        r = self.request(method, path, params=params, json=json, timeout_s=timeout_s, max_body=max_body)
        if not r.ok:
            raise HTTPStatusError(r)
        try:
            return r.json()
        except ValueError:
            what = f"more than {max_body} bytes" if r.truncated else "no valid JSON"
            raise TransportError(
                self.url, Failure.BROKEN, f"{method} {path} answered HTTP {r.status} with {what}"
            ) from None

    def get_json(self, path: str, *, params: Mapping[str, Any] | None = None, max_body: int = JSON_MAX_BODY) -> Any:
        return self.call("GET", path, params=params, max_body=max_body)

    def post_json(self, path: str, json: Any, *, params: Mapping[str, Any] | None = None) -> Any:
        return self.call("POST", path, params=params, json=json)

    def patch_json(self, path: str, json: Any, *, params: Mapping[str, Any] | None = None) -> Any:
        return self.call("PATCH", path, params=params, json=json)

    def delete(self, path: str, *, params: Mapping[str, Any] | None = None) -> None:
        self.call("DELETE", path, params=params)

    # -- the request -------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        gzip: bool = False,
        timeout_s: float | None = None,
        max_body: int | None = None,
    ) -> Response:
        """One request, answered within ``timeout_s`` (the client's by default) or :class:`TransportError`.

        ``json`` is encoded as the body (``Content-Type: application/json``); ``gzip`` compresses the
        body (``Content-Encoding: gzip``). The answer's body is read up to ``max_body`` bytes."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        cap = self.max_body if max_body is None else max_body
        sent_headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self._authorization:
            sent_headers["Authorization"] = self._authorization
        payload = body
        if json is not None:
            payload = _json.dumps(json, separators=(",", ":")).encode()
            sent_headers["Content-Type"] = "application/json; charset=utf-8"
        if gzip and payload is not None:
            payload = gzip_body(payload)
            sent_headers["Content-Encoding"] = "gzip"
        sent_headers.update(headers or {})
        url = self.target.prefix + with_query(path, params)
        with self._lock:
            return self._exchange(method, url, payload, sent_headers, timeout, cap)

    def _exchange(
        self, method: str, url: str, payload: bytes | None, headers: dict[str, str], timeout: float, cap: int
    ) -> Response:
        start = time.monotonic()
        conn = self._connection(timeout)
        fired = threading.Event()
        watch = WATCHDOG.arm(start + timeout, lambda: (fired.set(), _shutdown(conn)))
        try:
            try:
                if conn.sock is None:
                    conn.connect()
                if self._closed:  # closed while connecting: close() found no socket to cut
                    raise ConnectionAbortedError()
                conn.request(method, url, body=payload, headers=headers)
                resp = conn.getresponse()
                data, truncated = _read_capped(resp, cap)
            except (OSError, http.client.HTTPException, ValueError) as e:
                self._drop(conn)
                raise self._transport_error(e, fired, timeout, start) from None
            if fired.is_set():  # the deadline cut the answer short: what was read is not the answer
                self._drop(conn)
                raise self._transport_error(TimeoutError(), fired, timeout, start)
            if truncated or resp.will_close:
                self._drop(conn)
            return Response(resp.status, resp.headers, data, truncated, time.monotonic() - start)
        finally:
            WATCHDOG.cancel(watch)

    def _transport_error(
        self, e: BaseException, fired: threading.Event, timeout: float, start: float
    ) -> TransportError:
        elapsed = time.monotonic() - start
        if self._closed:
            return TransportError(self.url, Failure.CLOSED, "the client was closed (shutdown)", elapsed)
        if fired.is_set() or isinstance(e, TimeoutError):
            return TransportError(
                self.url, Failure.TIMEOUT, f"no complete answer within {timeout:g} s (the request's deadline)", elapsed
            )
        if isinstance(e, ConnectionRefusedError):
            return TransportError(self.url, Failure.REFUSED, "Connection refused (nothing listens there)", elapsed)
        if isinstance(e, socket.gaierror):
            return TransportError(
                self.url, Failure.UNRESOLVED, f"cannot resolve {self.target.host!r}: {e.strerror}", elapsed
            )
        if isinstance(e, ssl.SSLError):
            return TransportError(self.url, Failure.TLS, f"TLS: {e.reason or e}", elapsed)
        if isinstance(e, OSError) and e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return TransportError(self.url, Failure.REFUSED, e.strerror or str(e), elapsed)
        return TransportError(self.url, Failure.BROKEN, f"{type(e).__name__}: {e}".rstrip(": "), elapsed)

    # -- the connection ----------------------------------------------------------------------------
    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        with self._state:
            if self._closed:
                raise TransportError(self.url, Failure.CLOSED, "the client was closed (shutdown)")
            conn = self._conn
            if conn is not None and not _reusable(conn):
                conn.close()
                conn = None
            if conn is None:
                t = self.target
                if self._tls is not None:
                    conn = http.client.HTTPSConnection(t.host, t.port, timeout=timeout, context=self._tls)
                else:
                    conn = http.client.HTTPConnection(t.host, t.port, timeout=timeout)
                self._conn = conn
            conn.timeout = timeout  # bounds connect; the watchdog bounds everything
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        with self._state:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def close(self) -> None:
        """Close the connection; a request in flight is aborted (it raises ``Failure.CLOSED``). Never blocks."""
        with self._state:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._lock.locked():  # a request is in flight on it: cut the socket, its thread cleans up
            _shutdown(conn)
        else:
            conn.close()


def _read_capped(resp: http.client.HTTPResponse, cap: int) -> tuple[bytes, bool]:
    """The body up to ``cap`` bytes, and whether there was more."""
    chunks: list[bytes] = []
    got = 0
    while got <= cap:
        chunk = resp.read(min(_READ_CHUNK, cap + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    data = b"".join(chunks)
    if got > cap:
        return data[:cap], True
    if resp.length:  # a Content-Length answer that ended early (http.client does not raise for it)
        raise http.client.IncompleteRead(data, resp.length)
    return data, False


def _reusable(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive socket is reusable unless the server closed it (it reads as ready: EOF)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _shutdown(conn: http.client.HTTPConnection) -> None:
    """End every blocked send/recv on the connection now (from another thread); the owner closes it."""
    sock = conn.sock
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the raw socket's, also under TLS
    except OSError:
        pass


# -- the watchdog ------------------------------------------------------------------------------------
class Watchdog:
    """One daemon thread that runs each armed callback at its deadline (unless cancelled first)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._armed: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        #: the deadline the thread is waiting for (inf: for a notify), None while it is not waiting
        self._until: float | None = None

    def arm(self, when: float, callback: Callable[[], object]) -> int:
        """Run ``callback`` at ``time.monotonic() == when``; returns a handle for :meth:`cancel`."""
        with self._cv:
            n = next(self._ids)
            heapq.heappush(self._heap, (when, n, callback))
            self._armed.add(n)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gpulse-http-watchdog", daemon=True)
                self._thread.start()
            if self._until is not None and when < self._until:  # else it wakes in time, or looks before waiting
                self._cv.notify()
            return n

    def cancel(self, handle: int) -> None:
        with self._cv:
            self._armed.discard(handle)

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    while self._heap and self._heap[0][1] not in self._armed:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._until = math.inf
                        self._cv.wait()
                        self._until = None
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        _, n, callback = heapq.heappop(self._heap)
                        self._armed.discard(n)
                        break
                    self._until = self._heap[0][0]
                    self._cv.wait(wait)
                    self._until = None
            try:
                callback()
            except Exception:  # a callback must not kill the watchdog of every other request
                pass

    def _after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]  # the thread did not survive the fork; neither do its entries


WATCHDOG = Watchdog()
os.register_at_fork(after_in_child=WATCHDOG._after_fork)
