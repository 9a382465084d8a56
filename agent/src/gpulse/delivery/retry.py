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
would block the queue forever (telegraf #11005). The backoff is exponential with "full jitter"
(AWS Architecture Blog, "Exponential Backoff And Jitter"): attempt *n* waits uniformly in
``[0, b]`` with ``b = min(max_delay, initial·2^(n-1))``. A fleet loses its database at one moment;
full jitter spreads the agents' returns, and so their spool replays, over the whole backoff, where
"equal jitter" (``[b/2, b]``) bunched them: ``agent/tests/agent/test_fleet.py`` measures the peak
write rate after a 60 s outage of one database under 32 agents (figures in ``docs/capacity.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from gpulse.sinks.errors import RETRY_AFTER_CAP_S, ErrorKind, WriteError


# -- waiting --------------------------------------------------------------------------------------
class wait_retry_after_or_backoff(tenacity.wait.wait_base):
    """Retry-After, else exponential backoff with full jitter: tenacity's wait strategy for a sink.

    The server's ``Retry-After`` (capped) wins; else attempt *n* waits uniformly in ``[0, b]``
    (tenacity's ``wait_random_exponential``); a configuration error waits at least ``config_min_delay``."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.backoff = tenacity.wait_random_exponential(multiplier=policy.initial, max=policy.max_delay)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None and outcome.failed else None
        if isinstance(error, WriteError) and error.retry_after is not None:
            return min(error.retry_after, self.policy.retry_after_cap)
        delay = self.backoff(retry_state)
        if isinstance(error, WriteError) and error.kind is ErrorKind.CONFIG:
            return max(delay, self.policy.config_min_delay)
        return delay


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff parameters; :meth:`retrying` builds the tenacity controller one sink uses."""

    initial: float = 0.5
    max_delay: float = 60.0
    #: configuration errors (401/403/404) wait at least this long: a human has to act
    config_min_delay: float = 5.0
    retry_after_cap: float = RETRY_AFTER_CAP_S

    def retrying(
        self,
        stop: threading.Event,
        before_sleep: Callable[[WriteError, float], None] | None = None,
        sleep: Callable[[float], Any] | None = None,
    ) -> tenacity.Retrying:
        """Retries retryable :class:`WriteError` until ``stop`` is set; the last error is re-raised then."""

        def _before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if before_sleep is not None and isinstance(exc, WriteError):
                before_sleep(exc, state.upcoming_sleep)

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, WriteError) and e.retryable),
            wait=wait_retry_after_or_backoff(self),
            stop=tenacity.stop_when_event_set(stop),
            sleep=sleep if sleep is not None else stop.wait,
            before_sleep=_before_sleep,
            reraise=True,
        )
