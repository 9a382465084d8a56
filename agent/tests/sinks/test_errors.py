"""What each HTTP answer means (a :class:`WriteError` kind), Retry-After, and the bad lines an error body names."""

from __future__ import annotations

import email.utils
import json

import pytest

from gpulse.sinks.errors import RETRY_AFTER_CAP_S, ErrorKind, classify_http, parse_retry_after

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [("5", 5.0), (" 120 ", 120.0), ("1.5", 1.5), ("0", 0.0), ("-3", 0.0), ("86400", RETRY_AFTER_CAP_S)],
)
def test_retry_after_in_seconds_is_read_and_capped(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


def test_retry_after_as_an_http_date_is_the_time_left_until_then():
    assert parse_retry_after(email.utils.formatdate(NOW + 42, usegmt=True), now=NOW) == pytest.approx(42, abs=1)
    assert parse_retry_after(email.utils.formatdate(NOW - 42, usegmt=True), now=NOW) == 0.0
    assert parse_retry_after(email.utils.formatdate(NOW + 7200, usegmt=True), now=NOW) == RETRY_AFTER_CAP_S
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480.0 - 10) == 10.0


@pytest.mark.parametrize("value", [None, "", "soon", "nan", "Someday, 99 Foo 20 25:61:00 GMT"])
def test_an_unreadable_retry_after_means_use_the_backoff(value):
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ErrorKind.REJECTED),
        (401, ErrorKind.CONFIG),
        (403, ErrorKind.CONFIG),
        (404, ErrorKind.CONFIG),
        (408, ErrorKind.TRANSIENT),
        (413, ErrorKind.TOO_LARGE),
        (422, ErrorKind.REJECTED),
        (429, ErrorKind.THROTTLED),
        (500, ErrorKind.TRANSIENT),
        (502, ErrorKind.THROTTLED),
        (503, ErrorKind.THROTTLED),
        (504, ErrorKind.THROTTLED),
    ],
)
def test_each_status_maps_to_one_kind(status, kind):
    e = classify_http(status, {"Retry-After": "3"}, b'{"code":"x","message":"why"}')
    assert e.kind is kind and e.status == status and e.message == "why"
    assert e.retryable == (kind in (ErrorKind.TRANSIENT, ErrorKind.THROTTLED, ErrorKind.CONFIG))
    if kind is ErrorKind.THROTTLED:
        assert e.retry_after == 3.0


def test_a_500_field_type_conflict_is_a_rejection_not_an_outage():
    body = json.dumps({"code": "internal error", "message": 'partial write: field type conflict: input field "v"'})
    assert classify_http(500, {}, body).kind is ErrorKind.REJECTED


def test_bad_lines_are_found_in_v2_v3_and_v1_error_bodies():
    lines = ["a v=1\n", "b v=\n", "c v=3\n", "d\n"]
    v2 = {"code": "invalid", "message": "unable to parse 'b v=': missing field value", "line": 2}
    assert classify_http(400, {}, json.dumps(v2), lines).bad_lines == (1,)
    v3 = {"error": "partial write of line protocol occurred", "data": [{"line_number": 2}, {"line_number": 4}]}
    assert classify_http(400, {}, json.dumps(v3), lines).bad_lines == (1, 3)
    v1 = {"error": "unable to parse 'b v=': missing field value\nunable to parse 'd': missing fields"}
    assert classify_http(400, {}, json.dumps(v1), lines).bad_lines == (1, 3)
    assert classify_http(400, {}, "garbage", lines).bad_lines == ()


def test_the_message_comes_from_the_influx_error_header_when_the_body_has_none():
    assert classify_http(500, {"X-Influx-Error": "timeout"}, b"").message == "timeout"
