"""The line-protocol encoder: typing by the schema, coercion, what is dropped and counted, escaping."""

from __future__ import annotations

import math

import pytest
from support.stored_text import stored_key

from gpulse.lineprotocol.encode import Encoder, escape_key, escape_measurement, escape_string
from gpulse.lineprotocol.parse import parse_line

TAGS = {"host": "node1", "gpu": "0", "uuid": "GPU-1", "model": "H100"}


def fields_of(line: str) -> str:
    return line.split(" ")[1]


def test_a_line_has_sorted_tags_typed_fields_and_an_ns_timestamp():
    enc = Encoder()
    line = enc.encode(
        "gpu",
        {"uuid": "GPU-1", "host": "node1", "model": "H100", "gpu": "0"},
        {"util_gpu_pct": 97, "mem_used_bytes": 1024, "pstate": 2},
        1_700_000_000_123_456_789,
    )
    assert (
        line
        == "gpu,gpu=0,host=node1,model=H100,uuid=GPU-1 util_gpu_pct=97.0,mem_used_bytes=1024i,pstate=2i 1700000000123456789\n"
    )


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("mem_used_bytes", 3.9, "mem_used_bytes=3i"),  # int field given a float: truncated, still an integer
        ("mem_used_bytes", True, "mem_used_bytes=1i"),
        ("mem_used_bytes", "42", "mem_used_bytes=42i"),
        ("util_gpu_pct", 7, "util_gpu_pct=7.0"),  # float field given an int: stays a float, never 7i
        ("util_gpu_pct", "1e-5", "util_gpu_pct=1e-05"),
        ("mem_used_bytes", 2**63 - 1, f"mem_used_bytes={2**63 - 1}i"),
    ],
)
def test_values_are_coerced_to_the_declared_type_so_a_field_never_changes_type(field, value, text):
    assert fields_of(Encoder().encode("gpu", TAGS, {field: value}, 1)) == text


def test_integers_never_use_the_unsigned_suffix():
    line = Encoder().encode("gpu", TAGS, {"energy_mj": 2**40, "mem_total_bytes": 80 << 30, "pstate": 0}, 1)
    values = dict(kv.split("=") for kv in fields_of(line).split(","))
    assert values == {"energy_mj": f"{2**40}i", "mem_total_bytes": f"{80 << 30}i", "pstate": "0i"}


def test_nan_and_inf_are_dropped_and_counted_and_an_empty_point_is_not_written():
    enc = Encoder()
    line = enc.encode("gpu", TAGS, {"util_gpu_pct": math.nan, "power_w": math.inf, "temp_gpu_c": 50.5}, 1)
    assert fields_of(line) == "temp_gpu_c=50.5"
    assert enc.encode("gpu", TAGS, {"util_gpu_pct": -math.inf, "mem_used_bytes": math.nan}, 1) is None
    assert enc.stats() == {
        "values_dropped_nonfinite": 4,
        "fields_dropped_unknown": 0,
        "values_dropped_bad": 0,
        "points_empty": 1,
    }


def test_unknown_fields_and_uncoercible_values_are_dropped_and_counted():
    enc = Encoder()
    line = enc.encode(
        "gpu", TAGS, {"no_such_field": 1, "mem_used_bytes": "lots", "util_gpu_pct": 1.5, "fan_pct": None}, 1
    )
    assert fields_of(line) == "util_gpu_pct=1.5"
    assert enc.unknown_fields_dropped == 1 and enc.bad_values_dropped == 1
    assert enc.encode("gpu", TAGS, {"mem_used_bytes": 2**64}, 1) is None  # out of int64 range
    assert enc.bad_values_dropped == 2


def test_open_fields_follow_the_schema_pattern_as_floats():
    enc = Encoder()
    tags = {"run": "r1", "rank": "0", "local_rank": "0", "world_size": "1", "host": "h"}
    line = enc.encode("train_step", tags, {"step": 3, "log_loss": 2, "phase_fwd_s": 0.5, "log bad": 1}, 1)
    assert fields_of(line) == "step=3i,log_loss=2.0,phase_fwd_s=0.5"
    assert enc.unknown_fields_dropped == 1


def test_strings_are_quoted_and_escaped_and_booleans_spelled_out():
    enc = Encoder(strict=False)
    line = enc.encode("x", {}, {"s": 'say "hi"\\', "b": True, "c": False}, 5)
    assert line == 'x s="say \\"hi\\"\\\\",b=true,c=false 5\n'


def test_newlines_never_reach_the_output():
    enc = Encoder(strict=False)
    line = enc.encode("m\nx", {"t\r\n": "a\nb"}, {"s": "line1\nline2\r\n"}, 1)
    assert line.count("\n") == 1 and line.endswith("\n") and "\r" not in line
    assert line == 'm\\ x,t\\ =a\\ b s="line1 line2 " 1\n'


def test_empty_tag_values_are_omitted_and_specials_escaped():
    enc = Encoder(strict=False)
    line = enc.encode("my meas,x", {"empty": "", "k=1": "a,b c"}, {"f v": 1.0}, 1)
    assert line == "my\\ meas\\,x,k\\=1=a\\,b\\ c f\\ v=1.0 1\n"


@pytest.mark.parametrize(
    ("value", "stored"),
    [("a\\b", "a\\b"), ("a\\", "a/"), ("a\\ b", "a/ b"), ("a\\,b", "a/,b"), ("a\\=b", "a/=b"), ('a\\"b', 'a\\"b')],
)
def test_backslashes_influxdb_cannot_store_become_slashes(value, stored):
    assert stored_key(value) == stored  # the rule as tests state it
    assert escape_key(value).replace("\\,", ",").replace("\\=", "=").replace("\\ ", " ") == stored
    assert parse_line(Encoder(strict=False).encode("m", {"t": value}, {"f": 1}, 1)).tags == {"t": stored}


def test_lone_surrogates_become_replacement_characters_instead_of_crashing_the_sink():
    enc = Encoder(strict=False)
    line = enc.encode("m", {"t": "a\ud800"}, {"s": "b\udfff"}, 1)
    assert line == 'm,t=a\ufffd s="b\ufffd" 1\n'
    line.encode("utf-8")
    assert escape_string("\ud83d") == "\ufffd" and escape_measurement("x\udc00") == "x\ufffd"


@pytest.mark.parametrize(
    ("precision", "ts"),
    [("ns", "1700000000123456789"), ("us", "1700000000123456"), ("ms", "1700000000123"), ("s", "1700000000")],
)
def test_the_precision_is_explicit_and_timestamps_are_truncated_to_it(precision, ts):
    line = Encoder(precision=precision).encode("gpu", TAGS, {"power_w": 1.0}, 1_700_000_000_123_456_789)
    assert line.rstrip("\n").rsplit(" ", 1)[1] == ts


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError):
        Encoder(precision="m")
