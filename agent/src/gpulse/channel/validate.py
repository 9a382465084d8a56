"""Validation of what arrives from outside: training-channel messages and recording-file lines.

Both come from processes the agent does not control, so nothing is trusted: every message is
checked against :mod:`gpulse.schema` before it is encoded. A message that cannot be made valid is
*rejected* with a cause (:class:`Rejected`); a single bad field value (NaN in a logged loss, a
string too long) is *dropped* with a cause and the rest of the point kept, so one bad scalar never
costs a training step.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulse import schema
from gpulse.lineprotocol.parse import Point

#: Measurements a training process may send over the channel.
CHANNEL_MEASUREMENTS = ("train_step", "train_run", "train_event")
#: Tags every training point carries (the agent adds ``host``).
REQUIRED_TAGS = ("run", "rank", "local_rank", "world_size")
_INT_TAGS = ("rank", "local_rank", "world_size")
_TAG_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_DIGITS = re.compile(r"\d{1,9}")
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
MAX_FIELDS = 256
MAX_UUIDS = 64
MAX_UUID_LEN = 128
#: Accepted point timestamps: at most this far in the past / future of the agent's clock.
PAST_WINDOW_NS = 30 * 86400 * 10**9
FUTURE_WINDOW_NS = 300 * 10**9

#: Why a whole message is rejected (one counter and one log line each). Envelope problems (size,
#: UTF-8, JSON, NaN/Inf constants, version, kind, seq) are found first by ``protocol.decode`` and
#: counted under its ``ProtocolError.cause``; these are the causes found in a message's content.
REJECT_CAUSES = {
    "not_object": "message is not a JSON object",
    "bad_version": 'missing or unsupported "v"',
    "unexpected_kind": "a kind the agent does not accept from a client (ack, status_reply, unknown)",
    "bad_seq": '"seq" is not a non-negative integer',
    "bad_measurement": '"m" is not train_step, train_run or train_event',
    "bad_ts": '"ts" is not an integer (Unix ns)',
    "ts_out_of_window": '"ts" is more than 30 days in the past or 5 minutes in the future',
    "bad_tags": '"tags" is not an object',
    "missing_tag": "a required tag (run, rank, local_rank, world_size) is missing",
    "bad_tag_key": "a tag name is not an identifier",
    "bad_tag_value": "a tag value is not a non-empty string, too long, or rank/world_size not a number",
    "reserved_tag": "a tag name is reserved (host, time, _*, or a field name)",
    "too_many_tags": "more user tags than the schema allows",
    "bad_fields": '"fields" is not an object, or has too many entries',
    "no_valid_fields": "no field value survived validation",
    "bad_register": "register/unregister without a valid run, rank, pid or uuids",
}
#: Why a single field value is dropped (the rest of the point is kept).
DROP_CAUSES = {
    "unknown_field": "field not declared in the schema nor matching its open-field pattern",
    "type_mismatch": "value type incompatible with the declared field type",
    "nonfinite": "NaN or infinite number",
    "string_too_long": f"string longer than schema.MAX_STRING_LEN ({schema.MAX_STRING_LEN})",
}


class Rejected(Exception):
    """A message that cannot be accepted; ``cause`` is a key of :data:`REJECT_CAUSES`."""

    def __init__(self, cause: str, detail: str = "") -> None:
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause
        self.detail = detail


@dataclass
class PointMsg:
    measurement: str
    tags: dict[str, str]
    fields: dict[str, Any]
    ts: int
    seq: int | None


@dataclass
class RegisterMsg:
    kind: str  # "register" or "unregister"
    run: str
    rank: str
    pid: int
    uuids: list[str]
    seq: int | None


@dataclass
class StatusMsg:
    seq: int | None = None


Message = PointMsg | RegisterMsg | StatusMsg


_MAX_KNOWN_FIELDS = 1024
_MAX_TAG_SETS = 4096


def _is_int(v: Any) -> bool:
    return type(v) is int


@dataclass
class Validator:
    """Checks decoded channel messages; counts dropped field values by cause in ``dropped``."""

    past_window_ns: int = PAST_WINDOW_NS
    future_window_ns: int = FUTURE_WINDOW_NS
    dropped: Counter[str] = field(default_factory=Counter)
    #: measurement -> field name -> type, declared fields plus open fields seen (bounded)
    _types: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    #: (measurement, tag items) -> checked tags: the ranks of a run send the same tag set every step
    _tag_cache: dict[tuple[str, tuple[tuple[Any, Any], ...]], dict[str, str]] = field(default_factory=dict, repr=False)

    def message(self, msg: Any, now_ns: int) -> Message:
        if not isinstance(msg, dict):
            raise Rejected("not_object")
        if type(msg.get("v")) is not int or msg["v"] != 1:
            raise Rejected("bad_version")
        kind = msg.get("kind")
        seq = msg.get("seq")
        if seq is not None and not (_is_int(seq) and 0 <= seq <= _INT_MAX):
            raise Rejected("bad_seq")
        if kind == "point":
            return self._point(msg, seq, now_ns)
        if kind in ("register", "unregister"):
            return self._register(msg, kind, seq)
        if kind == "status":
            return StatusMsg(seq)
        raise Rejected("unexpected_kind", repr(kind)[:40])

    # -- points -----------------------------------------------------------------------------
    def _point(self, msg: Mapping[str, Any], seq: int | None, now_ns: int) -> PointMsg:
        name = msg.get("m")
        if name not in CHANNEL_MEASUREMENTS:
            raise Rejected("bad_measurement", repr(name)[:40])
        m = schema.MEASUREMENTS[name]
        ts = msg.get("ts")
        if not _is_int(ts):
            raise Rejected("bad_ts")
        if not now_ns - self.past_window_ns <= ts <= now_ns + self.future_window_ns:
            raise Rejected("ts_out_of_window", f"{(ts - now_ns) / 1e9:+.0f} s from now")
        tags = self._tags(m, msg.get("tags"))
        fields = msg.get("fields")
        if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
            raise Rejected("bad_fields")
        clean = self.fields(m, fields)
        if not clean:
            raise Rejected("no_valid_fields")
        return PointMsg(name, tags, clean, ts, seq)

    def fields(self, m: schema.Measurement, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The field values that fit ``m``, coerced to their declared types; the rest counted in ``dropped``.

        Hot path (every training step of every rank): a finite ``float`` for a float field and an
        in-range ``int`` for an int field are accepted after one lookup; anything else goes
        through :func:`check_value`."""
        types = self._types.get(m.name)
        if types is None:
            types = self._types[m.name] = {f.name: f.type for f in m.fields}
        out: dict[str, Any] = {}
        for name, value in fields.items():
            t = types.get(name)
            if t == "float":
                if type(value) is float and value - value == 0.0:
                    out[name] = value
                    continue
            elif t == "int":
                if type(value) is int and _INT_MIN <= value <= _INT_MAX:
                    out[name] = value
                    continue
            elif t is None and type(name) is str and len(types) < _MAX_KNOWN_FIELDS:
                ft = m.field_type(name)  # an open field (log_*, phase_*) seen for the first time
                if ft is not None:
                    types[name] = ft
            cause, v = check_value(m, name, value)
            if cause:
                self.dropped[cause] += 1
            else:
                out[name] = v
        return out

    def _tags(self, m: schema.Measurement, tags: Any) -> dict[str, str]:
        """:func:`check_tags`, remembered per distinct tag set (bounded; the result is never mutated)."""
        try:
            key = (m.name, tuple(tags.items()))
            hit = self._tag_cache.get(key)
        except (AttributeError, TypeError):  # not a dict, or unhashable values: check_tags says why
            return check_tags(m, tags)
        if hit is None:
            hit = check_tags(m, tags)
            if len(self._tag_cache) >= _MAX_TAG_SETS:
                self._tag_cache.clear()
            self._tag_cache[key] = hit
        return hit

    # -- registration -----------------------------------------------------------------------
    def _register(self, msg: Mapping[str, Any], kind: str, seq: int | None) -> RegisterMsg:
        run, rank, pid = msg.get("run"), msg.get("rank"), msg.get("pid")
        if _is_int(rank):
            rank = str(rank)
        if not (
            isinstance(run, str)
            and 0 < len(run) <= schema.MAX_TAG_VALUE_LEN
            and isinstance(rank, str)
            and _DIGITS.fullmatch(rank)
            and _is_int(pid)
            and 0 < pid < 2**31
        ):
            raise Rejected("bad_register")
        uuids = msg.get("uuids") or []
        if kind == "register" and not (
            isinstance(uuids, list)
            and len(uuids) <= MAX_UUIDS
            and all(isinstance(u, str) and 0 < len(u) <= MAX_UUID_LEN and u.isprintable() for u in uuids)
        ):
            raise Rejected("bad_register", "uuids")
        return RegisterMsg(kind, run, rank, pid, list(uuids) if kind == "register" else [], seq)


