"""InfluxDB line protocol, written for the hot path.

A :class:`Series` is built once per (measurement, tag set): it holds the escaped
``measurement,tag=value`` prefix and the escaped field keys with their declared types, so
encoding a sample is one pass over its fields and one f-string, with no per-point objects.

Rules (InfluxDB 1.x and 2.x agree on them):

* integers are written with ``i``, never ``u`` (1.x rejects ``u``); floats with ``repr``;
* a value of the wrong Python type is coerced to the field's declared type, so a field's
  type never changes; values that cannot be coerced are dropped and counted;
* NaN and ±Inf are dropped and counted; a line with no fields left is not written;
* newlines and carriage returns become spaces everywhere (line protocol cannot carry them);
* lone surrogates (possible in Python ``str``, impossible in UTF-8) become U+FFFD;
* tag values: ``,``, ``=`` and space are escaped; a backslash directly before one of those or
  at the end of the value cannot be represented by InfluxDB's parser and becomes ``/``;
  an empty tag value means the tag is omitted (a backslash before ``"`` is stored as written);
* measurement names: ``,`` and space are escaped (``=`` is literal); InfluxDB still reads ``\\=``
  as an escape there, so a backslash before ``,``, ``=``, space, or at the end becomes ``/`` too;
* string field values escape ``"`` and ``\\`` and round-trip exactly.

``agent/tests/lineprotocol/test_encoding_roundtrip.py`` checks these rules against a real InfluxDB (hypothesis).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gpulse.lineprotocol.limits import INT64_MAX, INT64_MIN, MAX_CACHED_FIELDS_PER_SERIES, MAX_CACHED_SERIES
from gpulse.schema import MEASUREMENTS, Measurement

PRECISIONS = ("ns", "us", "ms", "s")
_NS_PER = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_KEY_SPECIALS = frozenset(",= ")
# InfluxDB unescapes "\=" in measurement names too, though "=" itself needs no escape there.
_MEASUREMENT_SPECIALS = frozenset(", =")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(s: str) -> str:
    """Strip what line protocol cannot carry: newlines (become spaces) and lone surrogates (U+FFFD)."""
    if "\n" in s or "\r" in s:
        s = s.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            s = _SURROGATE.sub("\ufffd", s)
    return s


def _fix_backslashes(s: str, specials: frozenset[str]) -> str:
    """Replace each backslash InfluxDB's parser would read as an escape (or a dangling one) by ``/``."""
    if "\\" not in s:
        return s
    chars = list(s)
    last = len(chars) - 1
    for i, c in enumerate(chars):
        if c == "\\" and (i == last or chars[i + 1] in specials):
            chars[i] = "/"
    return "".join(chars)


def escape_key(s: str) -> str:
    """Escape a tag key, tag value or field key (see the module docstring for backslashes)."""
    s = _fix_backslashes(_clean(s), _KEY_SPECIALS)
    return s.replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")


def escape_measurement(s: str) -> str:
    """Escape a measurement name: ``,`` and space (``=`` is literal there)."""
    s = _fix_backslashes(_clean(s), _MEASUREMENT_SPECIALS)
    return s.replace(",", r"\,").replace(" ", r"\ ")


def escape_string(s: str) -> str:
    """Escape a string field value (without the surrounding quotes)."""
    return _clean(s).replace("\\", "\\\\").replace('"', '\\"')


class Series:
    """A precomputed measurement + tag set; reuse it for every point of that series.

    ``specs`` may be shared between series of one measurement (the training channel shares one per
    run), so that open fields are escaped and remembered once for all of them, not once per tag set."""

    __slots__ = ("measurement", "prefix", "schema", "specs")

    def __init__(
        self,
        schema: Measurement | None,
        measurement: str,
        tags: Mapping[str, str],
        specs: dict[str, tuple[str, str]] | None = None,
    ) -> None:
        self.schema = schema
        self.measurement = measurement
        parts = [escape_measurement(measurement)]
        for k in sorted(tags):
            v = tags[k]
            if v is None:
                continue
            v = str(v)
            if v == "":
                continue
            parts.append(f"{escape_key(k)}={escape_key(v)}")
        self.prefix = ",".join(parts)
        # field name -> ("escaped_key=", type code 'f'/'i'/'b'/'s'); open fields are added on first use
        self.specs: dict[str, tuple[str, str]] = {} if specs is None else specs
        if schema is not None and not self.specs:
            for f in schema.fields:
                self.specs[f.name] = (escape_key(f.name) + "=", f.type[0])


