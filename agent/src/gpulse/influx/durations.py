"""InfluxDB's duration literals (``30d``, ``720h0m0s``, ``INF``) in nanoseconds: the one parser every command shares."""

from __future__ import annotations

import re

_UNITS_NS = {"ns": 1, "u": 1_000, "µ": 1_000, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9}
_UNITS_NS |= {"h": 3600 * 10**9, "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|u|µ|ms|s|m|h|d|w)")


def parse_duration(text: str) -> int:
    """Nanoseconds of an InfluxQL/Go/Flux duration (``30d``, ``720h0m0s``); 0 for ``INF``/``0``/``0s``."""
    t = text.strip()
    if t.upper() == "INF" or t in ("0", ""):
        return 0
    pos, total = 0, 0
    for m in _DURATION.finditer(t):
        if m.start() != pos:
            break
        total += int(float(m.group(1)) * _UNITS_NS[m.group(2).replace("µs", "us")])
        pos = m.end()
    if pos != len(t) or pos == 0:
        raise ValueError(f"not a duration: {text!r} (examples: 30d, 400d, 12h, INF)")
    return total
