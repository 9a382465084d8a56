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
import os
import socket
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gpulse.channel import protocol
from gpulse.channel.endpoint import AgentEndpoint
from gpulse.channel.trust import UntrustedSocket
from gpulse.training.errors import Guard

#: While no agent answers, the client looks for one again after 1, 2, 4, then every 4 ``retry_interval``
#: (each look costs the worker CPU; unsent points are recorded after ``ack_timeout`` anyway).
MAX_BACKOFF = 4
#: Send errors that mean "try again later" (the agent's queue is full).
_RETRY_LATER = {errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EINTR}
#: Send errors that mean "no agent there".
_AGENT_ABSENT = {errno.ENOENT, errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOTDIR}
#: Why there is no agent, in words, for the errors that say so.
_WHY = {errno.ENOENT: "no socket there", errno.ENOTDIR: "no socket there", errno.ECONNREFUSED: "nothing listens on it"}
#: Send errors that mean "not allowed there": waiting will not help.
_NO_PERMISSION = {errno.EACCES, errno.EPERM}

Outgoing = protocol.Point | protocol.Register | protocol.Unregister


class _Chunk:
    """Messages with consecutive ``seq`` that wait together: submitted in one go (unsent), or sent in
    one datagram (in flight). Per chunk, not per message, so that a step costs no object of its own.

    ``msgs`` are either other messages (``Point``, ``Register``...) with their JSON in ``data``, or
    one :class:`~gpulse.channel.protocol.StepRows` (``data`` ``None``: rows are packed when sent). What waits
    too long is recorded to the file from ``msgs``. ``size`` is what the chunk counts against
    ``max_unacked_bytes``."""

    __slots__ = ("data", "msgs", "seqs", "size", "t")

    def __init__(
        self, msgs: list[Outgoing] | protocol.StepRows, seqs: Sequence[int], t: float, size: int, data: Sequence[bytes] | None = None
    ) -> None:  # fmt: skip
        self.msgs = msgs
        self.seqs = seqs  # a range, or a tuple when a message between was recorded instead
        self.t = t  # creation time, then send time (monotonic)
        self.size = size
        self.data = data

    def split(self, n: int) -> _Chunk:
        """Take the first ``n`` messages off into a chunk of their own."""
        data, msgs = self.data, self.msgs
        if data is not None:
            size = sum(map(len, data[:n]))
            self.data = data[n:]
        else:
            size = protocol.rows_size(msgs[:n])  # type: ignore[arg-type]
        front = _Chunk(msgs[:n], self.seqs[:n], self.t, size, data and data[:n])
        self.msgs = msgs[n:]
        self.seqs = self.seqs[n:]
        self.size -= size
        return front

    def points(self) -> list[protocol.Point | protocol.StepRows]:
        """What the recording file takes of this chunk."""
        if type(self.msgs) is protocol.StepRows:
            return [self.msgs]
        return [m for m in self.msgs if isinstance(m, protocol.Point)]


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
        self._unsent: deque[_Chunk] = deque()
        self._inflight: deque[_Chunk] = deque()
        self._count = 0  # messages in both
        self._bytes = 0
        self._retry_at = 0.0
        self._absent_tries = 0
        self.agent_absent = False
        #: why the last try could not reach the agent ("" once a send went through)
        self.unreachable = ""
        self.acked_upto = 0
        # counters (read by tests and the run's summary)
        self.sent = 0
        self.acked = 0
        self.recorded = 0
        self.dropped = 0
        self.datagrams = 0
        self._host = socket.gethostname()
        #: called (on the worker thread) with each rolling finding the agent tells about this run
        self.on_finding: Callable[[dict[str, Any]], None] | None = None
        self._recorder: Any = None
        self.endpoint: AgentEndpoint | None = None
        try:
            self.endpoint = AgentEndpoint(path, socket_group)
        except OSError as exc:  # no abstract sockets (not Linux): everything is recorded
            self.guard.report("socket_bind", exc, f"recording to {record_path}")

    # -- queueing -----------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        """The host tag the run's points get: the agent's, once it acknowledged one, else this machine's name."""
        return self._host

    @property
    def pending(self) -> int:
        """Messages not yet acknowledged (unsent + in flight)."""
        return self._count

    def submit(self, msg: Outgoing, now: float | None = None) -> None:
        """Queue one message (its ``seq`` is assigned here) for the next :meth:`pump`."""
        self._seq += 1
        msg.seq = self._seq
        try:
            data = protocol.encode(msg)
        except (TypeError, ValueError) as exc:
            self.guard.report("encode", exc)
            self.dropped += 1
            return
        chunk = _Chunk([msg], range(msg.seq, msg.seq + 1), time.monotonic() if now is None else now, len(data), [data])
        fields = len(msg.fields) if type(msg) is protocol.Point else 0  # the agent refuses > MAX_FIELDS
        if len(data) > protocol.MAX_DATAGRAM or fields > protocol.MAX_FIELDS:
            self._record_oversize(chunk, f"{len(data)} bytes, {fields} fields")
        else:
            self._queue(chunk)

    def submit_rows(self, rows: protocol.StepRows, now: float | None = None) -> None:
        """Queue step rows, numbered here in order (their chunk keeps the numbers). Nothing is encoded
        now: rows are packed as they are sent, and their size is known without it."""
        if not rows.rows:
            return
        first = self._seq + 1
        self._seq += len(rows.rows)
        t = time.monotonic() if now is None else now
        chunk = _Chunk(rows, range(first, self._seq + 1), t, protocol.rows_size(rows))
        if not protocol.rows_per_datagram(rows.head, rows.shape):  # too many fields, or their names fill a datagram
            self._record_oversize(chunk, f"{len(rows)} step point(s) of {len(rows.shape.names)} fields")
        else:
            self._queue(chunk)

    def _record_oversize(self, chunk: _Chunk, what: str) -> None:
        """Record what the agent would refuse for its size (``protocol.MAX_DATAGRAM``, ``MAX_FIELDS``), and say so."""
        self.guard.report(
            "oversize_message", detail=f"{what}: more than the agent takes in one message; recorded to file"
        )
        self._record([chunk])

    def _queue(self, chunk: _Chunk) -> None:
        self._unsent.append(chunk)
        self._count += len(chunk.seqs)
        self._bytes += chunk.size
        if self._count > self.max_unacked or self._bytes > self.max_unacked_bytes:
            self._enforce_bounds()

    def _enforce_bounds(self) -> None:
        """Record the oldest messages until the buffer is within its bounds again."""
        spill: list[_Chunk] = []
        while (self._count > self.max_unacked or self._bytes > self.max_unacked_bytes) and self._count:
            queue = self._inflight if self._inflight else self._unsent
            over = self._count - self.max_unacked
            n = len(queue[0].seqs)
            spill.append(self._take(queue, over if 0 < over < n and self._bytes <= self.max_unacked_bytes else n))
        if spill:
            why = f" ({self.unreachable})" if self.unreachable else ""
            self.guard.report("buffer_full", detail=f"unacknowledged messages recorded to {self.record_path}{why}")
            self._record(spill)

    def _take(self, queue: deque[_Chunk], n: int) -> _Chunk:
        """The first ``n`` messages of ``queue``'s first chunk, off the buffer's books."""
        chunk = queue[0]
        if n < len(chunk.seqs):
            chunk = chunk.split(n)
        else:
            queue.popleft()
        self._count -= len(chunk.seqs)
        self._bytes -= chunk.size
        return chunk

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
        unsent = self._unsent
        while unsent:
            chunk = unsent[0]
            try:
                if endpoint.agent_uid is None:
                    endpoint.connect()  # before encoding: with no agent there, nothing is encoded for nothing
                if chunk.data is None:  # step rows: as many as one datagram carries
                    rows: protocol.StepRows = chunk.msgs  # type: ignore[assignment]
                    n = min(len(rows), protocol.rows_per_datagram(rows.head, rows.shape))
                    data = protocol.encode_rows(rows[:n] if n < len(rows) else rows, chunk.seqs[0])
                else:
                    n, data = protocol.datagram(chunk.data)
                endpoint.send(data)
            except UntrustedSocket as exc:
                self.unreachable = f"the agent socket {exc}"
                self.guard.report(
                    "untrusted_socket",
                    detail=f"{exc}: not sending this run's data there; recording to {self.record_path} "
                    f"instead. Fix: {exc.fix}",
                )
                self._give_up_sending(now)
                return
            except KeyError as exc:  # the trusted group names no group on this machine
                self.unreachable = f"no group {exc} on this machine (GPULSE_SOCKET_GROUP)"
                self.guard.report("socket_group", detail=f"no group {exc}; recording to {self.record_path}")
                self._give_up_sending(now)
                return
            except OSError as exc:
                if exc.errno in _RETRY_LATER:
                    self._retry_at = now + 0.05
                    return
                self.unreachable = f"no agent at {self.path}: {_WHY.get(exc.errno, exc.strerror or str(exc))}"
                if exc.errno in _NO_PERMISSION:  # will not get better by waiting: say so now, record now
                    where = f" ({exc.filename})" if exc.filename and exc.filename != self.path else ""
                    self.unreachable = f"cannot reach the agent at {self.path}: {exc.strerror}{where}"
                    self.guard.report(
                        "socket_permission",
                        detail=f"{self.unreachable}; recording this run's data to {self.record_path}. Fix: "
                        "give your user access to the socket and its directory (an agent of another user "
                        "lets a group in with its --socket-group and GPULSE_SOCKET_GROUP), or point "
                        "GPULSE_SOCKET at an agent of yours",
                    )
                    self._give_up_sending(now)
                    return
                if exc.errno not in _AGENT_ABSENT:
                    self.guard.report("send", exc)
                self.agent_absent = True
                self._absent_tries += 1  # look again after 1, 2, 4, 4... retry intervals
                self._retry_at = now + self.retry_interval * min(2 ** (self._absent_tries - 1), MAX_BACKOFF)
                return
            self.agent_absent = False
            self._absent_tries = 0
            self.unreachable = ""
            self.datagrams += 1
            sent = chunk.split(n) if n < len(chunk.seqs) else unsent.popleft()
            sent.t = now
            self._inflight.append(sent)
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
        self._bytes = self._count = 0
        if rest:
            self._record(rest)

    def _expire(self, now: float) -> None:
        limit = now - self.ack_timeout
        spill: list[_Chunk] = []
        for queue in (self._inflight, self._unsent):
            while queue and queue[0].t <= limit:
                spill.append(self._take(queue, len(queue[0].seqs)))
        if spill:
            why = self.unreachable or f"no acknowledgement from {self.path} within {self.ack_timeout:g} s"
            self.guard.report("agent_unavailable", detail=f"{why}; recording to {self.record_path}")
            self._record(spill)

    def recorded_summary(self) -> str | None:
        """What went to the recording file and why, in one sentence; ``None`` when nothing did."""
        if not self.recorded:
            return None
        why = self.unreachable or "not acknowledged by the agent in time"
        points = "1 point is" if self.recorded == 1 else f"{self.recorded} points are"
        return (
            f"{points} in {self.record_path} ({why}); `{upload_command(self.record_path)}` sends them to the database"
        )

    def read_acks(self) -> None:
        endpoint = self.endpoint
        if endpoint is None or (endpoint.agent_uid is None and not self._inflight):
            return  # never connected, or gone with nothing awaiting an ack: no reply to read (a stray one waits)
        foreign = endpoint.foreign
        try:
            for data in endpoint.receive():
                reply = protocol.decode_reply(data)
                if type(reply) is protocol.Ack:
                    if reply.host:
                        self._host = reply.host  # the agent's host tag: recorded points must match its series
                    self._ack(reply.upto)
                elif type(reply) is protocol.FindingNote:
                    if self.on_finding is not None:
                        self.on_finding(reply.finding)
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
        while queue and queue[0].seqs[0] <= upto:
            seqs = queue[0].seqs
            self.acked += len(self._take(queue, len(seqs) if seqs[-1] <= upto else bisect_right(seqs, upto)).seqs)

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
    def _record(self, chunks: list[_Chunk]) -> None:
        points = [p for c in chunks for p in c.points()]
        if not points:
            return
        count = sum(len(p) if type(p) is protocol.StepRows else 1 for p in points)
        try:
            if self._recorder is None:
                from gpulse.channel.recording import Recorder  # only now: the happy path never needs the encoder

                self._recorder = Recorder(self.record_path)
            self.recorded += self._recorder.write(points, self._host)
        except Exception as exc:
            written, lost = getattr(exc, "written", 0), getattr(exc, "lost", count)  # PartialRecording
            self.recorded += written
            self.dropped += lost
            self.guard.report("record_write", exc, f"{self.record_path}: {lost} points not recorded")


#: The token file the upload advice names when the environment names none: the compose stack's.
DEFAULT_TOKEN_FILE = "secrets/influxdb-admin-token"


def upload_command(record_path: str) -> str:
    """The command that sends a recording to the database, with the token file it needs: the one
    ``GPULSE_TOKEN_FILE`` names where it is set, else the compose stack's."""
    import shlex

    token_file = os.environ.get("GPULSE_TOKEN_FILE") or DEFAULT_TOKEN_FILE
    return f"gpulse upload {shlex.quote(record_path)} --token-file {shlex.quote(token_file)}"
