"""The agent's training-channel receiver, driven over a real Unix datagram socket.

``FakeDelivery`` stands in for ``gpulse.delivery.pipeline.Delivery`` at its documented boundary only:
``submit(lines) -> ticket`` (cumulative lines) and ``durable_upto`` (the highest durable ticket),
so a test can hold durability back and watch acks wait for it.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.waiting import eventually

from gpulse.channel import protocol
from gpulse.channel import server as receiver_mod
from gpulse.channel.server import TrainingReceiver
from gpulse.lineprotocol.parse import parse_line

TAGS = {"run": "r1", "rank": "0", "local_rank": "0", "world_size": "1"}


class FakeDelivery:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.durable_upto = 0

    def submit(self, lines: list[str]) -> int:
        self.lines.extend(lines)
        return len(self.lines)


def step_msg(seq: int, step: int, **fields) -> protocol.Point:
    return protocol.Point("train_step", time.time_ns(), TAGS, {"step": step, "step_time_s": 0.1, **fields}, seq)


class Client:
    """A training process's end: bound to an abstract address so the agent can answer."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(protocol.client_address())
        self.sock.settimeout(3)

    def send(self, *messages: protocol.Message) -> None:
        data = [protocol.encode(m) for m in messages]
        self.sock.sendto(data[0] if len(data) == 1 else protocol.encode_batch(data), self.path)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendto(data, self.path)

    def recv(self, timeout: float = 3.0) -> dict | None:
        self.sock.settimeout(timeout)
        try:
            data, _ = self.sock.recvfrom(protocol.MAX_DATAGRAM)
        except TimeoutError:
            return None
        return json.loads(data)


def wait_for(cond, timeout: float = 3.0) -> bool:
    return eventually(cond, timeout, every=0.01)


@pytest.fixture
def delivery() -> FakeDelivery:
    return FakeDelivery()


@pytest.fixture
def rx(tmp_path: Path, delivery: FakeDelivery):
    r = TrainingReceiver(str(tmp_path / "run" / "agent.sock"), "node1", delivery.submit, status=lambda: {"gpus": 2})
    r.start()
    yield r
    r.close()


def test_valid_points_are_tagged_with_host_encoded_and_submitted(rx, delivery):
    c = Client(rx.path)
    c.send(step_msg(1, 0, log_loss=2.5), step_msg(2, 1, phase_dataprep_s=0.01))
    assert wait_for(lambda: len(delivery.lines) == 2)
    p0, p1 = (parse_line(line) for line in delivery.lines)
    assert p0.measurement == "train_step" and p0.tags == {**TAGS, "host": "node1"}
    assert p0.fields == {"step": 0, "step_time_s": 0.1, "log_loss": 2.5}
    assert p1.fields["phase_dataprep_s"] == 0.01
    assert rx.stats()["records_received"] == 2 and rx.stats()["records_rejected"] == 0


def test_acks_wait_until_the_delivery_says_the_lines_are_durable(rx, delivery):
    c = Client(rx.path)
    c.send(step_msg(1, 0), step_msg(2, 1))
    c.send(step_msg(3, 2))
    assert wait_for(lambda: len(delivery.lines) == 3)
    assert c.recv(timeout=0.4) is None, "acked before anything was durable"
    delivery.durable_upto = 2  # the first datagram's lines are written
    assert c.recv() == {"v": 1, "kind": "ack", "upto": 2, "host": "node1"}
    delivery.durable_upto = 3
    assert c.recv() == {"v": 1, "kind": "ack", "upto": 3, "host": "node1"}


def test_a_rejected_point_is_still_acknowledged_so_the_client_stops_resending_it(rx, delivery):
    c = Client(rx.path)
    bad = protocol.Point("train_step", time.time_ns(), {"run": "r1"}, {"step": 1}, seq=7)  # no rank tags
    c.send(bad)
    assert c.recv() == {"v": 1, "kind": "ack", "upto": 7, "host": "node1"}
    assert rx.stats()["rejected_by_cause"] == {"missing_tag": 1}
    assert delivery.lines == []