def check_tags(m: schema.Measurement, tags: Any) -> dict[str, str]:
    """The tag set of a training point, checked; raise :class:`Rejected` with the first problem."""
    if not isinstance(tags, dict):
        raise Rejected("bad_tags")
    out: dict[str, str] = {}
    extra = 0
    for key, value in tags.items():
        if not isinstance(key, str) or not _TAG_KEY.fullmatch(key):
            raise Rejected("bad_tag_key", repr(key)[:40])
        if key in ("host", "time") or key in m.by_name:
            raise Rejected("reserved_tag", key)
        if _is_int(value):
            value = str(value)
        if not isinstance(value, str) or not value or len(value) > schema.MAX_TAG_VALUE_LEN:
            raise Rejected("bad_tag_value", key)
        if key in _INT_TAGS and not _DIGITS.fullmatch(value):
            raise Rejected("bad_tag_value", key)
        if key not in REQUIRED_TAGS:
            extra += 1
        out[key] = value
    for key in REQUIRED_TAGS:
        if key not in out:
            raise Rejected("missing_tag", key)
    if extra > m.max_extra_tags:
        raise Rejected("too_many_tags", f"{extra} > {m.max_extra_tags}")
    return out


def check_value(m: schema.Measurement, name: Any, value: Any) -> tuple[str | None, Any]:
    """``(None, coerced value)`` when ``value`` fits field ``name`` of ``m``, else ``(drop cause, None)``."""
    t = m.field_type(name) if isinstance(name, str) else None
    if t is None:
        return "unknown_field", None
    if t == "float":
        if type(value) is float:
            return (None, value) if math.isfinite(value) else ("nonfinite", None)
        if _is_int(value):
            return (None, float(value)) if abs(value) < 2**1023 else ("nonfinite", None)
        return "type_mismatch", None
    if t == "int":
        if _is_int(value):
            return (None, value) if _INT_MIN <= value <= _INT_MAX else ("type_mismatch", None)
        if type(value) is float:
            if not math.isfinite(value):
                return "nonfinite", None
            if value.is_integer() and _INT_MIN <= value <= _INT_MAX:
                return None, int(value)
        return "type_mismatch", None
    if t == "str":
        if not isinstance(value, str):
            return "type_mismatch", None
        return (None, value) if len(value) <= schema.MAX_STRING_LEN else ("string_too_long", None)
    return (None, value) if type(value) is bool else ("type_mismatch", None)


