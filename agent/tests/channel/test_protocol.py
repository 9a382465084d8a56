"""The wire format both ends share: typed messages, datagrams under the limit, replies a client accepts."""

from __future__ import annotations

import json
import random

import pytest

from gpulse.channel import protocol
from gpulse.channel.validate import CheckedPoint, Validator, unpack


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


# -- step points: numbers from a template ----------------------------------------------------------
TAGS = {"run": "r%d", "rank": "0", "local_rank": "0", "world_size": "1", "model": "qwen 7b"}
STEP_SHAPE = protocol.FieldShape(
    ("step", "start_time_ns", "step_time_s", "samples_per_s", "log_verlust_é"),
    protocol.KIND_INT + protocol.KIND_INT + protocol.KIND_NS + protocol.KIND_FLOAT + protocol.KIND_FLOAT,
)


def step_point(ns: int, seq: int = 3) -> protocol.NumericPoint:
    head = protocol.PointHead("train_step", TAGS)
    return protocol.NumericPoint(head, 1_700_000_000_123_456_789, STEP_SHAPE, (7, 1_699_999_999_000_000_000, ns, 32 / 0.3, -0.5), seq)  # fmt: skip


def test_a_step_point_is_the_json_of_its_fields_with_each_duration_exactly_ns_over_1e9() -> None:
    """Durations go out as ``<ns>e-9``: whatever the nanoseconds, JSON reads back the very float
    ``ns / 1e9`` (both are the double nearest to the same decimal)."""
    rng = random.Random(0)
    for ns in [0, 1, 999, 999_999_999, 10**9, 86_400 * 10**9, 2**53 - 1, *(rng.randrange(2**53) for _ in range(3000))]:
        point = step_point(ns)
        sent = json.loads(protocol.encode(point))
        assert sent == json.loads(json.dumps(point.wire()))  # the generic encoding of the same point
        assert sent["fields"]["step_time_s"] == ns / 1e9 and type(sent["fields"]["step_time_s"]) is float
    assert sent == {
        "v": 1, "kind": "point", "seq": 3, "m": "train_step", "ts": 1_700_000_000_123_456_789, "tags": TAGS,
        "fields": {"step": 7, "start_time_ns": 1_699_999_999_000_000_000, "step_time_s": ns / 1e9,
                   "samples_per_s": 32 / 0.3, "log_verlust_é": -0.5},
    }  # fmt: skip
    assert point.fields == sent["fields"] and dict(point) == sent["fields"] and point["step"] == 7


def test_the_agent_takes_a_step_point_as_it_takes_any_point() -> None:
    shape = protocol.FieldShape(("step", "step_time_s", "forward_s", "log_loss"), "innf")
    point = protocol.NumericPoint(protocol.PointHead("train_step", TAGS), 1_700_000_000_000_000_000, shape, (7, 1_213_457, 999, 0.25), 3)  # fmt: skip
    checked = Validator("node1").message(unpack(protocol.encode(point))[0], now_ns=point.ts)
    assert isinstance(checked, CheckedPoint)
    assert checked.fields == point.fields and checked.ts == point.ts and checked.seq == 3


def test_a_shape_whose_kinds_do_not_describe_its_names_is_refused() -> None:
    with pytest.raises(ValueError, match="do not describe"):
        protocol.FieldShape(("step", "step_time_s"), protocol.KIND_INT)
    with pytest.raises(ValueError, match="do not describe"):
        protocol.FieldShape(("step",), "x")


def test_what_a_client_sent_reads_back_as_the_point_it_was() -> None:
    point = step_point(5_000)
    back = protocol.decode_point(protocol.encode(point))
    assert back == protocol.Point("train_step", point.ts, TAGS, point.fields, seq=3)
    assert protocol.decode_point(protocol.encode(protocol.Register("r", "0", 1, ("GPU-a",), seq=4))) is None


def test_a_step_point_never_outgrows_its_size_bound() -> None:
    longest = protocol.NumericPoint(
        protocol.PointHead("train_step", TAGS), -(2**63), STEP_SHAPE,
        (-(2**63), -(2**63), -(2**63), -2.2250738585072014e-308, -1.7976931348623157e308), seq=2**63 - 1,
    )  # fmt: skip
    assert len(protocol.encode(longest)) <= protocol.size_bound(longest)
