"""InfluxDB 2.9.1's line-protocol parser, ported from ``models/points.go`` for the 2.x stand-in.

The stand-in must refuse every line the server refuses, with the server's words, because gpulse
isolates and dead-letters rejected lines by what the server says. This is a port of the functions
``ParsePointsWithPrecision`` calls (``scanLine``, ``parsePoint``, ``scanKey``/``scanMeasurement``/
``scanTags``/``scanTagsKey``/``scanTagsValue``, ``scanFields``, ``scanNumber``, ``scanBoolean``,
``scanTime``) and of ``SafeCalcTime`` (``models/time.go``), kept in the Go code's order so each
error comes from the same check. Known differences: escaped measurement/tag/field names are only
unescaped for the in-memory series key (the server stores them the same way); the per-point size
limits of ``http/points`` (off by default: the ``WithParserMax*`` options are commented out in
``http/api_handler.go``) are not applied.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_KEY_LENGTH = 65535  # models/points.go MaxKeyLength
MIN_NANO_TIME = -(2**63) + 2  # models/time.go MinNanoTime
MAX_NANO_TIME = 2**63 - 2  # models/time.go MaxNanoTime
#: models/points.go reservedTagKeys: FieldKeyTagKey, MeasurementTagKey and the 2.x names _field, _measurement, time.
RESERVED_TAG_KEYS = (b"\xff", b"\x00", b"_field", b"_measurement", b"time")
PRECISION_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}  # GetPrecisionMultiplier


class PointError(ValueError):
    """A line the server refuses; ``str()`` is the server's reason."""


@dataclass(frozen=True)
class Point:
    measurement: str
    tags: tuple[tuple[str, str], ...]  # sorted by key, as scanKey sorts them
    fields: dict[str, tuple[str, str]]  # name -> (type, value as written)
    time_ns: int
    line: str  # the line as sent (without its newline)
    head: str  # the line up to its fields (no timestamp)

    @property
    def series(self) -> str:
        return self.measurement + "".join(f",{k}={v}" for k, v in self.tags)


def parse_points(buf: bytes, precision: str, now_ns: int) -> tuple[list[Point], list[str]]:
    """``ParsePointsWithPrecision``: every point, and ``unable to parse '<line>': <why>`` for each bad line."""
    points: list[Point] = []
    failed: list[str] = []
    pos = 0
    while pos < len(buf):
        pos, block = _scan_line(buf, pos)
        pos += 1
        if not block:
            continue
        start = _skip_whitespace(block, 0)
        if start >= len(block):  # all whitespace
            continue
        if block[start : start + 1] == b"#":  # a comment
            continue
        if block.endswith(b"\n"):
            block = block[:-1]
        text = block[start:]
        try:
            points.append(_parse_point(text, now_ns, precision))
        except PointError as e:
            failed.append(f"unable to parse '{text.decode('utf-8', 'replace')}': {e}")
    return points, failed


def _scan_line(buf: bytes, i: int) -> tuple[int, bytes]:
    start, quoted, fields, equals, commas = i, False, False, 0, 0
    while i < len(buf):
        c = buf[i : i + 1]
        if c == b"\\" and i + 2 < len(buf):
            i += 2
            continue
        if c == b" ":
            fields = True
        if fields:
            if not quoted and c == b"=":
                i, equals = i + 1, equals + 1
                continue
            if not quoted and c == b",":
                i, commas = i + 1, commas + 1
                continue
            if c == b'"' and equals > commas:
                i, quoted = i + 1, not quoted
                continue
        if c == b"\n" and not quoted:
            break
        i += 1
    return i, buf[start:i]


def _skip_whitespace(buf: bytes, i: int) -> int:
    while i < len(buf) and buf[i : i + 1] in (b" ", b"\t", b"\x00"):
        i += 1
    return i


def _parse_point(buf: bytes, now_ns: int, precision: str) -> Point:
    pos, key, tag_spans = _scan_key(buf, 0)
    if not key:
        raise PointError("missing measurement")
    if len(key) > MAX_KEY_LENGTH:
        raise PointError(f"max key length exceeded: {len(key)} > {MAX_KEY_LENGTH}")
    pos, fields = _scan_fields(buf, pos)
    head = buf[:pos].decode("utf-8", "replace")
    if not fields:
        raise PointError("missing fields")
    parsed_fields = _split_fields(fields)
    for name in parsed_fields:  # walkFields: seriesKeySize = len(key) + len("#!~#") + len(field)
        size = len(key) + 4 + len(name.encode())
        if size > MAX_KEY_LENGTH:
            raise PointError(f"max key length exceeded: {size} > {MAX_KEY_LENGTH}")
    pos, ts = _scan_time(buf, pos)
    if not ts:
        time_ns = now_ns // PRECISION_NS[precision] * PRECISION_NS[precision]  # pt.SetPrecision(precision)
    else:
        try:
            value = int(ts)
        except ValueError:
            raise PointError(f'strconv.ParseInt: parsing "{ts.decode()}": invalid syntax') from None
        if not -(2**63) <= value < 2**63:
            raise PointError(f'strconv.ParseInt: parsing "{ts.decode()}": value out of range')
        time_ns = value * PRECISION_NS[precision]
        if not MIN_NANO_TIME <= time_ns <= MAX_NANO_TIME:  # SafeCalcTime / CheckTime
            raise PointError(f"time outside range {MIN_NANO_TIME} - {MAX_NANO_TIME}")
        if buf[pos:].strip(b" "):
            raise PointError("point is invalid")  # ErrInvalidPoint: non-space after the timestamp
    measurement = _unescape(buf[: tag_spans[0][0] - 1] if tag_spans else key)
    tags = tuple(sorted((_unescape(k), _unescape(v)) for k, v in (_tag(buf, s, e) for s, e in tag_spans)))
    return Point(measurement, tags, parsed_fields, time_ns, buf.decode("utf-8", "replace"), head)


