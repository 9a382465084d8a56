"""What InfluxDB stores for a text once gpulse's encoder has written it: the rules of
``gpulse.lineprotocol.encode``'s module docstring, stated here on their own (a regular expression, not
the encoder's code), so that tests hold the encoder to them and the round-trip test holds InfluxDB to them.
"""

from __future__ import annotations

import re

_KEY_BACKSLASH = re.compile(r"\\(?=[,= ]|\Z)")  # one InfluxDB reads as an escape (or a dangling one)


def cleaned(s: str) -> str:
    """A string field value: newlines and carriage returns become spaces, lone surrogates U+FFFD."""
    s = re.sub("\r\n|\n|\r", " ", s)
    return re.sub("[\ud800-\udfff]", "\ufffd", s)


def stored_key(s: str) -> str:
    """A tag value, tag key or field key (and a measurement name: there ``=`` counts as special too)."""
    return _KEY_BACKSLASH.sub("/", cleaned(s))
