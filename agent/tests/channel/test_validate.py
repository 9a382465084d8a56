"""The agent's one check of what arrives: typed messages out, causes that add up, memory that stays bounded."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

from gpulse.channel import protocol, validate
from gpulse.channel.validate import (
    DROP_CAUSES,
    MAX_RUNS,
    MAX_TAG_SETS_PER_RUN,
    REJECT_CAUSES,
    CheckedPoint,
    Rejected,
    Validator,
    unpack,
)

SRC = Path(validate.__file__).resolve().parents[1]
DOC = Path(__file__).resolve().parents[3] / "docs" / "channel.md"
TAGS = {"run": "r1", "rank": "0", "local_rank": "0", "world_size": "1"}
NOW = time.time_ns()


def wire(tags=TAGS, fields=None, seq=1, m="train_step") -> dict:
    return protocol.Point(m, NOW, tags, fields or {"step": 1}, seq).wire()


def string_args(path: Path, call: str) -> set[str]:
    """First arguments (string literals) of every call to a function or method named ``call``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == call:
                out.add(node.args[0].value)
    return out


def drop_causes_used(path: Path) -> set[str]:
    """``dropped["cause"]`` subscripts and the causes ``coerce`` returns."""
    out = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "attr", "") == "dropped":
            if isinstance(node.slice, ast.Constant):
                out.add(node.slice.value)
        if isinstance(node, ast.FunctionDef) and node.name == "coerce":
            returned = [t for r in ast.walk(node) if isinstance(r, ast.Return) for t in ast.walk(r)]
            for t in returned:  # (cause, value) tuples, also inside ``a if ok else b``
                if isinstance(t, ast.Tuple) and isinstance(t.elts[0], ast.Constant) and t.elts[0].value:
                    out.add(t.elts[0].value)
    return out


def test_every_reject_cause_is_documented_and_every_documented_one_is_raised() -> None:
    raised = (
        string_args(SRC / "channel" / "protocol.py", "Rejected")
        | string_args(SRC / "channel" / "validate.py", "Rejected")
        | string_args(SRC / "channel" / "server.py", "_reject")
    )
    assert raised == set(REJECT_CAUSES)


def test_every_drop_cause_is_documented_and_used() -> None:
    assert drop_causes_used(SRC / "channel" / "validate.py") == set(DROP_CAUSES)


def test_a_valid_point_comes_out_typed_with_its_series_tagged_with_the_agents_host() -> None:
    v = Validator("node1")
    p = v.message(wire(fields={"step": 3, "step_time_s": 0.25, "log_loss": 2.0}, seq=9), NOW)
    assert type(p) is CheckedPoint and p.seq == 9 and p.ts == NOW and p.run == "r1"
    assert p.fields == {"step": 3, "step_time_s": 0.25, "log_loss": 2.0}
    assert p.series.prefix == "train_step,host=node1,local_rank=0,rank=0,run=r1,world_size=1"
    reg = v.message(protocol.Register("r1", "0", 5, ("GPU-a",), seq=10).wire(), NOW)
    assert reg == protocol.Register("r1", "0", 5, ("GPU-a",), 10)
    assert v.message(protocol.StatusRequest().wire(), NOW) == protocol.StatusRequest()


def test_each_message_of_a_batch_is_checked_on_its_own_and_a_rejection_keeps_its_seq() -> None:
    v = Validator("n")
    data = json.dumps({"v": 1, "batch": [wire(seq=1), {**wire(seq=2), "v": 2}]}).encode()
    results = []
    for raw in unpack(data):
        try:
            results.append(type(v.message(raw, NOW)).__name__)
        except Rejected as e:
            results.append((e.cause, e.seq))
    assert results == ["CheckedPoint", ("bad_version", None)]
    with pytest.raises(Rejected) as e:
        v.message(wire(tags={"run": "r1"}, seq=7), NOW)
    assert (e.value.cause, e.value.seq) == ("missing_tag", 7)


def test_a_run_may_use_a_bounded_number_of_open_field_names_and_is_named_once_when_it_exceeds_them() -> None:
    v = Validator("n")
    limit = protocol.MAX_OPEN_FIELDS_PER_RUN
    kept = 0
    for start in range(0, limit + 128, 128):
        p = v.message(wire(fields={"step": 1, **{f"log_m{i}": 1.0 for i in range(start, start + 128)}}), NOW)
        kept += len(p.fields) - 1
    assert kept == limit
    assert v.dropped["too_many_open_fields"] == 128 and v.over_budget == ["r1"]
    # names the run already has keep working; another run has its own budget
    assert v.message(wire(fields={"log_m5": 2.0}), NOW).fields == {"log_m5": 2.0}
    assert v.message(wire(tags={**TAGS, "run": "r2"}, fields={"log_new": 1.0}), NOW).fields == {"log_new": 1.0}
    assert v.over_budget == ["r1"]  # once per run


def test_open_fields_of_one_run_are_escaped_once_for_all_its_ranks() -> None:
    v = Validator("n")
    a = v.message(wire(fields={"log_x": 1.0}), NOW)
    b = v.message(wire(tags={**TAGS, "rank": "1", "local_rank": "1"}), NOW)
    assert a.series is not b.series and a.series.specs is b.series.specs


def test_what_the_validator_remembers_is_bounded_whatever_arrives() -> None:
    v = Validator("n")
    for i in range(3 * MAX_RUNS):
        for rank in range(2 * MAX_TAG_SETS_PER_RUN if i == 0 else 1):
            v.message(wire(tags={**TAGS, "run": f"run-{i}", "rank": str(rank)}, fields={f"log_{i}": 1.0}), NOW)
    runs = v._runs
    assert len(runs) == MAX_RUNS
    assert all(len(state.tag_sets) <= MAX_TAG_SETS_PER_RUN for state in runs.values())


def test_a_tag_value_that_only_equals_a_remembered_one_is_still_checked() -> None:
    """``1 == 1.0 == True`` in Python: a remembered ``rank="1"`` set must not let ``rank=True`` through."""
    v = Validator("n")
    v.message(wire(tags={**TAGS, "rank": 1}), NOW)  # an int rank is accepted (as "1")
    with pytest.raises(Rejected, match="bad_tag_value"):
        v.message(wire(tags={**TAGS, "rank": True}), NOW)
    with pytest.raises(Rejected, match="bad_tag_value"):
        v.message(wire(tags={**TAGS, "rank": 1.0}), NOW)
