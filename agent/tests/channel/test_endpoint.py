"""A client's socket hears only its agent: the connected peer, and only datagrams from the agent's uid."""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpulse.channel.endpoint import AgentEndpoint
from gpulse.channel.trust import UntrustedSocket

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sends as another user: needs root")


def agent_socket(tmp_path: Path) -> tuple[socket.socket, str]:
    (tmp_path / "run").mkdir(mode=0o700)
    path = str(tmp_path / "run" / "agent.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    return s, path


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


def test_replies_of_the_agent_are_received_and_nobody_else_can_send_while_connected(tmp_path: Path) -> None:
    agent, path = agent_socket(tmp_path)
    ep = AgentEndpoint(path)
    try:
        ep.send(b"hello")
        data, client = agent.recvfrom(100)
        assert data == b"hello" and ep.agent_uid == os.geteuid()
        agent.sendto(b"ack", client)
        ep.wait_readable(2)
        assert list(ep.receive()) == [b"ack"]
        assert send_as_nobody(client, b"forged") == errno.EPERM  # a connected datagram socket takes only its peer
    finally:
        ep.close()
        agent.close()


def test_after_the_agent_went_away_datagrams_of_another_uid_are_refused(tmp_path: Path) -> None:
    agent, path = agent_socket(tmp_path)
    ep = AgentEndpoint(path)
    try:
        ep.send(b"hello")
        _, client = agent.recvfrom(100)
        agent.close()
        os.unlink(path)
        with pytest.raises(ConnectionRefusedError):
            ep.send(b"again")  # the peer is gone: the socket is no longer connected...
        assert ep.agent_uid is None
        assert send_as_nobody(client, b'{"v":1,"kind":"ack","upto":99}') == 0  # ...so anyone may send to it
        ep.wait_readable(2)
        assert list(ep.receive()) == [] and ep.foreign == 1  # but a datagram of another uid is not taken
        with pytest.raises(FileNotFoundError):
            ep.send(b"and again")  # checked again before it connects again: there is no agent
    finally:
        ep.close()


def test_an_untrusted_socket_is_never_connected(tmp_path: Path) -> None:
    agent, path = agent_socket(tmp_path)
    os.chown(tmp_path / "run", NOBODY, NOBODY)
    ep = AgentEndpoint(path)
    try:
        with pytest.raises(UntrustedSocket):
            ep.send(b"secret")
        agent.settimeout(0.2)
        with pytest.raises(TimeoutError):
            agent.recv(100)
    finally:
        ep.close()
        agent.close()


def test_so_peercred_says_nothing_about_a_datagram_peer(tmp_path: Path) -> None:
    """Why replies are checked with SCM_CREDENTIALS: Linux fills SO_PEERCRED only for stream sockets."""
    agent, path = agent_socket(tmp_path)
    ep = AgentEndpoint(path)
    try:
        ep.connect()
        pid, uid, gid = struct.unpack("iii", ep.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        assert (pid, uid, gid) == (0, -1, -1)
    finally:
        ep.close()
        agent.close()
