"""What a database's answer means, and how long to wait before asking again.

Every sink turns its failures into one :class:`WriteError` whose ``kind`` decides what
delivery does (see ``docs/architecture.md``):

========== =============================================== ========================================
kind       answers                                         delivery
========== =============================================== ========================================
transient  connection errors, timeouts, 408, other 5xx     retry with backoff; spool meanwhile
throttled  429, 502, 503, 504                              pause the sink for Retry-After (capped),
                                                           or the backoff when there is none
too_large  413                                             split the batch in halves; one line
                                                           still too large is dead-lettered
rejected   400, 422, other 4xx, 500 "field type conflict"  never retried: isolate the bad lines
                                                           (named by the server, else bisect),
                                                           dead-letter them, deliver the rest
config     401, 403, 404                                   a configuration error: log loudly (once
                                                           a minute), keep the data, back off
========== =============================================== ========================================

A 500 for a field type conflict (InfluxDB 2.0.x) is a rejection, not an outage: retrying it
would block the queue forever (telegraf #11005). The backoff is exponential with "equal
jitter": attempt *n* waits uniformly in ``[b/2, b]`` with ``b = min(max_delay, initial·2^(n-1))``,
so retries never hammer (lower bound) nor synchronise across agents (jitter).
"""

from __future__ import annotations

import email.utils
import enum
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tenacity

RETRY_AFTER_CAP_S = 600.0


class ErrorKind(str, enum.Enum):
    TRANSIENT = "transient"
    THROTTLED = "throttled"
    TOO_LARGE = "too_large"
    REJECTED = "rejected"
    CONFIG = "config"


_RETRIED = frozenset({ErrorKind.TRANSIENT, ErrorKind.THROTTLED, ErrorKind.CONFIG})


