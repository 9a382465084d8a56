"""The training side of the channel: hand messages to the node's agent, or record them to a file.

Used only from the run's worker thread (never from the training loop), so it needs no locks.
Every send is non-blocking; every message waits in a bounded buffer until the agent acknowledges
it. Messages go only to an agent socket the user can trust (:mod:`gpulse.channel.trust`), and
only acknowledgements from that agent's user count (:mod:`gpulse.channel.endpoint`). When the
agent is absent, not trusted, does not acknowledge within ``ack_timeout``, or the buffer would
overflow, unacknowledged points are appended to the recording file
(:mod:`gpulse.channel.recording`), so nothing is lost (duplicates with what the agent wrote are
harmless: same series and timestamp overwrite on upload).
"""

from __future__ import annotations

import errno
import socket
import time
from collections import deque
from typing import Any

from gpulse.channel import protocol
from gpulse.channel.endpoint import AgentEndpoint
from gpulse.channel.trust import UntrustedSocket
from gpulse.training.errors import Guard

#: Send errors that mean "try again later" (the agent's queue is full).
_RETRY_LATER = {errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EINTR}
#: Send errors that mean "no agent there".
_AGENT_ABSENT = {errno.ENOENT, errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOTDIR, errno.EACCES, errno.EPERM}

Outgoing = protocol.Point | protocol.Register | protocol.Unregister


class _Entry:
    __slots__ = ("data", "msg", "seq", "t")

    def __init__(self, seq: int, data: bytes, msg: Outgoing, t: float) -> None:
        self.seq = seq
        self.data = data
        self.msg = msg
        self.t = t  # creation time, then send time (monotonic)


class Client:
    """Reliable-enough delivery of channel messages: a trusted agent first, the recording file as the fallback."""

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
        socket_group: str | None = None,
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
        # counters (read by tests and the run's summary)
        self.sent = 0
        self.acked = 0
        self.recorded = 0
        self.dropped = 0
        self.datagrams = 0
        self._host = socket.gethostname()
        self._recorder: Any = None
        self.endpoint: AgentEndpoint | None = None
        try:
            self.endpoint = AgentEndpoint(path, socket_group)
        except OSError as exc:  # no abstract sockets (not Linux): everything is recorded
            self.guard.report("socket_bind", exc, f"recording to {record_path}")

    # -- queueing -----------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Messages not yet acknowledged (unsent + in flight)."""
        return len(self._unsent) + len(self._inflight)

    def submit(self, msg: Outgoing) -> None:
        """Queue one message (its ``seq`` is assigned here) for the next :meth:`pump`."""
        self._seq += 1
        msg.seq = self._seq
        try:
            data = protocol.encode(msg)
        except (TypeError, ValueError) as exc:
            self.guard.report("encode", exc)
            self.dropped += 1
            return
        entry = _Entry(self._seq, data, msg, time.monotonic())
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
        endpoint = self.endpoint
        if endpoint is None:
            self._record_all()
            return
        while self._unsent:
            n, data = protocol.datagram(e.data for e in self._unsent)
            try:
                endpoint.send(data)
            except UntrustedSocket as exc:
                self.guard.report(
                    "untrusted_socket",
                    detail=f"{exc}: not sending this run's data there; recording to {self.record_path} "
                    f"instead. Fix: {exc.fix}",
                )
                self._give_up_sending(now)
                return
            except KeyError as exc:  # the trusted group names no group on this machine
                self.guard.report("socket_group", detail=f"no group {exc}; recording to {self.record_path}")
                self._give_up_sending(now)
                return
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
            for _ in range(n):
                entry = self._unsent.popleft()
                entry.t = now
                self._inflight.append(entry)
            self.sent += n

    def _give_up_sending(self, now: float) -> None:
        """Record everything now (no agent to wait for), and look again after ``retry_interval``."""
        self.agent_absent = True
        self._retry_at = now + self.retry_interval
        self._record_all()

    def _record_all(self) -> None:
        rest = list(self._inflight) + list(self._unsent)
        self._inflight.clear()
        self._unsent.clear()
        self._bytes = 0
        if rest:
            self._record(rest)

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
        endpoint = self.endpoint
        if endpoint is None:
            return
        foreign = endpoint.foreign
        try:
            for data in endpoint.receive():
                reply = protocol.decode_reply(data)
                if type(reply) is protocol.Ack:
                    if reply.host:
                        self._host = reply.host  # the agent's host tag: recorded points must match its series
                    self._ack(reply.upto)
                elif reply is None:
                    self.guard.report("bad_reply", detail=repr(data[:80]))
        except OSError as exc:
            self.guard.report("recv", exc)
        if endpoint.foreign > foreign:
            self.guard.report("foreign_datagram", detail="a datagram not from the agent's user was ignored")

    def _ack(self, upto: int) -> None:
        if upto <= self.acked_upto:
            return
        self.acked_upto = upto
        queue = self._inflight
        while queue and queue[0].seq <= upto:
            self._bytes -= len(queue.popleft().data)
            self.acked += 1

    def wait_readable(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when the agent replies."""
        if self.endpoint is None:
            time.sleep(timeout)
        else:
            self.endpoint.wait_readable(timeout)

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
        self._record_all()
        if self._recorder is not None:
            try:
                self._recorder.close()
            except OSError as exc:
                self.guard.report("record_close", exc)
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None

    # -- the recording file -------------------------------------------------------------------------
    def _record(self, entries: list[_Entry]) -> None:
        points = [e.msg for e in entries if type(e.msg) is protocol.Point]
        if not points:
            return
        try:
            if self._recorder is None:
                from gpulse.channel.recording import Recorder  # only now: the happy path never needs the encoder

                self._recorder = Recorder(self.record_path)
            self.recorded += self._recorder.write(points, self._host)
        except Exception as exc:
            self.dropped += len(points)
            self.guard.report("record_write", exc)
