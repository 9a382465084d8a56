"""Failures inside gpulse never reach the training loop: they are counted and logged once per cause."""

from __future__ import annotations

import threading

LOGGER_NAME = "gpulse.training"


class Guard:
    """Counts errors by cause and logs the first of each cause (a warning), never raising."""

    __slots__ = ("_lock", "counts")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def report(self, cause: str, exc: BaseException | None = None, detail: str = "") -> None:
        """Count one failure of ``cause``; the first one is logged with its exception."""
        with self._lock:
            n = self.counts.get(cause, 0) + 1
            self.counts[cause] = n
        if n == 1:
            try:
                import logging

                text = f"gpulse: {cause}" + (f": {detail}" if detail else "")
                if exc is not None:
                    text += f": {type(exc).__name__}: {exc}"
                logging.getLogger(LOGGER_NAME).warning("%s (further occurrences are only counted)", text)
            except Exception:  # logging itself failed (closed stream at exit): nothing left to do
                pass