class Encoder:
    """Encodes points to line protocol and counts what it had to drop."""

    def __init__(self, precision: str = "ns", strict: bool = True) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
        self.precision = precision
        self._div = _NS_PER[precision]
        #: with ``strict``, fields not declared in the schema are dropped and counted
        self.strict = strict
        self.nonfinite_dropped = 0
        self.unknown_fields_dropped = 0
        self.bad_values_dropped = 0
        self.empty_points = 0
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}

    # -- series ---------------------------------------------------------------------------------
    def series(self, measurement: str, tags: Mapping[str, str]) -> Series:
        """The (cached) series for a measurement and tag set."""
        key = (measurement, tuple(sorted((k, str(v)) for k, v in tags.items() if v is not None)))
        s = self._series.get(key)
        if s is None:
            if len(self._series) > MAX_CACHED_SERIES:  # bounded: a runaway tag value must not grow memory forever
                self._series.clear()
            s = self._series[key] = Series(MEASUREMENTS.get(measurement), measurement, tags)
        return s

    # -- lines ----------------------------------------------------------------------------------
    def line(self, series: Series, fields: Mapping[str, Any], ts_ns: int) -> str | None:
        """One line (with trailing newline) for ``fields`` at ``ts_ns``, or ``None`` if no field survived.

        The hot path: a float field given a finite ``float`` or an ``int`` (written as ``7.0``)
        and an int field given an in-range ``int``
        (what the sources produce) cost one type check and one concatenation each;
        everything else goes through :meth:`_coerce`."""
        specs = series.specs
        parts: list[str] = []
        append = parts.append
        for name, value in fields.items():
            spec = specs.get(name)
            if spec is None:
                if value is None:
                    continue
                spec = self._new_spec(series, name, value)
                if spec is None:
                    continue
            keq, t = spec
            if t == "f":
                tv = type(value)
                if tv is float:
                    if value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
                        append(keq + repr(value))
                        continue
                elif tv is int and INT64_MIN <= value <= INT64_MAX:  # NVML hands out ints
                    append(f"{keq}{value}.0")
                    continue
            elif t == "i" and type(value) is int and INT64_MIN <= value <= INT64_MAX:
                append(f"{keq}{value}i")
                continue
            if value is not None:
                text = self._coerce(t, value)
                if text is not None:
                    append(keq + text)
        if not parts:
            self.empty_points += 1
            return None
        return f"{series.prefix} {','.join(parts)} {ts_ns // self._div}\n"

    def _coerce(self, t: str, value: Any) -> str | None:
        """A value of another Python type (or a non-finite float) as field type ``t``, or None (counted)."""
        try:
            if t == "f":
                v = float(value)
                if math.isfinite(v):
                    return repr(v)
                self.nonfinite_dropped += 1
                return None
            if t == "i":
                if type(value) is not int:
                    fv = float(value)
                    if not math.isfinite(fv):
                        self.nonfinite_dropped += 1
                        return None
                    value = int(fv)
                if INT64_MIN <= value <= INT64_MAX:
                    return f"{value}i"
                self.bad_values_dropped += 1
                return None
            if t == "s":
                return f'"{escape_string(str(value))}"'
            return "true" if value else "false"  # bool
        except (TypeError, ValueError, OverflowError):
            self.bad_values_dropped += 1
            return None

    def _new_spec(self, series: Series, name: str, value: Any) -> tuple[str, str] | None:
        schema = series.schema
        if schema is not None:
            t = schema.field_type(name)
        elif not self.strict:
            t = _python_type(value)
        else:
            t = None
        if t is None:
            self.unknown_fields_dropped += 1
            return None
        spec = (escape_key(name) + "=", t[0])
        if len(series.specs) < MAX_CACHED_FIELDS_PER_SERIES:
            series.specs[name] = spec
        return spec

    def encode(self, measurement: str, tags: Mapping[str, str], fields: Mapping[str, Any], ts_ns: int) -> str | None:
        """Convenience for cold paths: one point, no series reuse by the caller."""
        return self.line(self.series(measurement, tags), fields, ts_ns)

    def stats(self) -> dict[str, int]:
        return {
            "values_dropped_nonfinite": self.nonfinite_dropped,
            "fields_dropped_unknown": self.unknown_fields_dropped,
            "values_dropped_bad": self.bad_values_dropped,
            "points_empty": self.empty_points,
        }


def _python_type(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return None
