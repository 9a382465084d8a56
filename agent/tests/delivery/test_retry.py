"""The retry policy: Retry-After parsing, backoff bounds, and what each HTTP answer means."""

from __future__ import annotations

import email.utils
import json
import threading
import time

import pytest

from gpulse.delivery.retry import RetryPolicy
from gpulse.sinks.errors import RETRY_AFTER_CAP_S, ErrorKind, WriteError, classify_http, parse_retry_after

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


def test_backoff_grows_exponentially_with_jitter_within_half_to_full_and_is_capped():
    p = RetryPolicy(initial=1.0, max_delay=30.0)
    for attempt in range(1, 12):
        b = min(30.0, 2.0 ** (attempt - 1))
        samples = [p.backoff(attempt) for _ in range(200)]
        assert all(b / 2 <= s <= b for s in samples), (attempt, min(samples), max(samples))
        assert max(samples) - min(samples) > b / 10  # jittered, not a fixed schedule


def test_retry_after_wins_over_the_backoff_and_config_errors_wait_longer():
    p = RetryPolicy(initial=0.1, max_delay=1.0, config_min_delay=5.0, retry_after_cap=100.0)
    assert p.delay_for(WriteError(ErrorKind.THROTTLED, "slow down", retry_after=42.0), 1) == 42.0
    assert p.delay_for(WriteError(ErrorKind.THROTTLED, "slow down", retry_after=4000.0), 1) == 100.0
    assert 0.05 <= p.delay_for(WriteError(ErrorKind.THROTTLED, "no header"), 1) <= 0.1
    assert p.delay_for(WriteError(ErrorKind.CONFIG, "401"), 1) == 5.0


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


def test_retrying_stops_when_told_and_reraises_the_last_error():
    stop = threading.Event()
    calls = []
    retrying = RetryPolicy(initial=0.01, max_delay=0.02).retrying(stop, before_sleep=lambda e, d: calls.append(d))
    t0 = time.monotonic()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(WriteError):
        for attempt in retrying:
            with attempt:
                raise WriteError(ErrorKind.TRANSIENT, "down")
    assert 0.15 < time.monotonic() - t0 < 2.0
    assert len(calls) >= 5 and all(0.005 <= d <= 0.02 for d in calls)


def test_non_retryable_errors_are_raised_at_once():
    retrying = RetryPolicy(initial=0.01).retrying(threading.Event())
    n = 0
    with pytest.raises(WriteError):
        for attempt in retrying:
            with attempt:
                n += 1
                raise WriteError(ErrorKind.REJECTED, "bad")
    assert n == 1
