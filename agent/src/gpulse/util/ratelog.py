"""Log a recurring problem loudly, but at most once per period per key (an outage must not flood logs)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, period_s: float = 60.0) -> None:
        self.logger = logger
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def log(self, key: str, level: int, msg: str, *args: Any) -> bool:
        """Log ``msg`` unless ``key`` was logged within the period; returns whether it was logged."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.period_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg += f" ({suppressed} similar messages suppressed)"
        self.logger.log(level, msg, *args)
        return True
