"""A loopback HTTP server that misbehaves on purpose, byte by byte: what no well-behaved test server does.

Each accepted connection reads one request at a time (request line, headers, ``Content-Length``
body) and hands it to a *behaviour*: a function that writes whatever it likes to the raw socket and
returns whether to keep the connection for another request. The behaviours here are the ones
issue 15 met: headers then one byte every few seconds (:func:`trickle_body`), a status line sent one
byte at a time (:func:`trickle_headers`), a 400 MB answer to a write (:func:`huge_body`), and a
server that reads the request and never answers (:func:`silent`). ``sent`` counts the bytes the
server managed to send, ``connections`` the connections it accepted.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RawRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class RawHTTPServer:
    behaviour: Callable[[socket.socket, RawRequest, RawHTTPServer], bool]
    #: serve HTTPS with this server context (its certificate and key loaded)
    tls: ssl.SSLContext | None = None
    requests: list[RawRequest] = field(default_factory=list)
    connections: int = 0
    sent: int = 0

    def __post_init__(self) -> None:
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        scheme = "https" if self.tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RawHTTPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._thread.join(5)
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def send(self, sock: socket.socket, data: bytes) -> None:
        sock.sendall(data)
        with self._lock:
            self.sent += len(data)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        if self.tls is not None:
            try:
                sock.settimeout(5)
                sock = self.tls.wrap_socket(sock, server_side=True)
                sock.settimeout(None)
            except (OSError, ssl.SSLError):  # a client that refuses our certificate
                sock.close()
                return
        reader = sock.makefile("rb")
        try:
            while not self.stopping.is_set():
                line = reader.readline(65536)
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (h := reader.readline(65536)) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = reader.read(int(headers.get("content-length") or 0))
                req = RawRequest(method, path, headers, body)
                with self._lock:
                    self.requests.append(req)
                if not self.behaviour(sock, req, self):
                    return
        except (OSError, ValueError):
            return
        finally:
            reader.close()
            sock.close()


def head(status: str = "200 OK", length: int | None = None, extra: str = "", *, influxdb: bool = True) -> bytes:
    """A status line and headers; ``influxdb`` adds the version headers every InfluxDB 1.6.7 answer has."""
    lines = [f"HTTP/1.1 {status}"]
    if influxdb:
        lines += ["X-Influxdb-Version: 1.6.7~rc0", "X-Influxdb-Build: OSS"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def respond(status: str = "204 No Content", body: bytes = b"", extra: str = "", *, influxdb: bool = True):
    """A well-formed answer (keeps the connection)."""

    def behave(sock: socket.socket, req: RawRequest, server: RawHTTPServer) -> bool:
        server.send(sock, head(status, len(body), extra, influxdb=influxdb) + body)
        return True

    return behave


def trickle_body(every_s: float, length: int = 1000):
    """Complete headers of a 200, then one body byte every ``every_s`` seconds: no socket timeout fires."""

    def behave(sock: socket.socket, req: RawRequest, server: RawHTTPServer) -> bool:
        server.send(sock, head("200 OK", length))
        for _ in range(length):
            if server.stopping.wait(every_s):
                return False
            server.send(sock, b"x")
        return True

    return behave


def trickle_headers(every_s: float):
    """The status line and headers, one byte every ``every_s`` seconds."""

    def behave(sock: socket.socket, req: RawRequest, server: RawHTTPServer) -> bool:
        for b in head("204 No Content", 0):
            if server.stopping.wait(every_s):
                return False
            server.send(sock, bytes([b]))
        return True

    return behave


def huge_body(total: int = 400 * 1024 * 1024, status: str = "200 OK"):
    """An answer that announces and sends ``total`` bytes as fast as the client reads them."""
    chunk = b"\0" * (1 << 20)

    def behave(sock: socket.socket, req: RawRequest, server: RawHTTPServer) -> bool:
        server.send(sock, head(status, total))
        left = total
        while left > 0 and not server.stopping.is_set():
            piece = chunk[: min(left, len(chunk))]
            server.send(sock, piece)
            left -= len(piece)
        return True

    return behave


def silent(sock: socket.socket, req: RawRequest, server: RawHTTPServer) -> bool:
    """Read the request, never answer."""
    server.stopping.wait()
    return False