def _scan_key(buf: bytes, i: int) -> tuple[int, bytes, list[tuple[int, int]]]:
    start = _skip_whitespace(buf, i)
    state, i = _scan_measurement(buf, start)
    spans: list[tuple[int, int]] = []
    if state == "tagkey":
        i, spans = _scan_tags(buf, i)
    keys = [_tag(buf, s, e)[0] for s, e in spans]
    for k in keys:
        if k in RESERVED_TAG_KEYS:
            raise PointError(f"cannot use reserved tag key {_go_quote(k)}")
    if len(set(keys)) != len(keys):
        raise PointError("duplicate tags")
    return i, buf[start:i], spans


def _scan_measurement(buf: bytes, i: int) -> tuple[str, int]:
    if i >= len(buf) or buf[i : i + 1] == b",":
        raise PointError("missing measurement")
    while True:
        i += 1
        if i >= len(buf):
            raise PointError("missing fields")
        if buf[i - 1 : i] == b"\\":
            continue
        if buf[i : i + 1] == b",":
            return "tagkey", i + 1
        if buf[i : i + 1] == b" ":
            return "fields", i


def _scan_tags(buf: bytes, i: int) -> tuple[int, list[tuple[int, int]]]:
    spans = []
    while True:
        start = i
        i = _scan_tags_key(buf, i)
        state, i = _scan_tags_value(buf, i)
        spans.append((start, i - 1 if state == "tagkey" else i))
        if state == "fields":
            return i, spans


def _scan_tags_key(buf: bytes, i: int) -> int:
    if i >= len(buf) or buf[i : i + 1] in (b" ", b",", b"="):
        raise PointError("missing tag key")
    while True:
        i += 1
        if i >= len(buf) or (buf[i : i + 1] in (b" ", b",") and buf[i - 1 : i] != b"\\"):
            raise PointError("missing tag value")
        if buf[i : i + 1] == b"=" and buf[i - 1 : i] != b"\\":
            return i + 1


def _scan_tags_value(buf: bytes, i: int) -> tuple[str, int]:
    if i >= len(buf) or buf[i : i + 1] in (b",", b" "):
        raise PointError("missing tag value")
    while True:
        i += 1
        if i >= len(buf):
            raise PointError("missing fields")
        escaped = buf[i - 1 : i] == b"\\"
        if buf[i : i + 1] == b"=" and not escaped:
            raise PointError("invalid tag format")
        if buf[i : i + 1] == b"," and not escaped:
            return "tagkey", i + 1
        if buf[i : i + 1] == b" " and not escaped:
            return "fields", i


def _tag(buf: bytes, start: int, end: int) -> tuple[bytes, bytes]:
    """A ``key=value`` tag span split at its first unescaped ``=`` (scanTo)."""
    i = start
    while i < end and not (buf[i : i + 1] == b"=" and buf[i - 1 : i] != b"\\"):
        i += 1
    return buf[start:i], buf[i + 1 : end]


def _scan_fields(buf: bytes, i: int) -> tuple[int, bytes]:
    start = i = _skip_whitespace(buf, i)
    quoted, equals, commas = False, 0, 0
    while i < len(buf):
        c = buf[i : i + 1]
        if c == b"\\" and i + 1 < len(buf):
            i += 2
            continue
        if c == b'"' and equals > commas:
            quoted = not quoted
            i += 1
            continue
        if c == b"=" and not quoted:
            equals += 1
            if buf[i - 1 : i] in (b" ", b",") and buf[i - 2 : i - 1] != b"\\":
                raise PointError("missing field key")
            if i + 1 >= len(buf) or buf[i + 1 : i + 2] in (b",", b" "):
                raise PointError("missing field value")
            nxt = buf[i + 1 : i + 2]
            if nxt.isdigit() or nxt in (b".", b"-", b"N", b"n"):
                i = _scan_number(buf, i + 1)
                continue
            if nxt != b'"':
                i = _scan_boolean(buf, i + 1)
                continue
        if c == b"," and not quoted:
            commas += 1
        if c == b" " and not quoted:
            break
        i += 1
    if quoted:
        raise PointError("unbalanced quotes")
    if equals == 0 or commas != equals - 1:
        raise PointError("invalid field format")
    return i, buf[start:i]


