"""How long to wait before asking a database again, by the kind of its last answer.

Every sink turns its failures into one :class:`~gpulse.sinks.errors.WriteError` whose ``kind``
decides what delivery does:

========== =============================================== ========================================
kind       answers                                         delivery
========== =============================================== ========================================
transient  connection errors, timeouts, 408, other 5xx     retry with backoff; spool meanwhile
throttled  429, 502, 503, 504                              pause the sink for Retry-After (capped),
                                                           or the backoff when there is none
too_large  413                                             split the batch in halves; one line
                                                           still too large is dead-lettered
rejected   400, 422, other 4xx, 500 "field type conflict"  never retried: isolate the bad lines
                                                           (named by the server, else bisect),
                                                           dead-letter them, deliver the rest
config     401, 403, 404                                   a configuration error: log loudly (once
                                                           a minute), keep the data, back off
========== =============================================== ========================================

A 500 for a field type conflict (InfluxDB 2.0.x) is a rejection, not an outage: retrying it
would block the queue forever (telegraf #11005). The backoff is exponential with "equal
jitter": attempt *n* waits uniformly in ``[b/2, b]`` with ``b = min(max_delay, initial·2^(n-1))``,
so retries never hammer (lower bound) nor synchronise across agents (jitter).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from gpulse.sinks.errors import RETRY_AFTER_CAP_S, ErrorKind, WriteError


# -- waiting --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Backoff parameters; :meth:`retrying` builds the tenacity controller one sink uses."""

    initial: float = 0.5
    max_delay: float = 60.0
    #: configuration errors (401/403/404) wait at least this long: a human has to act
    config_min_delay: float = 5.0
    retry_after_cap: float = RETRY_AFTER_CAP_S

    def __post_init__(self) -> None:
        half_init, half_max = self.initial / 2, self.max_delay / 2
        backoff = tenacity.wait_exponential(multiplier=half_init, max=half_max) + tenacity.wait_random_exponential(
            multiplier=half_init, max=half_max
        )
        object.__setattr__(self, "_backoff", backoff)

    def backoff(self, attempt: int) -> float:
        """The jittered delay after failed attempt number ``attempt`` (1-based), within ``[b/2, b]``."""
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return self._backoff(state)  # type: ignore[attr-defined]

    def delay_for(self, error: BaseException | None, attempt: int) -> float:
        """How long to wait after ``error`` on attempt ``attempt``: Retry-After wins when the server sent one."""
        delay = self.backoff(attempt)
        if isinstance(error, WriteError):
            if error.retry_after is not None:
                return min(error.retry_after, self.retry_after_cap)
            if error.kind is ErrorKind.CONFIG:
                return max(delay, self.config_min_delay)
        return delay

    def retrying(
        self,
        stop: threading.Event,
        before_sleep: Callable[[WriteError, float], None] | None = None,
        sleep: Callable[[float], Any] | None = None,
    ) -> tenacity.Retrying:
        """Retries retryable :class:`WriteError` until ``stop`` is set; the last error is re-raised then."""

        def _wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return self.delay_for(exc, state.attempt_number)

        def _before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if before_sleep is not None and isinstance(exc, WriteError):
                before_sleep(exc, state.upcoming_sleep)

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, WriteError) and e.retryable),
            wait=_wait,
            stop=tenacity.stop_when_event_set(stop),
            sleep=sleep if sleep is not None else stop.wait,
            before_sleep=_before_sleep,
            reraise=True,
        )
