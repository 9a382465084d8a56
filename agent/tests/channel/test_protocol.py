"""The wire format both ends share: typed messages, datagrams under the limit, replies a client accepts."""

from __future__ import annotations

import json
import random

import pytest

from gpulse.channel import protocol
from gpulse.channel.validate import CheckedPoint, Rejected, Validator, unpack


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


# -- step points: rows of numbers ------------------------------------------------------------------
TAGS = {"run": "r%d", "rank": "0", "local_rank": "0", "world_size": "1", "model": "qwen 7b"}
STEP_SHAPE = protocol.FieldShape(
    ("step", "start_time_ns", "step_time_s", "samples_per_s", "log_verlust_é"),
    protocol.KIND_INT + protocol.KIND_INT + protocol.KIND_NS + protocol.KIND_FLOAT + protocol.KIND_FLOAT,
)
TS = 1_700_000_000_123_456_789


def step_rows(*ns: int) -> protocol.StepRows:
    head = protocol.PointHead("train_step", TAGS)
    return protocol.StepRows(head, STEP_SHAPE, [(7 + i, 1_699_999_999_000_000_000, d, 32 / 0.3, -0.5, TS + i) for i, d in enumerate(ns)])  # fmt: skip


def test_step_rows_reach_the_agent_as_the_points_they_stand_for_each_duration_exactly_ns_over_1e9() -> None:
    """A row's duration goes out as its integer nanoseconds; the agent reads the very float ``ns / 1e9``
    that JSON makes of ``<ns>e-9`` (both are the double nearest to the same decimal)."""
    rng = random.Random(0)
    ns = [0, 1, 999, 999_999_999, 10**9, 86_400 * 10**9, 2**53 - 1, *(rng.randrange(2**53) for _ in range(3000))]
    rows = step_rows(*ns)
    per = protocol.rows_per_datagram(rows.head, rows.shape)
    received = []
    for start in range(0, len(ns), per):
        data = protocol.encode_rows(rows[start : start + per], 3 + start)
        assert len(data) <= protocol.rows_size(rows[start : start + per]) <= protocol.MAX_DATAGRAM
        received += unpack(data)
    assert len(received) == len(ns)
    for i, (msg, d) in enumerate(zip(received, ns, strict=True)):
        assert msg == {
            "v": 1, "kind": "point", "seq": 3 + i, "m": "train_step", "ts": TS + i, "tags": TAGS,
            "fields": {"step": 7 + i, "start_time_ns": 1_699_999_999_000_000_000, "step_time_s": json.loads(f"{d}e-9"),
                       "samples_per_s": 32 / 0.3, "log_verlust_é": -0.5},
        }  # fmt: skip
        assert type(msg["fields"]["step_time_s"]) is float and msg["fields"]["step_time_s"] == d / 1e9
    assert [p.wire() for p in rows.points(range(3, 3 + len(ns)))] == received  # what the client reads of its rows


def test_the_agent_takes_step_rows_as_it_takes_any_point() -> None:
    shape = protocol.FieldShape(("step", "step_time_s", "forward_s", "log_loss"), "innf")
    rows = protocol.StepRows(protocol.PointHead("train_step", TAGS), shape, [(7, 1_213_457, 999, 0.25, TS)])
    checked = Validator("node1").message(unpack(protocol.encode_rows(rows, 3))[0], now_ns=TS)
    assert isinstance(checked, CheckedPoint)
    assert checked.fields == rows.points()[0].fields and checked.ts == TS and checked.seq == 3


@pytest.mark.parametrize(
    ("header", "body", "cause"),
    [
        (
            b'{"v":1,"kind":"rows","seq":1,"m":"train_step","tags":{},"names":["step"],"kinds":"i"}',
            b"\0" * 15,
            "bad_rows",
        ),
        (b'{"v":1,"kind":"rows","seq":1,"m":"train_step","tags":{},"names":["step"],"kinds":"i"}', b"", "bad_rows"),
        (
            b'{"v":1,"kind":"rows","seq":1,"m":"train_step","tags":{},"names":["step"],"kinds":"x"}',
            b"\0" * 16,
            "bad_rows",
        ),
        (
            b'{"v":1,"kind":"rows","seq":1,"m":"train_step","tags":{},"names":["a","a"],"kinds":"ii"}',
            b"\0" * 24,
            "bad_rows",
        ),
        (
            b'{"v":1,"kind":"rows","seq":1,"m":"train_step","tags":{},"names":["step"],"kinds":"if"}',
            b"\0" * 24,
            "bad_rows",
        ),
        (
            b'{"v":1,"kind":"rows","seq":-1,"m":"train_step","tags":{},"names":["step"],"kinds":"i"}',
            b"\0" * 16,
            "bad_seq",
        ),
        (
            b'{"v":2,"kind":"rows","seq":1,"m":"train_step","tags":{},"names":["step"],"kinds":"i"}',
            b"\0" * 16,
            "bad_version",
        ),
        (b'{"v":1,"kind":"point","seq":1}', b"\0" * 16, "bad_kind"),
        (b"[1]", b"\0" * 16, "not_object"),
        (b"{not json", b"\0" * 16, "bad_json"),
    ],
)
def test_a_rows_datagram_that_does_not_fit_its_header_is_rejected_whole(header: bytes, body: bytes, cause: str) -> None:
    with pytest.raises(Rejected) as exc:
        unpack(protocol.ROWS_PREFIX + header + b"\n" + body)
    assert exc.value.cause == cause
    with pytest.raises(Rejected, match="bad_rows"):
        unpack(protocol.ROWS_PREFIX + header)  # no newline: no header end


def test_a_nonfinite_value_in_a_row_is_dropped_by_the_agent_and_the_rest_of_the_point_kept() -> None:
    shape = protocol.FieldShape(("step", "log_loss"), "if")
    rows = protocol.StepRows(protocol.PointHead("train_step", TAGS), shape, [(7, float("nan"), TS)])
    validator = Validator("node1")
    checked = validator.message(unpack(protocol.encode_rows(rows, 3))[0], now_ns=TS)
    assert isinstance(checked, CheckedPoint) and checked.fields == {"step": 7}
    assert validator.dropped["nonfinite"] == 1


def test_a_shape_whose_kinds_do_not_describe_its_names_is_refused() -> None:
    with pytest.raises(ValueError, match="do not describe"):
        protocol.FieldShape(("step", "step_time_s"), protocol.KIND_INT)
    with pytest.raises(ValueError, match="do not describe"):
        protocol.FieldShape(("step",), "x")


def test_a_rows_datagram_never_outgrows_its_size_bound() -> None:
    rows = protocol.StepRows(protocol.PointHead("train_step", TAGS), STEP_SHAPE, [(-(2**63),) * 3 + (-1e308,) * 2 + (-(2**63),)] * 40)  # fmt: skip
    assert len(protocol.encode_rows(rows, 2**63 - 1)) <= protocol.rows_size(rows)