def check_line_point(p: Point) -> str | None:
    """Why a parsed recording line must not be uploaded, or ``None`` when it is fine.

    Line types must equal the schema's (InfluxDB refuses a field whose type differs from the one
    stored), and a timestamp is required: without one the server would stamp the upload time, so
    uploading the same file twice would duplicate the point.
    """
    m = schema.MEASUREMENTS.get(p.measurement)
    if m is None:
        return f"unknown measurement {p.measurement!r}"
    if p.ts is None:
        return "no timestamp (an upload must be idempotent)"
    if "host" not in p.tags:
        return "no host tag"
    if p.measurement in CHANNEL_MEASUREMENTS:
        for key in ("run", "rank"):
            if key not in p.tags:
                return f"no {key} tag"
    for key, value in p.tags.items():
        if len(value) > schema.MAX_TAG_VALUE_LEN:
            return f"tag {key!r} longer than {schema.MAX_TAG_VALUE_LEN}"
    for name, value in p.fields.items():
        t = m.field_type(name)
        if t is None:
            return f"field {name!r} is not in the schema of {p.measurement}"
        actual = {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]
        if actual != t:
            return f"field {name!r} is {actual}, the schema says {t}"
        if t == "str" and len(value) > schema.MAX_STRING_LEN:
            return f"field {name!r} longer than {schema.MAX_STRING_LEN}"
    return None
