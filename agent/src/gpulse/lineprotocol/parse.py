"""Line-protocol parser: the exact inverse of :mod:`gpulse.lineprotocol.encode`.

``gpulse upload`` and ``gpulse report --from-file`` read recording files (the agent's ``--record``
file, a training run's fallback ``gpulse-records.rec``, whose step lines
:mod:`gpulse.channel.recording` expands) with it, so a bad line is found and named
by its line number before anything is sent. It follows InfluxDB's own parser where the encoder
can produce something: ``\\,`` ``\\=`` ``\\ `` escapes in keys and tag values (any other backslash
is literal), ``\\,`` ``\\ `` in measurements, ``\\"`` ``\\\\`` in string fields, ``i``-suffixed
integers, floats, the boolean spellings, and an optional integer timestamp. Unsigned ``u``
integers are refused: InfluxDB 1.x rejects them, and the encoder never writes them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpulse.lineprotocol.limits import INT64_MAX, INT64_MIN

FieldValue = float | int | bool | str

_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INT = re.compile(r"[+-]?\d+")
_TRUE = frozenset(("t", "T", "true", "True", "TRUE"))
_FALSE = frozenset(("f", "F", "false", "False", "FALSE"))


class LineError(ValueError):
    """A line that is not valid line protocol; the message says what is wrong and where."""


@dataclass(frozen=True)
class ParsedLine:
    """One line of line protocol as read back (the channel's :class:`gpulse.channel.protocol.Point` is what a
    training process sends; this is what a line says)."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]
    ts: int | None

    def row(self) -> dict[str, object]:
        """The point as one flat row (``time``, tags, fields), the shape InfluxQL rows have."""
        return {"time": self.ts, **self.tags, **self.fields}


def _read_name(s: str, i: int, escapable: str, stops: str) -> tuple[str, int]:
    """Read an escaped name from ``s[i:]`` up to the first unescaped character in ``stops``."""
    out: list[str] = []
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n and s[i + 1] in escapable:
            out.append(s[i + 1])
            i += 2
            continue
        if c in stops:
            break
        out.append(c)
        i += 1
    return "".join(out), i


def _read_string(s: str, i: int) -> tuple[str, int]:
    """Read a quoted string field value starting at the opening quote ``s[i]``."""
    out: list[str] = []
    i += 1
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n and s[i + 1] in '"\\':
            out.append(s[i + 1])
            i += 2
            continue
        if c == '"':
            return "".join(out), i + 1
        out.append(c)
        i += 1
    raise LineError("unterminated string field value")


def _scalar(raw: str, key: str) -> FieldValue:
    if not raw:
        raise LineError(f"field {key!r} has no value")
    if raw[-1] == "i" and _INT.fullmatch(raw[:-1]):
        v = int(raw[:-1])
        if not INT64_MIN <= v <= INT64_MAX:
            raise LineError(f"field {key!r}: integer out of range")
        return v
    if raw[-1] == "u" and _INT.fullmatch(raw[:-1]):
        raise LineError(f"field {key!r}: unsigned integers ('u') are not accepted by InfluxDB 1.x")
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if _FLOAT.fullmatch(raw):
        v = float(raw)
        if v in (float("inf"), float("-inf")):
            raise LineError(f"field {key!r}: float out of range")
        return v
    raise LineError(f"field {key!r}: invalid value {raw[:40]!r}")


def parse_line(line: str) -> ParsedLine:
    """Parse one line (a trailing newline is allowed); raise :class:`LineError` if it is invalid."""
    s = line[:-1] if line.endswith("\n") else line
    if s.endswith("\r"):
        s = s[:-1]
    if not s or s[0] in " \t":
        raise LineError("line is empty or starts with whitespace")
    measurement, i = _read_name(s, 0, ", ", ", ")
    if not measurement:
        raise LineError("missing measurement")
    tags: dict[str, str] = {}
    n = len(s)
    while i < n and s[i] == ",":
        key, i = _read_name(s, i + 1, ",= ", ",= ")
        if i >= n or s[i] != "=":
            raise LineError(f"tag {key!r} has no '='")
        value, i = _read_name(s, i + 1, ",= ", ", ")
        if not key or not value:
            raise LineError("empty tag key or value")
        if key in tags:
            raise LineError(f"duplicate tag {key!r}")
        tags[key] = value
    if i >= n or s[i] != " ":
        raise LineError("missing fields")
    i += 1
    fields: dict[str, FieldValue] = {}
    while True:
        key, i = _read_name(s, i, ",= ", "= ,")
        if i >= n or s[i] != "=" or not key:
            raise LineError(f"field {key!r} has no '=' or no name")
        i += 1
        if i < n and s[i] == '"':
            value: FieldValue
            value, i = _read_string(s, i)
        else:
            j = i
            while j < n and s[j] not in ", ":
                j += 1
            value, i = _scalar(s[i:j], key), j
        if key in fields:
            raise LineError(f"duplicate field {key!r}")
        fields[key] = value
        if i < n and s[i] == ",":
            i += 1
            continue
        break
    ts: int | None = None
    if i < n:
        if s[i] != " ":
            raise LineError(f"unexpected character {s[i]!r} after field {key!r}")
        raw_ts = s[i + 1 :]
        if not _INT.fullmatch(raw_ts):
            raise LineError(f"invalid timestamp {raw_ts[:40]!r}")
        ts = int(raw_ts)
        if not INT64_MIN <= ts <= INT64_MAX:
            raise LineError("timestamp out of range")
    return ParsedLine(measurement, tags, fields, ts)


#: Makes one line that is not line protocol into ``(raw line, ParsedLine or LineError)`` pairs.
Expander = Callable[[str], Iterable[tuple[str, "ParsedLine | LineError"]]]


def read_lines(
    path: str | Path, expand: tuple[str, Expander] | None = None
) -> Iterator[tuple[int, str, ParsedLine | LineError]]:
    """Every non-blank, non-comment line of a file as ``(line number, raw line, ParsedLine or LineError)``.

    Lines are decoded one by one, so a damaged line (bad UTF-8, a torn write) is reported alone and
    every other line is still read. With ``expand`` (a mark, a function), a whole line that starts
    with the mark is not line protocol: the function makes it pairs, all yielded with its line
    number (a training run's recording keeps its steps in such lines,
    :func:`gpulse.channel.recording.read_records`).
    """
    mark, expander = expand or (None, None)
    with open(path, "rb") as f:
        for lineno, data in enumerate(f, 1):
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, data.decode("utf-8", "replace"), LineError("not valid UTF-8")
                continue
            stripped = raw.rstrip("\r\n")
            if not stripped.strip() or stripped.lstrip().startswith("#"):
                continue
            if not raw.endswith("\n"):
                # Writers end every line with a newline: a last line without one is a torn write,
                # and its timestamp may be cut short, so it is not trusted.
                yield lineno, raw, LineError("incomplete last line (no newline): the writer was interrupted")
                continue
            if mark is not None and expander is not None and stripped.startswith(mark):
                for text, p in expander(stripped):
                    yield lineno, text, p
                continue
            try:
                yield lineno, raw, parse_line(stripped)
            except LineError as e:
                yield lineno, raw, e
