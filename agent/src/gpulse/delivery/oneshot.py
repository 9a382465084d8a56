"""One-shot delivery (``gpulse upload``, ``gpulse demo``): the agent's sinks, retry policy, 413 splits and
dead letters, synchronously, with no spool.

A person is waiting, so what will not get better stops at once instead of being retried until the
deadline: a configuration error (401/403/404, a missing retention policy: the error says which and
what to do) and, before anything was delivered, a server that cannot be reached at all (connection
refused, a host name that does not resolve). What may pass (an outage in the middle, 5xx, 429, a
timeout) is retried until the deadline, and every retry says until when.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpulse.delivery.buffer import batched
from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.sender import BatchSender, DeliveryStopped
from gpulse.influx.http import Failure
from gpulse.sinks.base import Sink
from gpulse.sinks.errors import ErrorKind, WriteError

log = logging.getLogger("gpulse.delivery")

#: no answer at all: nothing to wait for when nothing has been delivered yet
UNREACHABLE = frozenset({Failure.REFUSED, Failure.UNRESOLVED})


@dataclass
class DeliveryResult:
    written: int = 0
    rejected: int = 0
    failed: int = 0  # not delivered: the deadline passed, or an error that will not get better stopped it
    requests: int = 0
    #: the error that stopped delivery at once (configuration, or unreachable from the start)
    error: str | None = None
    #: the deadline passed while retrying; ``last_error`` says what was being retried
    gave_up: bool = False
    last_error: str | None = None

    @property
    def done(self) -> int:
        """Lines settled one way or another (written, rejected or not delivered)."""
        return self.written + self.rejected + self.failed


def deliver_batches(
    sink: Sink,
    lines: Iterable[str],
    *,
    max_lines: int = 5000,
    max_bytes: int = 4 << 20,
    policy: RetryPolicy | None = None,
    dead_letter_path: str | os.PathLike[str] | None = None,
    deadline_s: float | None = None,
    retry_config_errors: bool = False,
    progress: Callable[[DeliveryResult], None] | None = None,
    will_not_heal: Callable[[Failure], bool] = UNREACHABLE.__contains__,
) -> DeliveryResult:
    """Push ``lines`` to ``sink`` synchronously, in batches, with the agent's retry policy.

    Transient failures are retried until ``deadline_s`` (None: forever); then ``gave_up`` is set. A
    configuration error stops at once (a person must fix it; ``error`` says what) unless
    ``retry_config_errors``; so does, before anything was delivered, a failure ``will_not_heal`` names
    (default: connection refused, a name that does not resolve).
    Rejected lines go to ``dead_letter_path``. ``progress`` is called with the running totals after
    every batch (a caller may end ``lines`` early once ``error`` or ``gave_up`` is set). Reads ``lines``
    lazily, one batch at a time, so a large file needs little memory."""
    stop = threading.Event()
    timer = threading.Timer(deadline_s, stop.set) if deadline_s is not None else None
    ends = time.monotonic() + deadline_s if deadline_s is not None else None
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + deadline_s)) if deadline_s is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    out = DeliveryResult()

    def on_retry(error: WriteError, delay: float) -> None:
        out.last_error = error.describe()
        if error.kind is ErrorKind.CONFIG and not retry_config_errors:
            out.error = f"{sink.describe()}: {error.describe()}"
        elif error.failure is not None and will_not_heal(error.failure) and out.written == 0:
            out.error = f"{sink.describe()}: {error.describe()}; nothing was sent"
        if out.error is not None:
            log.error("%s", out.error)
            stop.set()
        elif ends is not None and time.monotonic() + delay >= ends:  # no time left for another try
            log.warning(
                "%s: %s; the next try (in %.1f s) would come after the deadline (%s): giving up",
                sink.describe(),
                out.last_error,
                delay,
                until,
            )
            stop.set()
        elif until is not None:
            log.warning(
                "%s: %s; retrying in %.1f s, until %s (deadline %g s)",
                sink.describe(),
                out.last_error,
                delay,
                until,
                deadline_s,
            )
        else:
            log.warning("%s: %s; retrying in %.1f s", sink.describe(), out.last_error, delay)

    sender = BatchSender(sink, policy or RetryPolicy(), DeadLetter(dead_letter_path), stop=stop, on_retry=on_retry)

    def push(batch: list[str]) -> None:
        if stop.is_set():
            out.failed += len(batch)
        else:
            try:
                r = sender.send(batch)
            except DeliveryStopped:
                out.failed += len(batch)
            else:
                out.written += r.written
                out.rejected += r.rejected
                out.requests += r.requests
        out.gave_up = stop.is_set() and out.error is None
        if progress is not None:
            progress(out)

    try:
        for batch in batched((line if line.endswith("\n") else line + "\n" for line in lines), max_lines, max_bytes):
            push(batch)
    finally:
        if timer is not None:
            timer.cancel()
    return out
