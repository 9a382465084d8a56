"""Fuzzing the channel's decoder and validator: arbitrary input never raises, and every message counts.

The receiver is driven through ``handle_datagram`` (what its socket thread calls for each
datagram); ``submit`` is a list, standing in for the delivery queue.
"""

from __future__ import annotations

import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulse.channel import protocol
from gpulse.channel.server import TrainingReceiver
from gpulse.channel.validate import check_line_point
from gpulse.lineprotocol.parse import parse_line

json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["point", "register", "train_step", "train_run", "status", "run", "rank", "GPU-1"]),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.sampled_from(["v", "kind", "seq", "m", "ts", "tags", "fields", "run", "rank", "pid", "uuids", "batch"])
            | st.text(max_size=8),
            children,
            max_size=8,
        )
    ),
    max_leaves=30,
)


def _valid_point() -> dict:
    tags = {"run": "r", "rank": "0", "local_rank": "0", "world_size": "1"}
    return protocol.Point("train_step", time.time_ns(), tags, {"step": 1, "step_time_s": 0.5}, seq=1).wire()


def mutated_messages():
    """Valid messages with one part replaced by anything: reaches the deep checks, not just the JSON parser."""
    keys = st.sampled_from(["v", "kind", "seq", "m", "ts", "tags", "fields"])
    inner = st.sampled_from(["tags", "fields"])
    return st.one_of(
        st.tuples(keys, json_like).map(lambda kv: {**_valid_point(), kv[0]: kv[1]}),
        st.tuples(inner, st.text(max_size=70), json_like).map(
            lambda t: {**_valid_point(), t[0]: {**_valid_point()[t[0]], t[1]: t[2]}}
        ),
        st.tuples(st.sampled_from(["run", "rank", "pid", "uuids"]), json_like).map(
            lambda kv: {**protocol.Register("r", "0", 1, ("GPU-1",), seq=2).wire(), kv[0]: kv[1]}
        ),
    )


def new_receiver() -> tuple[TrainingReceiver, list[str]]:
    lines: list[str] = []

    def submit(batch: list[str]) -> int:
        lines.extend(batch)
        return len(lines)

    return TrainingReceiver("/nonexistent/agent.sock", "h", submit), lines


def _check_counts(rx: TrainingReceiver, lines: list[str]) -> None:
    s = rx.stats()
    assert s["records_received"] == s["records_accepted"] + s["records_rejected"]
    assert s["records_rejected"] == sum(s["rejected_by_cause"].values())
    for line in lines:  # whatever got through is valid line protocol that fits the schema
        p = parse_line(line)
        assert check_line_point(p) is None, line


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_and_every_datagram_is_counted(data):
    rx, lines = new_receiver()
    rx.handle_datagram(data, None)
    _check_counts(rx, lines)
    assert rx.stats()["records_received"] >= 1


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objs=st.lists(st.one_of(json_like, mutated_messages()), min_size=1, max_size=4), as_batch=st.booleans())
def test_arbitrary_json_structures_never_raise_and_rejections_add_up(objs, as_batch):
    rx, lines = new_receiver()
    try:
        encoded = [json.dumps(o).encode() for o in objs]
    except (ValueError, OverflowError):
        return
    if as_batch:
        rx.handle_datagram(b'{"v":1,"batch":[' + b",".join(encoded) + b"]}", None)
    else:
        for data in encoded:
            rx.handle_datagram(data, None)
    _check_counts(rx, lines)