class WriteError(Exception):
    """A write that did not (entirely) succeed, classified for the retry policy."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        bad_lines: Sequence[int] = (),
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        #: 0-based indices (in the request) of lines the server named as bad
        self.bad_lines = tuple(bad_lines)

    @property
    def retryable(self) -> bool:
        return self.kind in _RETRIED

    def describe(self) -> str:
        where = f"HTTP {self.status}" if self.status else self.kind.value
        return f"{where}: {self.message}"

    def __repr__(self) -> str:
        return f"WriteError({self.kind.value}, {self.describe()!r})"


def parse_retry_after(value: str | None, *, now: float | None = None, cap: float = RETRY_AFTER_CAP_S) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds or an HTTP-date, capped.

    Returns ``None`` when the header is absent or unreadable (the caller then uses its backoff).
    A date in the past means "now" (0).
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT
            import datetime as _dt

            when = when.replace(tzinfo=_dt.timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), cap)


# -- answers --------------------------------------------------------------------------------------
_V1_UNPARSABLE = re.compile(r"unable to parse '(.*?)': ", re.S)


def error_message(headers: Mapping[str, str] | None, body: bytes | str | None) -> str:
    """The server's error text: the JSON body's ``message``/``error``, else the error headers, else the body."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        doc = json.loads(text) if text.strip().startswith("{") else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("message", "error"):
            if isinstance(doc.get(key), str) and doc[key]:
                return doc[key]
    for h in ("X-Influx-Error", "X-InfluxDB-Error", "X-Platform-Error-Code"):
        v = _header(headers, h)
        if v:
            return v
    return " ".join(text.split())[:500] or "(no message)"


def _header(headers: Mapping[str, str] | Any, name: str) -> str | None:
    if not headers:
        return None
    getter = getattr(headers, "get", None)
    if getter is not None:
        v = getter(name)
        if v is None:
            v = getter(name.lower())
        if v is not None:
            return str(v)
    try:
        for k, v in dict(headers).items():
            if str(k).lower() == name.lower():
                return str(v)
    except (TypeError, ValueError):
        pass
    return None


def _bad_lines(body: bytes | str | None, message: str, lines: Sequence[str]) -> list[int]:
    """Indices of the lines a 400 names: v2 ``line`` (1-based), v3 ``data[].line_number``, v1 quoted text."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    found: set[int] = set()
    try:
        doc = json.loads(text) if text.strip().startswith("{") else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        line = doc.get("line")
        if isinstance(line, int) and 1 <= line <= len(lines):
            found.add(line - 1)
        data = doc.get("data")
        if isinstance(data, list):
            for item in data:
                n = item.get("line_number") if isinstance(item, dict) else None
                if isinstance(n, int) and 1 <= n <= len(lines):
                    found.add(n - 1)
    if not found:
        quoted = {m.group(1) for m in _V1_UNPARSABLE.finditer(message)}
        if quoted:
            for i, line in enumerate(lines):
                if line.rstrip("\n") in quoted:
                    found.add(i)
    return sorted(found)


def classify_http(
    status: int, headers: Mapping[str, str] | Any, body: bytes | str | None, lines: Sequence[str] = ()
) -> WriteError:
    """Turn a non-2xx answer to a write of ``lines`` into a :class:`WriteError`."""
    message = error_message(headers, body)
    if status in (401, 403, 404):
        return WriteError(ErrorKind.CONFIG, message, status=status)
    if status == 413:
        return WriteError(ErrorKind.TOO_LARGE, message, status=status)
    if status in (429, 502, 503, 504):
        ra = parse_retry_after(_header(headers, "Retry-After"))
        return WriteError(ErrorKind.THROTTLED, message, status=status, retry_after=ra)
    if status == 408:
        return WriteError(ErrorKind.TRANSIENT, message, status=status)
    if status == 400:
        return WriteError(ErrorKind.REJECTED, message, status=status, bad_lines=_bad_lines(body, message, lines))
    if 400 <= status < 500:
        return WriteError(ErrorKind.REJECTED, message, status=status)
    if status == 500 and "field type conflict" in message:
        return WriteError(ErrorKind.REJECTED, message, status=status)
    return WriteError(ErrorKind.TRANSIENT, message, status=status)


# -- waiting --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Backoff parameters; :meth:`retrying` builds the tenacity controller one sink uses."""

    initial: float = 0.5
    max_delay: float = 60.0
    #: configuration errors (401/403/404) wait at least this long: a human has to act
    config_min_delay: float = 5.0
    retry_after_cap: float = RETRY_AFTER_CAP_S

    def __post_init__(self) -> None:
        half_init, half_max = self.initial / 2, self.max_delay / 2
        backoff = tenacity.wait_exponential(multiplier=half_init, max=half_max) + tenacity.wait_random_exponential(
            multiplier=half_init, max=half_max
        )
        object.__setattr__(self, "_backoff", backoff)

    def backoff(self, attempt: int) -> float:
        """The jittered delay after failed attempt number ``attempt`` (1-based), within ``[b/2, b]``."""
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return self._backoff(state)  # type: ignore[attr-defined]

    def delay_for(self, error: BaseException | None, attempt: int) -> float:
        """How long to wait after ``error`` on attempt ``attempt``: Retry-After wins when the server sent one."""
        delay = self.backoff(attempt)
        if isinstance(error, WriteError):
            if error.retry_after is not None:
                return min(error.retry_after, self.retry_after_cap)
            if error.kind is ErrorKind.CONFIG:
                return max(delay, self.config_min_delay)
        return delay

    def retrying(
        self,
        stop: threading.Event,
        before_sleep: Callable[[WriteError, float], None] | None = None,
        sleep: Callable[[float], Any] | None = None,
    ) -> tenacity.Retrying:
        """Retries retryable :class:`WriteError` until ``stop`` is set; the last error is re-raised then."""

        def _wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return self.delay_for(exc, state.attempt_number)

        def _before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if before_sleep is not None and isinstance(exc, WriteError):
                before_sleep(exc, state.upcoming_sleep)

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, WriteError) and e.retryable),
            wait=_wait,
            stop=tenacity.stop_when_event_set(stop),
            sleep=sleep if sleep is not None else stop.wait,
            before_sleep=_before_sleep,
            reraise=True,
        )