def test_malformed_input_is_counted_by_cause_logged_once_per_cause_and_never_stops_the_channel(rx, delivery, caplog):
    c = Client(rx.path)
    now = time.time_ns()
    with caplog.at_level(logging.WARNING, logger="gpulse.training_channel"):
        for _ in range(3):
            c.send_raw(b"\xff\xfe not utf-8")
            c.send_raw(b"{not json")
            c.send_raw(b'{"v":1,"kind":"point","seq":1,"m":"train_step","ts":1,"fields":{"x":NaN}}')
            c.send_raw(b"x" * (protocol.MAX_DATAGRAM + 10))
            c.send(protocol.Point("gpu", now, TAGS, {"util_gpu_pct": 5.0}, 1))
            c.send(protocol.Point("train_step", now, {**TAGS, "host": "evil"}, {"step": 1}, 1))
            c.send(protocol.Point("train_step", now, {**TAGS, "rank": "zero"}, {"step": 1}, 1))
            c.send(protocol.Point("train_step", now, {**TAGS, "x": "y" * 300}, {"step": 1}, 1))
            c.send(protocol.Point("train_step", now, {**TAGS, **{f"t{i}": "v" for i in range(9)}}, {"step": 1}, 1))
            c.send(protocol.Point("train_step", now - 40 * 86400 * 10**9, TAGS, {"step": 1}, 1))
            c.send(protocol.Point("train_step", now, TAGS, {"made_up": 1.0}, 1))
            c.send(protocol.Point("train_step", now, TAGS, {"step": "one"}, 1))
            c.send(protocol.Ack(3))
        c.send(step_msg(2, 5, made_up=1, config_text="x"))  # valid point; unknown fields dropped
        assert wait_for(lambda: len(delivery.lines) == 1)
    causes = rx.stats()["rejected_by_cause"]
    assert causes == {
        "not_utf8": 3,
        "bad_json": 3,
        "nonfinite": 3,
        "too_large": 3,
        "bad_measurement": 3,
        "reserved_tag": 3,
        "bad_tag_value": 6,
        "too_many_tags": 3,
        "ts_out_of_window": 3,
        "no_valid_fields": 6,
        "unexpected_kind": 3,
    }
    assert rx.stats()["values_dropped_by_cause"] == {"unknown_field": 5, "type_mismatch": 3}
    messages = [r.getMessage() for r in caplog.records]
    for cause in causes:
        assert sum(f"({cause}:" in m for m in messages) == 1, cause
    assert parse_line(delivery.lines[0]).fields == {"step": 5, "step_time_s": 0.1}


def test_socket_and_directory_admit_only_the_owner(rx):
    d = os.path.dirname(rx.path)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(rx.path).st_mode) == 0o600
    assert stat.S_ISSOCK(os.stat(rx.path).st_mode)
    if os.geteuid() == 0:  # CI runs as root: act as another user and be refused
        code = (
            "import os,socket,sys; os.setgid(65534); os.setuid(65534); s=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n"
            "try: s.sendto(b'{}', sys.argv[1])\nexcept PermissionError: sys.exit(7)\n"
        )
        assert subprocess.run([sys.executable, "-c", code, rx.path]).returncode == 7


def test_a_socket_group_makes_the_directory_0750_and_the_socket_0660_owned_by_that_group(tmp_path, delivery):
    group = grp.getgrgid(os.getegid()).gr_name
    r = TrainingReceiver(str(tmp_path / "g" / "agent.sock"), "n", delivery.submit, group=group).start()
    try:
        d = os.stat(tmp_path / "g")
        s = os.stat(r.path)
        assert (stat.S_IMODE(d.st_mode), stat.S_IMODE(s.st_mode)) == (0o750, 0o660)
        assert d.st_gid == s.st_gid == os.getegid()
    finally:
        r.close()


def test_it_refuses_a_directory_owned_by_another_user(tmp_path, delivery):
    if os.geteuid() == 0:
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 65534, 65534)
        path = str(other / "agent.sock")
    else:
        path = "/agent.sock"  # "/" belongs to root
    with pytest.raises(PermissionError, match="belongs to uid"):
        TrainingReceiver(path, "n", delivery.submit).start()


