"""The limits of line protocol, defined once: the encoder, the parser and the channel's validation share them.

* Integers (``i`` fields) and timestamps are signed 64-bit in InfluxDB (1.x and 2.x); a value outside
  is refused by the server's parser, so the encoder drops it (counted) and the parser rejects it.
* The encoder caches one :class:`~gpulse.lineprotocol.encode.Series` per (measurement, tag set) and
  the open fields of each series it has seen; both caches are bounded so that a runaway tag value or
  field name cannot grow the agent's memory forever.
"""

from __future__ import annotations

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: series the encoder keeps; beyond it the cache starts again (series are rebuilt on use)
MAX_CACHED_SERIES = 100_000
#: open field names (``log_*``, ``phase_*``) whose escaped key a series keeps
MAX_CACHED_FIELDS_PER_SERIES = 1024