def _scan_number(buf: bytes, i: int) -> int:
    start, is_int, is_uint, decimal, scientific = i, False, False, False, False
    if i < len(buf) and buf[i : i + 1] == b"-":
        i += 1
        if i == len(buf):
            raise PointError("invalid number")
    while i < len(buf):
        c = buf[i : i + 1]
        if c in (b",", b" "):
            break
        if c == b"i" and i > start and not (is_int or is_uint):
            is_int, i = True, i + 1
            continue
        if c == b"u" and i > start and not (is_int or is_uint):
            is_uint, i = True, i + 1
            continue
        if c == b".":
            if decimal:
                raise PointError("invalid number")
            decimal = True
        if i > start and c in (b"e", b"E"):
            scientific, i = True, i + 1
            continue
        if c in (b"+", b"-") and buf[i - 1 : i] in (b"e", b"E"):
            i += 1
            continue
        if i + 2 < len(buf) and c in (b"N", b"n"):
            raise PointError("invalid number")
        if not (c.isdigit() or c == b"."):
            raise PointError("invalid number")
        i += 1
    if (is_int or is_uint) and (decimal or scientific):
        raise PointError("invalid number")
    digits = i - start - is_int - decimal - (buf[start : start + 1] == b"-")
    if digits == 0:
        raise PointError("invalid number")
    text = buf[start:i]
    if is_int:
        if not text.endswith(b"i"):
            raise PointError("invalid number")
        if not -(2**63) <= int(text[:-1]) < 2**63:
            raise PointError(f"unable to parse integer {text[:-1].decode()}: value out of range")
    elif is_uint:
        if not text.endswith(b"u") or text.startswith(b"-"):
            raise PointError("invalid number")
        if int(text[:-1]) >= 2**64:
            raise PointError(f"unable to parse unsigned {text[:-1].decode()}: value out of range")
    else:
        try:
            float(text)
        except ValueError:
            raise PointError("invalid float") from None
    return i


def _scan_boolean(buf: bytes, i: int) -> int:
    start = i
    if i < len(buf) and buf[i : i + 1] not in (b"t", b"f", b"T", b"F"):
        raise PointError("invalid boolean")
    i += 1
    while i < len(buf) and buf[i : i + 1] not in (b",", b" "):
        i += 1
    word = buf[start:i]
    if len(word) == 1 or word in (b"true", b"false", b"TRUE", b"True", b"FALSE", b"False"):
        return i
    raise PointError("invalid boolean")


def _scan_time(buf: bytes, i: int) -> tuple[int, bytes]:
    start = i = _skip_whitespace(buf, i)
    while i < len(buf) and buf[i : i + 1] not in (b"\n", b" "):
        if i == start and buf[i : i + 1] == b"-":
            i += 1
            continue
        if not buf[i : i + 1].isdigit():
            raise PointError("bad timestamp")
        i += 1
    return i, buf[start:i]


def _split_fields(fields: bytes) -> dict[str, tuple[str, str]]:
    """name -> (type, value) of a field block already validated by ``_scan_fields``."""
    out: dict[str, tuple[str, str]] = {}
    i, n = 0, len(fields)
    while i < n:
        k = i
        while not (fields[k : k + 1] == b"=" and fields[k - 1 : k] != b"\\"):
            k += 1
        v = j = k + 1
        if fields[v : v + 1] == b'"':
            j += 1
            while not (fields[j : j + 1] == b'"' and fields[j - 1 : j] != b"\\"):
                j += 1
            j += 1
        else:
            while j < n and fields[j : j + 1] != b",":
                j += 1
        value = fields[v:j].decode("utf-8", "replace")
        out[_unescape(fields[i:k])] = (_field_type(value), value)
        i = j + 1
    return out


def _field_type(value: str) -> str:
    if value.startswith('"'):
        return "string"
    if value[0] in "tfTF":
        return "boolean"
    if value.endswith("i"):
        return "integer"
    if value.endswith("u"):
        return "unsigned"
    return "float"


def _unescape(b: bytes) -> str:
    out, i = bytearray(), 0
    while i < len(b):
        if b[i : i + 1] == b"\\" and i + 1 < len(b) and b[i + 1 : i + 2] in (b",", b" ", b"=", b'"', b"\\"):
            out += b[i + 1 : i + 2]
            i += 2
            continue
        out += b[i : i + 1]
        i += 1
    return out.decode("utf-8", "replace")


def _go_quote(b: bytes) -> str:
    """Go's ``%q`` of a byte string, for the reserved-key message."""
    out = []
    for ch in b.decode("utf-8", "replace"):
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}")
    return '"' + "".join(out) + '"'