def test_a_stale_socket_is_replaced_but_a_live_agent_is_not(tmp_path, delivery):
    path = str(tmp_path / "s" / "agent.sock")
    os.makedirs(os.path.dirname(path), mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens
    r = TrainingReceiver(path, "n", delivery.submit).start()
    try:
        with pytest.raises(OSError, match="another gpulse agent is listening"):
            TrainingReceiver(path, "n", delivery.submit).start()
        Client(path).send(step_msg(1, 0))
        assert wait_for(lambda: len(delivery.lines) == 1)
    finally:
        r.close()
    assert not os.path.exists(path)
    Path(path).write_text("not a socket")
    with pytest.raises(FileExistsError):
        TrainingReceiver(path, "n", delivery.submit).start()


def test_registered_gpus_map_to_the_run_until_unregistered_or_the_process_dies(rx, monkeypatch):
    monkeypatch.setattr(receiver_mod, "LIVENESS_INTERVAL_S", 0.05)
    c = Client(rx.path)
    v0 = rx.runs_version
    c.send(protocol.Register("r1", "0", os.getpid(), ("GPU-a", "GPU-b"), seq=1))
    assert wait_for(lambda: rx.gpu_runs() == {"GPU-a": "r1", "GPU-b": "r1"})
    assert rx.runs_version > v0 and rx.stats()["runs_registered"] == 1
    c.send(protocol.Unregister("r1", "0", os.getpid(), seq=2))
    assert wait_for(lambda: rx.gpu_runs() == {})
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    c.send(protocol.Register("r2", "1", child.pid, ("GPU-c",), seq=3))
    assert wait_for(lambda: rx.gpu_runs() == {"GPU-c": "r2"})
    v1 = rx.runs_version
    child.kill()  # not reaped yet: a zombie counts as gone
    assert wait_for(lambda: rx.gpu_runs() == {})
    assert rx.runs_version > v1
    child.wait()


def test_a_status_request_is_answered_with_the_agent_snapshot(rx):
    c = Client(rx.path)
    c.send(protocol.StatusRequest())
    reply = c.recv()
    assert reply["kind"] == "status_reply"
    assert reply["status"]["gpus"] == 2
    # a question about the agent is not a training record (gpulse status once showed "1 received")
    assert reply["status"]["training_channel"]["records_received"] == 0
    assert reply["status"]["training_channel"]["records_rejected"] == 0


def test_after_a_failed_submit_that_client_gets_no_more_acks_and_the_channel_keeps_running(tmp_path):
    """Acks are cumulative: acking a later point would tell the client the lost one is durable."""
    calls = []

    def submit(lines):
        calls.append(lines)
        if len(calls) == 1:
            raise RuntimeError("queue closed")
        return len(calls)

    r = TrainingReceiver(str(tmp_path / "f" / "agent.sock"), "n", submit).start()
    try:
        c = Client(r.path)
        c.send(step_msg(1, 0))
        assert c.recv(timeout=0.4) is None
        c.send(step_msg(2, 1))
        assert wait_for(lambda: len(calls) == 2)
        assert c.recv(timeout=0.4) is None
        assert r.stats()["submit_errors"] == 1
        other = Client(r.path)
        other.send(step_msg(1, 0))
        assert other.recv() == {"v": 1, "kind": "ack", "upto": 1, "host": "n"}
    finally:
        r.close()


def test_processes_named_by_start_points_are_bounded_the_oldest_evicted_counted_and_logged_once(
    rx, monkeypatch, caplog
):
    """A node where more runs start than the agent keeps: MAX_STARTED + 1 start points keep MAX_STARTED processes."""
    monkeypatch.setattr(receiver_mod, "MAX_STARTED", 2)
    c = Client(rx.path)
    runs = ("r1", "r2", "r3", "r4")
    c.send(*(protocol.Point("train_run", time.time_ns(), {**TAGS, "run": run}, {"event": "start", "pid": os.getpid()}, seq) for seq, run in enumerate(runs, 1)))  # fmt: skip
    assert wait_for(lambda: rx.stats()["records_accepted"] == 4)
    assert rx.training_processes() == [("r3", "0", os.getpid()), ("r4", "0", os.getpid())]
    assert rx.stats()["processes_evicted"] == 2
    assert len([r for r in caplog.records if "is no longer sampled" in r.getMessage()]) == 1


def test_registrations_are_bounded_and_the_excess_is_rejected_and_acked(rx, monkeypatch):
    monkeypatch.setattr(receiver_mod, "MAX_REGISTRATIONS", 2)
    c = Client(rx.path)
    c.send(*(protocol.Register(run, "0", os.getpid(), (f"GPU-{run}",), seq) for seq, run in enumerate(("r1", "r2", "r3"), 1)))  # fmt: skip
    assert c.recv() == {"v": 1, "kind": "ack", "upto": 3, "host": "node1"}
    assert rx.gpu_runs() == {"GPU-r1": "r1", "GPU-r2": "r2"}
    assert rx.stats()["rejected_by_cause"] == {"too_many_registrations": 1}
    c.send(protocol.Register("r1", "0", os.getpid(), ("GPU-x",), 4))  # one already known may change
    assert wait_for(lambda: rx.gpu_runs() == {"GPU-x": "r1", "GPU-r2": "r2"})
