"""The wire format both ends share: typed messages, datagrams under the limit, replies a client accepts."""

from __future__ import annotations

import json

import pytest

from gpulse.channel import protocol
from gpulse.channel.validate import unpack


def test_messages_go_on_the_wire_as_the_channel_document_says() -> None:
    point = protocol.Point("train_step", 7, {"run": "r", "rank": "0"}, {"step": 1, "loss": 0.5}, seq=3)
    assert json.loads(protocol.encode(point)) == {
        "v": 1, "kind": "point", "seq": 3, "m": "train_step", "ts": 7,
        "tags": {"run": "r", "rank": "0"}, "fields": {"step": 1, "loss": 0.5},
    }  # fmt: skip
    assert json.loads(protocol.encode(protocol.Register("r", "0", 42, ("GPU-a",), seq=4))) == {
        "v": 1, "kind": "register", "seq": 4, "run": "r", "rank": "0", "pid": 42, "uuids": ["GPU-a"],
    }  # fmt: skip
    assert json.loads(protocol.encode(protocol.Unregister("r", "0", 42, seq=5)))["kind"] == "unregister"
    assert json.loads(protocol.encode(protocol.StatusRequest())) == {"v": 1, "kind": "status"}
    assert json.loads(protocol.encode(protocol.Ack(9, "node1"))) == {"v": 1, "kind": "ack", "upto": 9, "host": "node1"}


def test_a_nonfinite_value_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        protocol.encode(protocol.Point("train_step", 1, {}, {"loss": float("nan")}, seq=1))


def test_datagrams_are_packed_in_order_under_the_size_limit() -> None:
    msgs = [
        protocol.encode(protocol.Point("train_step", i, {"run": "r"}, {"step": i, "x": "y" * 900}, seq=i))
        for i in range(200)
    ]
    datagrams, i = [], 0
    while i < len(msgs):
        n, data = protocol.datagram(msgs[i:])
        datagrams.append(data)
        i += n
    assert len(datagrams) > 1 and all(len(d) <= protocol.MAX_DATAGRAM for d in datagrams)
    assert max(len(d) for d in datagrams) > protocol.MAX_DATAGRAM - 1000  # full, not one message each
    assert [m["seq"] for d in datagrams for m in unpack(d)] == list(range(200))


def test_a_message_larger_than_a_datagram_still_goes_alone() -> None:
    big = b"x" * (protocol.MAX_DATAGRAM * 2)
    assert protocol.datagram([big, b"{}"]) == (1, big)
    assert protocol.datagram([b"{}"]) == (1, b"{}")  # one message is sent as itself, not as a batch


def test_a_client_accepts_only_well_formed_replies() -> None:
    assert protocol.decode_reply(b'{"v":1,"kind":"ack","upto":5,"host":"n1"}') == protocol.Ack(5, "n1")
    assert protocol.decode_reply(b'{"v":1,"kind":"ack","upto":5,"host":""}') == protocol.Ack(5, None)
    assert protocol.decode_reply(b'{"v":1,"kind":"status_reply","status":{"gpus":2}}') == protocol.StatusReply(
        {"gpus": 2}
    )
    for junk in (
        b"not json",
        b"[1]",
        b'{"v":2,"kind":"ack","upto":5}',
        b'{"v":true,"kind":"ack","upto":5}',
        b'{"v":1,"kind":"ack","upto":-1}',
        b'{"v":1,"kind":"ack","upto":"5"}',
        b'{"v":1,"kind":"status_reply","status":[]}',
        b'{"v":1,"kind":"point"}',
    ):
        assert protocol.decode_reply(junk) is None, junk


def test_the_default_socket_is_per_user() -> None:
    assert protocol.default_socket_path({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/gpulse/agent.sock"
    assert protocol.default_socket_path({}).startswith("/tmp/gpulse-")
    assert protocol.client_socket_path({"GPULSE_SOCKET": "/x/a.sock"}) == "/x/a.sock"
