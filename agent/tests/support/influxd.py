"""A real InfluxDB 1.x server (Debian's ``influxd``) on a free loopback port in a temp dir.

Tests talk to it over HTTP exactly as users' agents do. ``stop()``/``start()`` keep the data
directory, so a test can take the database away mid-run and bring it back.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default low end


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range, never one given twice.

    Why not ``bind(("127.0.0.1", 0))``: that port comes from the ephemeral range
    (``ip_local_port_range``, 32768-60999 here), which the kernel also gives every outgoing
    connection. Between our probe closing it and influxd binding it, one of the suite's own
    connections took it once in CI (stop 24: ``listen tcp 127.0.0.1:35371: bind: address already
    in use``). Below that range only explicit binds land, and this process hands each port out once.
    """
    low = _ephemeral_low()
    pool = range(max(1024, low - 16384), low)
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(pool)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free loopback port in {pool.start}-{pool.stop - 1} after 200 tries")


def influxd_path() -> str | None:
    return shutil.which("influxd") or (os.path.exists("/usr/bin/influxd") and "/usr/bin/influxd") or None


class PortTaken(RuntimeError):
    """influxd exited because a port we chose was bound by someone else in the meantime."""


class InfluxDB1:
    def __init__(self, root: Path, *, auth: bool = False, max_body_size: int = 25_000_000) -> None:
        self.root = Path(root)
        self.auth = auth
        self.max_body_size = max_body_size
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.root / "influxd.log"
        self.config = self.root / "influxdb.conf"
        self.started_once = False
        (self.root / "meta").mkdir(parents=True, exist_ok=True)
        self._choose_ports()

    def _choose_ports(self) -> None:
        self.port = free_port()
        self.rpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config.write_text(
            f"""reporting-enabled = false
bind-address = "127.0.0.1:{self.rpc_port}"
[meta]
  dir = "{self.root}/meta"
  logging-enabled = false
[data]
  dir = "{self.root}/data"
  wal-dir = "{self.root}/wal"
  query-log-enabled = false
  wal-fsync-delay = "0s"
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = true
  log-enabled = false
  run-interval = "1s"
[http]
  bind-address = "127.0.0.1:{self.port}"
  auth-enabled = {"true" if self.auth else "false"}
  log-enabled = false
  max-body-size = {self.max_body_size}
[retention]
  enabled = false
[subscriber]
  enabled = false
"""
        )

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> InfluxDB1:
        """Start influxd and wait for ``/ping``.

        The first start takes other ports if another process bound ours first; a restart keeps
        them, because the test's clients hold the URL, and says so if they were taken.
        """
        for _ in range(3):
            try:
                return self._start_once(timeout)
            except PortTaken:
                if self.started_once:
                    raise
                self._choose_ports()
        return self._start_once(timeout)

    def _start_once(self, timeout: float) -> InfluxDB1:
        exe = influxd_path()
        if exe is None:
            raise RuntimeError("influxd not found: apt-get install -y influxdb (the CI script does)")
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [exe, "-config", str(self.config)], stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                with open(self.log_path, "rb") as f:
                    f.seek(log_start)
                    tail = f.read().decode(errors="replace")
                if "address already in use" in tail:
                    raise PortTaken(f"influxd could not bind {self.url} or its RPC port: {tail[-300:]}")
                raise RuntimeError(f"influxd exited: {tail[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as r:
                    if r.status == 204:
                        self.started_once = True
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.1)
        raise RuntimeError("influxd did not answer /ping in time")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    # -- HTTP -----------------------------------------------------------------------------------
    def query(
        self, q: str, db: str | None = None, epoch: str = "ns", user: tuple[str, str] | None = None
    ) -> dict[str, Any]:
        params = {"q": q, "epoch": epoch}
        if db:
            params["db"] = db
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(f"{self.url}/query", data=data, method="POST")
        if user:  # influxd 1.6 reads u/p from the URL or Basic auth, not from a POST body
            req.add_header("Authorization", "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode())
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
        for res in body.get("results", []):
            if "error" in res:
                raise RuntimeError(f"query failed: {res['error']}: {q}")
        return body

    def rows(self, q: str, db: str = "gpulse", **kw: Any) -> list[dict[str, Any]]:
        """Every row of every series the query returns, as dicts (tags merged in)."""
        out = []
        for res in self.query(q, db=db, **kw).get("results", []):
            for s in res.get("series", []) or []:
                tags = s.get("tags", {})
                for values in s["values"]:
                    row = dict(zip(s["columns"], values, strict=True))
                    row.update(tags)
                    row.setdefault("_measurement", s.get("name"))
                    out.append(row)
        return out

    def count(self, measurement: str, field: str, db: str = "gpulse", where: str = "") -> int:
        w = f" WHERE {where}" if where else ""
        rows = self.rows(f'SELECT count("{field}") FROM "{measurement}"{w}', db=db)
        return int(rows[0]["count"]) if rows else 0

    def write(self, lines: str | bytes, db: str = "gpulse", precision: str = "n") -> None:
        body = lines.encode() if isinstance(lines, str) else lines
        req = urllib.request.Request(f"{self.url}/write?db={db}&precision={precision}", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 204

    def create_database(self, db: str = "gpulse") -> None:
        self.query(f'CREATE DATABASE "{db}"')
