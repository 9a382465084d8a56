"""The line-protocol parser reads back exactly what the encoder writes, and names what it cannot read."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.stored_text import stored_key

from gpulse.lineprotocol.encode import Encoder
from gpulse.lineprotocol.parse import LineError, parse_line, read_lines

text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
tag_values = text.filter(lambda s: stored_key(s) != "")


@settings(max_examples=300, deadline=None)
@given(
    tags=st.dictionaries(st.sampled_from(["run", "rank", "model", "team x", "a,b", "k=v"]), tag_values, max_size=5),
    loss=st.floats(allow_nan=False, allow_infinity=False),
    step=st.integers(-(2**63), 2**63 - 1),
    ts=st.integers(-(2**62), 2**62),
)
def test_every_encoded_train_step_parses_back_to_its_values(tags, loss, step, ts):
    line = Encoder().encode("train_step", tags, {"step": step, "log_loss": loss}, ts)
    p = parse_line(line)
    assert p.measurement == "train_step"
    assert p.tags == {stored_key(k): stored_key(v) for k, v in tags.items()}
    assert p.fields == {"step": step, "log_loss": loss}
    assert p.ts == ts


@settings(max_examples=300, deadline=None)
@given(value=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), flag=st.booleans())
def test_string_fields_round_trip_exactly_except_newlines(value, flag):
    line = Encoder(strict=False).encode("custom", {"host": "h"}, {"text": value, "ok": flag}, 1)
    p = parse_line(line)
    assert p.fields["text"] == value.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    assert p.fields["ok"] is flag


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("", "empty"),
        ("cpu", "missing fields"),
        ("cpu,host=a", "missing fields"),
        ("cpu,host value=1", "no '='"),
        ("cpu value=", "no value"),
        ("cpu value=1u 5", "unsigned"),
        ("cpu value=abc", "invalid value"),
        ('cpu value="open', "unterminated"),
        ("cpu value=1 12x", "invalid timestamp"),
        ("cpu value=1,value=2", "duplicate field"),
        ("cpu value=99999999999999999999i", "out of range"),
        ("cpu value=1e999", "out of range"),
        ('cpu value="a"x', "unexpected character"),
    ],
)
def test_invalid_lines_raise_a_line_error_that_says_why(line, why):
    with pytest.raises(LineError, match=why):
        parse_line(line)


def test_scalars_parse_to_their_types():
    p = parse_line("m a=1i,b=-2.5,c=t,d=FALSE,e=1e-07,f=.5 17\n")
    assert p.fields == {"a": 1, "b": -2.5, "c": True, "d": False, "e": 1e-07, "f": 0.5}
    assert type(p.fields["a"]) is int and type(p.fields["b"]) is float
    assert parse_line("m a=1").ts is None
    assert not math.isnan(p.fields["b"])


def test_read_lines_numbers_every_line_skips_comments_and_reports_torn_or_undecodable_lines(tmp_path: Path):
    f = tmp_path / "rec.lp"
    f.write_bytes(b"# header\nm a=1i 1\n\nm a=\xff 2\nbroken\nm a=2i 3")
    got = [(n, type(r).__name__) for n, _raw, r in read_lines(f)]
    assert got == [(2, "ParsedLine"), (4, "LineError"), (5, "LineError"), (6, "LineError")]
    errors = {n: str(r) for n, _raw, r in read_lines(f) if isinstance(r, LineError)}
    assert "UTF-8" in errors[4] and "no newline" in errors[6]
