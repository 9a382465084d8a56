"""The training side of the channel: send messages to the node's agent, or record them to a file.

Used only from the run's background thread (never from the training loop), so it needs no
locks. Every send is non-blocking; every message waits in a bounded buffer until the agent
acknowledges it. When the agent is absent, does not acknowledge within ``ack_timeout``, or the
buffer would overflow, unacknowledged ``point`` messages are appended as line protocol to the
recording file, so nothing is lost (duplicates with what the agent wrote are harmless: same
series and timestamp overwrite on upload).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import time
from collections import deque
from typing import Any

from gpulse.channel import protocol
from gpulse.training.errors import Guard

#: Send errors that mean "try again later" (the agent's queue is full).
_RETRY_LATER = {errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EINTR}
#: Send errors that mean "no agent there".
_AGENT_ABSENT = {errno.ENOENT, errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOTDIR, errno.EACCES, errno.EPERM}

RECORD_FILE = "gpulse-records.lp"


class _Entry:
    __slots__ = ("data", "msg", "seq", "t")

    def __init__(self, seq: int, data: bytes, msg: dict, t: float) -> None:
        self.seq = seq
        self.data = data
        self.msg = msg
        self.t = t  # creation time, then send time (monotonic)


class Client:
    """Reliable-enough delivery of channel messages: agent first, recording file as the fallback."""

    def __init__(
        self,
        path: str,
        record_path: str,
        *,
        ack_timeout: float = 10.0,
        max_unacked: int = 10_000,
        max_unacked_bytes: int = 8 << 20,
        retry_interval: float = 1.0,
        guard: Guard | None = None,
    ) -> None:
        self.path = path
        self.record_path = record_path
        self.ack_timeout = ack_timeout
        self.max_unacked = max_unacked
        self.max_unacked_bytes = max_unacked_bytes
        self.retry_interval = retry_interval
        self.guard = guard or Guard()
        self._seq = 0
        self._unsent: deque[_Entry] = deque()
        self._inflight: deque[_Entry] = deque()
        self._bytes = 0
        self._retry_at = 0.0
        self.agent_absent = False
        self.acked_upto = 0
        self.last_ack = 0.0
        # counters (read by tests and the run's summary)
        self.sent = 0
        self.acked = 0
        self.recorded = 0
        self.dropped = 0
        self.datagrams = 0
        self._encoder: Any = None
        self._host = socket.gethostname()
        self._record_fd: int | None = None
        self._real_path: str | None = None
        self.sock: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.bind(protocol.client_address())
            self.sock = sock
        except OSError as exc:  # no abstract sockets (not Linux): send without replies, record on timeout
            self.guard.report("socket_bind", exc)
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.sock.setblocking(False)
            except OSError as exc2:
                self.guard.report("socket_create", exc2)

    # -- queueing -----------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Messages not yet acknowledged (unsent + in flight)."""
        return len(self._unsent) + len(self._inflight)

    def submit(self, msg: dict) -> None:
        """Queue one message (its ``seq`` is assigned here) for the next :meth:`pump`."""
        if msg.get("kind") in protocol.SEQUENCED_KINDS:
            self._seq += 1
            msg["seq"] = self._seq
        try:
            data = protocol.encode(msg)
        except (TypeError, ValueError) as exc:
            self.guard.report("encode", exc)
            self.dropped += 1
            return
        entry = _Entry(msg.get("seq", 0), data, msg, time.monotonic())
        if len(data) > protocol.MAX_DATAGRAM:
            self.guard.report("oversize_message", detail=f"{len(data)} bytes; recorded to file")
            self._record([entry])
            return
        self._unsent.append(entry)
        self._bytes += len(data)
        self._enforce_bounds()

    def _enforce_bounds(self) -> None:
        over = (len(self._unsent) + len(self._inflight)) - self.max_unacked
        spill: list[_Entry] = []
        while (over > 0 or self._bytes > self.max_unacked_bytes) and (self._inflight or self._unsent):
            entry = self._inflight.popleft() if self._inflight else self._unsent.popleft()
            self._bytes -= len(entry.data)
            spill.append(entry)
            over -= 1
        if spill:
            self.guard.report("buffer_full", detail="unacknowledged messages recorded to file")
            self._record(spill)

    # -- sending ------------------------------------------------------------------------------------
    def pump(self, now: float | None = None) -> None:
        """Read acks, send what is unsent, and record what waited longer than ``ack_timeout``."""
        now = time.monotonic() if now is None else now
        self.read_acks()
        if self._unsent and now >= self._retry_at:
            self._send_unsent(now)
        self._expire(now)

    def _send_unsent(self, now: float) -> None:
        sock = self.sock
        if sock is None:
            return
        while self._unsent:
            group: list[_Entry] = []
            size = protocol.BATCH_OVERHEAD
            for entry in self._unsent:
                if group and size + len(entry.data) + 1 > protocol.MAX_DATAGRAM:
                    break
                group.append(entry)
                size += len(entry.data) + 1
            data = group[0].data if len(group) == 1 else protocol.encode_batch(e.data for e in group)
            try:
                sock.sendto(data, socket.MSG_DONTWAIT, self.path)
            except OSError as exc:
                if exc.errno in _RETRY_LATER:
                    self._retry_at = now + 0.05
                else:
                    if exc.errno not in _AGENT_ABSENT:
                        self.guard.report("send", exc)
                    self.agent_absent = True
                    self._retry_at = now + self.retry_interval
                return
            self.agent_absent = False
            self.datagrams += 1
            for _ in group:
                entry = self._unsent.popleft()
                entry.t = now
                self._inflight.append(entry)
            self.sent += len(group)

    def _expire(self, now: float) -> None:
        limit = now - self.ack_timeout
        spill: list[_Entry] = []
        for queue in (self._inflight, self._unsent):
            while queue and queue[0].t <= limit:
                entry = queue.popleft()
                self._bytes -= len(entry.data)
                spill.append(entry)
        if spill:
            self.guard.report(
                "agent_unavailable",
                detail=f"no acknowledgement from {self.path} within {self.ack_timeout:g} s; recording to {self.record_path}",
            )
            self._record(spill)

    def read_acks(self) -> None:
        sock = self.sock
        if sock is None:
            return
        while True:
            try:
                data, addr = sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.guard.report("recv", exc)
                return
            if not self._from_agent(addr):  # abstract sockets have no permissions: accept only our agent
                self.guard.report("foreign_datagram", detail=repr(addr)[:80])
                continue
            try:
                messages = protocol.decode(data)
            except protocol.ProtocolError as exc:
                self.guard.report(f"bad_reply_{exc.cause}", exc)
                continue
            for msg in messages:
                if msg.get("kind") != protocol.KIND_ACK:
                    continue
                host = msg.get("host")
                if type(host) is str and host and len(host) <= 256:
                    self._host = host  # the agent's host tag: recorded points must match its series
                upto = msg.get("upto")
                if type(upto) is int:
                    self._ack(upto)

    def _from_agent(self, addr: Any) -> bool:
        if addr == self.path:
            return True
        if not isinstance(addr, str) or not addr or addr.startswith("\0"):
            return False
        if self._real_path is None:
            self._real_path = os.path.realpath(self.path)
        return os.path.realpath(addr) == self._real_path

    def _ack(self, upto: int) -> None:
        self.last_ack = time.monotonic()
        if upto <= self.acked_upto:
            return
        self.acked_upto = upto
        queue = self._inflight
        while queue and queue[0].seq <= upto:
            self._bytes -= len(queue.popleft().data)
            self.acked += 1

    def wait_readable(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when the agent replies."""
        if self.sock is None:
            time.sleep(timeout)
            return
        try:
            select.select([self.sock], [], [], timeout)
        except (OSError, ValueError):
            time.sleep(timeout)

    def close(self, wait: float = 2.0) -> None:
        """Send what is left, wait up to ``wait`` s for acks (not when the agent is absent), record the rest."""
        deadline = time.monotonic() + wait
        while True:
            now = time.monotonic()
            self.read_acks()
            if self._unsent and (not self.agent_absent or now >= self._retry_at):
                self._send_unsent(now)
            if not self.pending or self.agent_absent or now >= deadline:
                break
            self.wait_readable(min(0.05, max(deadline - now, 0.0)))
        rest = list(self._inflight) + list(self._unsent)
        self._inflight.clear()
        self._unsent.clear()
        self._bytes = 0
        if rest:
            self._record(rest)
        if self._record_fd is not None:
            try:
                os.fsync(self._record_fd)
                os.close(self._record_fd)
            except OSError as exc:
                self.guard.report("record_close", exc)
            self._record_fd = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    # -- the recording file -------------------------------------------------------------------------
    def _record(self, entries: list[_Entry]) -> None:
        points = [e.msg for e in entries if e.msg.get("kind") == protocol.KIND_POINT]
        if not points:
            return
        try:
            if self._encoder is None:
                from gpulse.lineprotocol.encode import Encoder  # only now: the happy path never needs the encoder

                self._encoder = Encoder()
            enc = self._encoder
            lines = []
            for msg in points:
                tags = dict(msg["tags"])
                tags["host"] = self._host
                line = enc.line(enc.series(msg["m"], tags), msg["fields"], msg["ts"])
                if line is not None:
                    lines.append(line)
            if self._record_fd is None:
                directory = os.path.dirname(self.record_path)
                if directory:
                    os.makedirs(directory, exist_ok=True)
                self._record_fd = os.open(self.record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            # one write per flush: O_APPEND keeps ranks sharing an output dir from interleaving lines
            data = memoryview("".join(lines).encode())
            while data:
                data = data[os.write(self._record_fd, data) :]
            self.recorded += len(lines)
        except Exception as exc:
            self.dropped += len(points)
            self.guard.report("record_write", exc)
