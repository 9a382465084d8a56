"""Deliver one batch to one sink, completely: retries, 413 splits, isolation of rejected lines.

The unit of work is a queue of *pieces* of the batch. A piece that fails transiently is retried
(tenacity, :class:`~gpulse.delivery.retry.RetryPolicy`) until it succeeds or delivery stops; pieces already
written are never re-sent, so counts stay exact. A rejected piece (400/422) is never retried
as is: the lines the server named are dead-lettered and the rest re-sent; when the server names
none, the piece is bisected until the bad lines stand alone. Re-sending good lines is harmless
(same series and timestamp overwrite), and every rejection shrinks the work, so this ends; a budget
of isolation requests per batch bounds the cost of a batch full of bad lines. A partial write
(InfluxDB 3's ``write_lp``) wrote the rest already: the bad lines are dead-lettered, each with the
server's reason, and the others count as written without a second request.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.sinks.base import Sink
from gpulse.sinks.errors import ErrorKind, WriteError


class DeliveryStopped(Exception):
    """Delivery was stopped (shutdown deadline) before the batch was entirely delivered."""


@dataclass
class SendResult:
    written: int = 0
    rejected: int = 0
    requests: int = 0


class BatchSender:
    def __init__(
        self,
        sink: Sink,
        policy: RetryPolicy,
        dead_letter: DeadLetter,
        *,
        stop: threading.Event | None = None,
        on_retry: Callable[[WriteError, float], None] | None = None,
        isolation_budget: int = 256,
    ) -> None:
        self.sink = sink
        self.policy = policy
        self.dead_letter = dead_letter
        self.stop = stop or threading.Event()
        self.on_retry = on_retry
        self.isolation_budget = isolation_budget
        #: true while waiting out a backoff (the sink is paused)
        self.sleeping = False
        self.last_latency_ms: float | None = None
        self.last_write_unix: float | None = None
        self.last_write_mono: float | None = None

    def send(self, lines: Sequence[str]) -> SendResult:
        """Deliver ``lines``; raises :class:`DeliveryStopped` if stopped first (written pieces stay written)."""
        result = SendResult()
        work: deque[list[str]] = deque([list(lines)])
        budget = self.isolation_budget
        while work:
            piece = work[0]
            try:
                self._write_retrying(piece, result)
            except WriteError as e:
                work.popleft()
                if e.kind is ErrorKind.TOO_LARGE and len(piece) > 1:
                    mid = len(piece) // 2
                    work.extendleft([piece[mid:], piece[:mid]])
                    continue
                if e.partial:  # the good lines are written already: no isolation needed
                    self._reject_partial(piece, e, result)
                    continue
                if e.kind is ErrorKind.TOO_LARGE or len(piece) == 1 or budget <= 0:
                    self._reject(piece, e, result)
                    continue
                budget -= 1
                bad = sorted(i for i in e.bad_lines if 0 <= i < len(piece))
                if bad:
                    self._reject([piece[i] for i in bad], e, result)
                    bad_set = set(bad)
                    good = [line for i, line in enumerate(piece) if i not in bad_set]
                    if good:
                        work.appendleft(good)
                else:
                    mid = len(piece) // 2
                    work.extendleft([piece[mid:], piece[:mid]])
                continue
            work.popleft()
            result.written += len(piece)
        return result

    def _reject(self, lines: list[str], e: WriteError, result: SendResult) -> None:
        self.dead_letter.write(lines, e.describe())
        result.rejected += len(lines)

    def _reject_partial(self, piece: list[str], e: WriteError, result: SendResult) -> None:
        """The server kept every line of ``piece`` but those in ``e.line_errors``: each of those is
        dead-lettered under its own reason."""
        for i, reason in sorted(e.line_errors.items()):
            self.dead_letter.write([piece[i]], f"{e.describe()}: line {i + 1}: {reason}")
        result.rejected += len(e.line_errors)
        result.written += len(piece) - len(e.line_errors)

    def _write_retrying(self, piece: list[str], result: SendResult) -> None:
        """One piece, retried while the error is retryable; stopping turns the last error into DeliveryStopped."""
        try:
            self._attempts(piece, result)
        except WriteError as e:
            if e.retryable:
                raise DeliveryStopped() from e
            raise

    def _attempts(self, piece: list[str], result: SendResult) -> None:
        """The first attempt is made straight away: most writes succeed, and tenacity's controller costs
        more than the write's own Python. A retryable failure hands over to tenacity, whose first attempt
        answers with that failure at once, so the waits, ``before_sleep`` and the stop are tenacity's."""
        if self.stop.is_set():
            raise DeliveryStopped()
        try:
            self._write(piece, result)
            return
        except WriteError as e:
            if not e.retryable:
                raise
            first: WriteError | None = e
        for attempt in self.policy.retrying(self.stop, before_sleep=self._before_sleep, sleep=self._sleep):
            with attempt:
                if first is not None:
                    failed, first = first, None
                    raise failed
                if self.stop.is_set():
                    raise DeliveryStopped()
                self._write(piece, result)

    def _write(self, piece: list[str], result: SendResult) -> None:
        result.requests += 1
        t0 = time.monotonic()
        self.sink.write(piece)
        self.last_latency_ms = (time.monotonic() - t0) * 1000.0
        self.last_write_mono = time.monotonic()
        self.last_write_unix = time.time()

    def _before_sleep(self, error: WriteError, delay: float) -> None:
        if self.on_retry is not None:
            self.on_retry(error, delay)

    def _sleep(self, seconds: float) -> None:
        self.sleeping = True
        try:
            self.stop.wait(seconds)
        finally:
            self.sleeping = False
