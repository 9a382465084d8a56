"""A client's end of the channel: a socket that talks only to a trusted agent and hears only from it.

Used by the training library's client and by ``gpulse status``. The socket is bound to a fresh
Linux abstract address (so the agent can reply without a file being created) and:

* before the first send, and again after the agent went away, the agent's socket is checked
  (:func:`gpulse.channel.trust.verify_socket`) and then ``connect()``-ed: from then on the kernel
  delivers to this socket only datagrams from that agent socket (``unix_may_send`` in
  ``net/unix/af_unix.c``: a connected datagram socket accepts only its peer), and a path replaced
  later cannot redirect the sends, which go to the socket connected to;
* every reply is authenticated by its sender's uid, which the kernel attaches with
  ``SCM_CREDENTIALS`` (``SO_PASSCRED`` set here; a sender cannot claim another uid without
  ``CAP_SETUID``): it must be the uid owning the agent's socket. This also covers the moments
  when the socket is not connected (after the agent went away), when anyone may send to it.

``SO_PEERCRED`` cannot do this on datagram sockets: Linux records peer credentials only when a
stream or seqpacket socket connects (and for ``socketpair``); on a connected datagram socket it
returns pid 0, uid -1, gid -1 (measured on Linux 6.x, ``agent/tests/channel/test_endpoint.py``).
"""

from __future__ import annotations

import errno
import select
import socket
import struct
import time
from collections.abc import Iterator

from gpulse.channel.protocol import MAX_DATAGRAM, client_address
from gpulse.channel.trust import verify_socket

_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
_CMSG_SPACE = socket.CMSG_SPACE(_UCRED.size)
#: Errors meaning the agent socket is gone (or replaced): check it again before the next send.
GONE = frozenset({errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOENT})


class AgentEndpoint:
    """The client socket; ``send`` checks and connects to ``path`` first, ``receive`` yields the agent's replies only."""

    def __init__(self, path: str, group: str | int | None = None) -> None:
        self.path = path
        self.group = group
        #: uid owning the connected agent socket; ``None`` while not connected
        self.agent_uid: int | None = None
        #: datagrams refused because they did not come from the agent's uid
        self.foreign = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(client_address())

    def connect(self) -> None:
        """Check the agent socket and connect to it.

        Raises :class:`~gpulse.channel.trust.UntrustedSocket`, ``FileNotFoundError`` (no socket),
        or the ``OSError`` of ``connect`` (``ConnectionRefusedError``: nobody listens;
        ``PermissionError``: no write permission on it)."""
        self.agent_uid = None
        owner = verify_socket(self.path, self.group)
        if owner is None:
            raise FileNotFoundError(errno.ENOENT, "no agent socket", self.path)
        self.sock.connect(self.path)
        self.agent_uid = owner

    def send(self, data: bytes, wait: float = 0.0) -> None:
        """Send one datagram (connecting first if needed); raises what :meth:`connect` and ``send`` raise.

        ``BlockingIOError``: the agent's queue is full, try later (or wait up to ``wait`` seconds for
        room; the training client never waits). An error in :data:`GONE` means the agent went away:
        the next send checks and connects again."""
        if self.agent_uid is None:
            self.connect()
        deadline = time.monotonic() + wait
        while True:
            try:
                self.sock.send(data, socket.MSG_DONTWAIT)
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                select.select([], [self.sock], [], left)  # writable once the connected agent's queue has room
            except OSError as exc:
                if exc.errno in GONE:
                    self.agent_uid = None
                raise

    def receive(self) -> Iterator[bytes]:
        """The datagrams waiting now that came from the agent's uid; the others are counted in ``foreign``."""
        while True:
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(MAX_DATAGRAM + 1024, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            if self.agent_uid is not None and sender_uid(ancillary) == self.agent_uid:
                yield data
            else:
                self.foreign += 1

    def wait_readable(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when a datagram arrives."""
        try:
            select.select([self.sock], [], [], max(timeout, 0.0))
        except (OSError, ValueError):
            time.sleep(max(timeout, 0.0))

    def close(self) -> None:
        self.sock.close()


def sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The sender's uid from ``SCM_CREDENTIALS`` ancillary data, ``None`` when there is none."""
    creds = _credentials(ancillary)
    return creds[1] if creds else None


def sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The sending process's id (in the receiver's PID namespace) from ``SCM_CREDENTIALS``, ``None`` when none."""
    creds = _credentials(ancillary)
    return creds[0] if creds else None


def _credentials(ancillary: list[tuple[int, int, bytes]]) -> tuple[int, int, int] | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            return _UCRED.unpack_from(data)  # type: ignore[return-value]
    return None


#: Room for the ``SCM_CREDENTIALS`` of one datagram, for ``recvmsg``.
CREDENTIALS_SPACE = _CMSG_SPACE
