"""A client's socket hears only its agent: the connected peer, and only datagrams from the agent's uid."""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulse.channel.endpoint import AgentEndpoint
from gpulse.channel.trust import UntrustedSocket

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sends as another user: needs root")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound agent socket in a directory of this user, and its path."""
    (tmp_path / "run").mkdir(mode=0o700)
    path = str(tmp_path / "run" / "agent.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    yield s, path
    s.close()


@pytest.fixture
def endpoint(agent: tuple[socket.socket, str]) -> Iterator[AgentEndpoint]:
    ep = AgentEndpoint(agent[1])
    yield ep
    ep.close()


def send_as_nobody(address: bytes | str, data: bytes) -> int:
    """Send one datagram from a process of uid 65534; 0, or the errno it got."""
    code = (
        "import os, socket, sys; os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "try:\n    s.sendto(bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[1]).decode())\nexcept OSError as e:\n"
        "    sys.exit(e.errno)\n"
    )
    addr = address.encode() if isinstance(address, str) else address
    return subprocess.run([sys.executable, "-c", code, addr.hex(), data.hex()]).returncode


def test_replies_of_the_agent_are_received_and_nobody_else_can_send_while_connected(agent, endpoint) -> None:
    sock, _ = agent
    endpoint.send(b"hello")
    data, client = sock.recvfrom(100)
    assert data == b"hello" and endpoint.agent_uid == os.geteuid()
    sock.sendto(b"ack", client)
    endpoint.wait_readable(2)
    assert list(endpoint.receive()) == [b"ack"]
    assert send_as_nobody(client, b"forged") == errno.EPERM  # a connected datagram socket takes only its peer


def test_after_the_agent_went_away_datagrams_of_another_uid_are_refused(agent, endpoint) -> None:
    sock, path = agent
    endpoint.send(b"hello")
    _, client = sock.recvfrom(100)
    sock.close()
    os.unlink(path)
    with pytest.raises(ConnectionRefusedError):
        endpoint.send(b"again")  # the peer is gone: the socket is no longer connected...
    assert endpoint.agent_uid is None
    assert send_as_nobody(client, b'{"v":1,"kind":"ack","upto":99}') == 0  # ...so anyone may send to it
    endpoint.wait_readable(2)
    assert list(endpoint.receive()) == [] and endpoint.foreign == 1  # but a datagram of another uid is not taken
    with pytest.raises(FileNotFoundError):
        endpoint.send(b"and again")  # checked again before it connects again: there is no agent


def test_an_untrusted_socket_is_never_connected(agent, endpoint, tmp_path: Path) -> None:
    sock, _ = agent
    os.chown(tmp_path / "run", NOBODY, NOBODY)
    with pytest.raises(UntrustedSocket):
        endpoint.send(b"secret")
    sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        sock.recv(100)


def test_so_peercred_says_nothing_about_a_datagram_peer(endpoint) -> None:
    """Why replies are checked with SCM_CREDENTIALS: Linux fills SO_PEERCRED only for stream sockets."""
    endpoint.connect()
    pid, uid, gid = struct.unpack("iii", endpoint.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    assert (pid, uid, gid) == (0, -1, -1)
