"""One-shot delivery (``gpulse upload``, ``gpulse demo``): the agent's sinks, retry policy, 413 splits and
dead letters, synchronously, with no spool."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from gpulse.delivery.buffer import batched
from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.sender import BatchSender, DeliveryStopped
from gpulse.sinks.base import Sink
from gpulse.sinks.errors import ErrorKind, WriteError

log = logging.getLogger("gpulse.delivery")


@dataclass
class DeliveryResult:
    written: int = 0
    rejected: int = 0
    failed: int = 0  # not delivered: the deadline passed, or a configuration error (401/403/404) stopped it
    requests: int = 0
    #: the configuration error that stopped delivery (when ``retry_config_errors`` is false)
    error: str | None = None


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
) -> DeliveryResult:
    """Push ``lines`` to ``sink`` synchronously, in batches, with the agent's retry policy.

    Transient failures are retried until ``deadline_s`` (None: forever); what is still undelivered
    then is counted as ``failed``. A configuration error (401/403/404) stops at once (a person must fix
    it; ``error`` says what) unless ``retry_config_errors``. Rejected lines go to ``dead_letter_path``.
    Reads ``lines`` lazily, one batch at a time, so a large file needs little memory."""
    stop = threading.Event()
    timer = threading.Timer(deadline_s, stop.set) if deadline_s is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    out = DeliveryResult()

    def on_retry(error: WriteError, delay: float) -> None:
        if error.kind is ErrorKind.CONFIG and not retry_config_errors:
            out.error = f"{sink.describe()}: {error.describe()}"
            log.error("%s", out.error)
            stop.set()
        else:
            log.warning("%s: %s; retrying in %.1f s", sink.describe(), error.describe(), delay)

    sender = BatchSender(sink, policy or RetryPolicy(), DeadLetter(dead_letter_path), stop=stop, on_retry=on_retry)

    def push(batch: list[str]) -> None:
        if stop.is_set():
            out.failed += len(batch)
            return
        try:
            r = sender.send(batch)
        except DeliveryStopped:
            out.failed += len(batch)
            return
        out.written += r.written
        out.rejected += r.rejected
        out.requests += r.requests

    try:
        for batch in batched((line if line.endswith("\n") else line + "\n" for line in lines), max_lines, max_bytes):
            push(batch)
    finally:
        if timer is not None:
            timer.cancel()
    return out
