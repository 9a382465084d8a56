"""What a database's answer to a write means: one :class:`WriteError` with a :class:`ErrorKind`.

Every sink turns its failures into a :class:`WriteError` whose ``kind`` decides what delivery does
(the table is in :mod:`gpulse.delivery.retry`). Classifying the answer is the sink's job, so the
classification lives with the sinks; delivery only reads ``kind``, ``retry_after`` and ``bad_lines``.
A 500 for a field type conflict (InfluxDB 2.0.x) is a rejection, not an outage: retrying it would
block the queue forever (telegraf #11005). A 500 for a missing retention policy (InfluxDB 1.x:
``coordinator/points_writer.go`` ``MapShards`` returns ``ErrRetentionPolicyNotFound`` from
``errors.go``, which ``services/httpd/handler.go`` ``serveWrite`` answers with 500) is a layout
problem, like the 404 for a missing database: a configuration error, not an outage.
InfluxDB 3's ``/api/v3/write_lp`` with ``accept_partial=true`` writes the good lines of a batch and
answers 400 (422 when a line hit a schema limit) ``{"error": "partial write of line protocol occurred",
"data": [{"error_message", "line_number", "original_line"}, ...]}`` (``Error::PartialLpWrite`` in
``influxdb3_server/src/http.rs``): a :class:`WriteError` with ``partial`` set, the bad lines and each one's reason.
The server's error text is read the one way :func:`gpulse.influx.http.error_message` reads it.
"""

from __future__ import annotations

import email.utils
import enum
import json
import re
import time
from collections.abc import Mapping, Sequence
from email.message import Message
from typing import TYPE_CHECKING

from gpulse.influx.http import Failure, error_message, header_value

if TYPE_CHECKING:
    from gpulse.influx.server import Diagnosis

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
        failure: Failure | None = None,
        diagnosis: Diagnosis | None = None,
        line_errors: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        #: 0-based indices (in the request) of lines the server named as bad
        self.bad_lines = tuple(bad_lines)
        #: why no answer came (a transport failure), when none did
        self.failure = failure
        #: what a refusal means and what to do (wrong --api, credentials, layout), when known
        self.diagnosis = diagnosis
        #: a partial write (InfluxDB 3): the server wrote every line but ``bad_lines``, each refused for
        #: the reason given here by index; re-sending the others is not needed
        self.line_errors = dict(line_errors or {})

    @property
    def partial(self) -> bool:
        return bool(self.line_errors)

    @property
    def retryable(self) -> bool:
        return self.kind in _RETRIED

    def describe(self) -> str:
        where = f"HTTP {self.status}" if self.status else self.kind.value
        text = f"{where}: {self.message}"
        return self.diagnosis.explain(text) if self.diagnosis is not None else text

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


PARTIAL_WRITE = "partial write of line protocol occurred"  # influxdb3_server/src/http.rs Error::PartialLpWrite


def _partial_write(body: bytes | str | None, lines: Sequence[str]) -> dict[int, str]:
    """InfluxDB 3's list of the lines a partial write refused: index -> the server's reason ({} if not one)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    try:
        doc = json.loads(text) if text.strip().startswith("{") else None
    except ValueError:
        return {}
    if not isinstance(doc, dict) or doc.get("error") != PARTIAL_WRITE or not isinstance(doc.get("data"), list):
        return {}
    out = {}
    for item in doc["data"]:
        n = item.get("line_number") if isinstance(item, dict) else None
        if not isinstance(n, int) or not 1 <= n <= len(lines):
            return {}  # a list that does not match the batch: trust none of it (delivery then bisects)
        out[n - 1] = str(item.get("error_message") or "refused")
    return out


def classify_http(
    status: int, headers: Mapping[str, str] | Message | None, body: bytes | str | None, lines: Sequence[str] = ()
) -> WriteError:
    """Turn a non-2xx answer to a write of ``lines`` into a :class:`WriteError`."""
    message = error_message(headers, body)
    if status in (400, 422):
        refused = _partial_write(body, lines)
        if refused:
            return WriteError(
                ErrorKind.REJECTED, message, status=status, bad_lines=sorted(refused), line_errors=refused
            )
    if status in (401, 403, 404) or (status == 500 and "retention policy not found" in message):
        return WriteError(ErrorKind.CONFIG, message, status=status)
    if status == 413:
        return WriteError(ErrorKind.TOO_LARGE, message, status=status)
    if status in (429, 502, 503, 504):
        ra = parse_retry_after(header_value(headers, "Retry-After"))
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
