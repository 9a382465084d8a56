"""Polling for a condition in tests: one helper instead of a copy per test module."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(cond: Callable[[], Any], timeout: float = 5.0, every: float = 0.02) -> bool:
    """Whether ``cond()`` became true within ``timeout`` s (polled every ``every`` s; checked once more at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return bool(cond())


def wait_until(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition", every: float = 0.1) -> Any:
    """The first true value of ``predicate()``; fails the test if none comes within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
