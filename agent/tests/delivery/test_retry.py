"""The retry policy: tenacity waits for Retry-After, else an exponential backoff with jitter, until told to stop."""

from __future__ import annotations

import threading
import time

import pytest

from gpulse.delivery.retry import RetryPolicy
from gpulse.sinks.errors import ErrorKind, WriteError


def waits(policy: RetryPolicy, errors: list[WriteError]) -> list[float]:
    """The sleeps tenacity asks for when successive attempts fail with ``errors``, then one succeeds."""
    sleeps: list[float] = []
    pending = iter(errors)
    for attempt in policy.retrying(threading.Event(), sleep=sleeps.append):
        with attempt:
            error = next(pending, None)
            if error is not None:
                raise error
    return sleeps


def test_backoff_grows_exponentially_with_full_jitter_and_is_capped():
    """Attempt n waits anywhere in [0, b], b doubling up to the cap: agents that failed together spread out."""
    p = RetryPolicy(initial=1.0, max_delay=30.0)
    runs = [waits(p, [WriteError(ErrorKind.TRANSIENT, "down")] * 11) for _ in range(200)]
    for attempt in range(1, 12):
        b = min(30.0, 2.0 ** (attempt - 1))
        samples = [run[attempt - 1] for run in runs]
        assert all(0 <= s <= b for s in samples), (attempt, min(samples), max(samples))
        assert min(samples) < b / 4 and max(samples) > 3 * b / 4  # the whole range, not a fixed schedule


def test_retry_after_wins_over_the_backoff_and_config_errors_wait_longer():
    p = RetryPolicy(initial=0.1, max_delay=1.0, config_min_delay=5.0, retry_after_cap=100.0)
    got = waits(
        p,
        [
            WriteError(ErrorKind.THROTTLED, "slow down", retry_after=42.0),
            WriteError(ErrorKind.THROTTLED, "slow down", retry_after=4000.0),
            WriteError(ErrorKind.THROTTLED, "no header"),
            WriteError(ErrorKind.CONFIG, "401"),
        ],
    )
    assert got[:2] == [42.0, 100.0]
    assert 0 <= got[2] <= 0.4  # attempt 3: the backoff
    assert got[3] == 5.0


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
    assert len(calls) >= 5 and all(0 <= d <= 0.02 for d in calls)


def test_non_retryable_errors_are_raised_at_once():
    retrying = RetryPolicy(initial=0.01).retrying(threading.Event())
    n = 0
    with pytest.raises(WriteError):
        for attempt in retrying:
            with attempt:
                n += 1
                raise WriteError(ErrorKind.REJECTED, "bad")
    assert n == 1
