"""The suite's real influxd: its ports cannot be taken from under it between choosing and binding.

CI at stop 24 lost a run to ``listen tcp 127.0.0.1:35371: bind: address already in use``: the port
came from ``bind(0)``, in the range the kernel also gives outgoing connections.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.influxd import InfluxDB1, PortTaken, _ephemeral_low, free_port

pytestmark = pytest.mark.influxdb


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_given_twice() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 <= p < _ephemeral_low() for p in ports)
    for p in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", p)) != 0, f"something listens on {p}"


def _occupy(port: int) -> socket.socket:
    """A listener on ``port``; ``SO_REUSEADDR`` so that the stopped influxd's closed connections in
    TIME_WAIT on it do not refuse our bind (as they do not refuse influxd's: Go sets it too)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_first_start_whose_port_was_taken_starts_on_other_ports(tmp_path: Path) -> None:
    server = InfluxDB1(tmp_path)
    taken = server.port
    with _occupy(taken):
        server.start()
        try:
            assert server.port != taken
            assert server.url == f"http://127.0.0.1:{server.port}"
            server.create_database("harness")
            server.write("m v=1i 1", db="harness")
            assert server.count("m", "v", db="harness") == 1
        finally:
            server.stop()
    log = server.log_path.read_text()
    assert f"127.0.0.1:{taken}: bind: address already in use" in log


def test_a_restart_keeps_its_url_and_says_so_when_the_port_was_taken(tmp_path: Path) -> None:
    server = InfluxDB1(tmp_path).start()
    url = server.url
    server.stop()
    with _occupy(server.port), pytest.raises(PortTaken, match="could not bind"):
        server.start()
    assert server.url == url
    server.start()
    try:
        assert server.url == url and server.query("SHOW DATABASES")["results"]
    finally:
        server.stop()
