"""Count a recurring problem and log it once: an outage or a stream of bad input must not flood the log.

One helper for every "count it, say it once" in the agent: each occurrence is counted by key; the
first is logged, later ones at most once per ``period_s`` (with how many were not logged), or never
again when ``period_s`` is None.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class CountedLog:
    def __init__(self, logger: logging.Logger, period_s: float | None = 60.0) -> None:
        self.logger = logger
        self.period_s = period_s
        #: occurrences per key, logged or not
        self.counts: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def log(self, key: str, level: int, msg: str, *args: Any) -> bool:
        """Count one occurrence of ``key``; log ``msg`` if it is the first, or the period has passed since
        ``key`` was last logged. Returns whether it was logged."""
        now = time.monotonic()
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            last = self._last.get(key)
            if last is not None and (self.period_s is None or now - last < self.period_s):
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg += f" ({suppressed} similar messages suppressed)"
        self.logger.log(level, msg, *args)
        return True
