"""Batched, ordered, lossless delivery of line protocol to every sink.

::

    submit(lines) ─▶ LineBuffer ─(cut by lines/bytes, or every flush interval)─▶ one SinkWorker per sink
                     (never blocks)                                              │ memory queue ─▶ send
                                                                                 └ spool (disk) ─▶ replay

Per sink, a :class:`~gpulse.delivery.worker.SinkWorker` sends one request at a time, oldest first,
and spools what waits too long (see its module).

Tickets: :meth:`Delivery.submit` returns the cumulative number of lines submitted;
:attr:`Delivery.durable_upto` is the highest ticket up to which every line was taken by every sink
(written, or dead-lettered as refused for good) or fsynced to its spool, so the training channel can
ack. A line dropped (a memory cap, a full disk at the shutdown deadline) is never covered: from the
first one on, ``durable_upto`` stays where it is for the rest of the process, and the training
clients keep what they sent in their own files.

:meth:`Delivery.close` returns within its timeout whatever the sinks do: a sink thread stuck in a
request is not waited for (its batch is on disk by then, or counted as dropped).

Counters (:meth:`Delivery.stats`) add up over sinks (``spool_damaged_lines``/``_bytes``: what
replaying met as torn or corrupt and skipped, also counted in ``lines_dropped``), except ``lines_written``,
``lines_replayed``, ``write_latency_ms`` and the last-write times, which describe the database
sinks (all sinks when there is none, e.g. ``--record`` only).

For a one-shot push (``gpulse upload``) use :func:`gpulse.delivery.oneshot.deliver_batches`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpulse.delivery.buffer import LineBuffer
from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.spool import Spool, SpoolSummary, claim_spool
from gpulse.delivery.worker import SinkWorker
from gpulse.sinks.base import Sink
from gpulse.util.files import private_dir

log = logging.getLogger("gpulse.delivery")

__all__ = ["Delivery"]


def _close_quietly(sink: Sink) -> None:
    try:
        sink.close()
    except Exception:  # closing must not raise at shutdown
        log.debug("closing %s failed", sink.describe(), exc_info=True)


class Delivery:
    def __init__(
        self,
        sinks: Sequence[Sink],
        *,
        spool_dir: str | Path | None,
        spool_max_bytes: int = 1 << 30,
        max_lines: int = 5000,
        max_bytes: int = 4 << 20,
        flush_interval: float = 1.0,
        dead_letter_path: str | Path | None = None,
        policy: RetryPolicy | None = None,
        memory_max_bytes: int = 64 << 20,
        replay_spool_elsewhere: bool = False,
    ) -> None:
        """``replay_spool_elsewhere``: replay data spooled for another destination too (see
        :func:`~gpulse.delivery.spool.claim_spool`); else it is kept aside, and listed in :attr:`held`."""
        if not sinks:
            raise ValueError("Delivery needs at least one sink")
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique (they name spool directories): {names}")
        self.sinks = list(sinks)
        self.flush_interval = float(flush_interval)
        self.epoch = random.getrandbits(62) | 1
        self._buffer = LineBuffer(max_lines, max_bytes, memory_max_bytes, epoch=self.epoch)
        self._stop = threading.Event()
        if spool_dir is not None:
            private_dir(spool_dir, must_own=False)  # spooled lines may be private; a parent like /tmp is fine
            if dead_letter_path is None:
                dead_letter_path = Path(spool_dir) / "dead-letter.lp"
        self.dead_letter = DeadLetter(dead_letter_path)
        policy = policy or RetryPolicy()
        self.spools: list[Spool] = []
        self.workers: list[SinkWorker] = []
        #: spools kept aside because their data was meant for another destination (not replayed)
        self.held: list[SpoolSummary] = []
        for sink in self.sinks:
            spool = None
            if spool_dir is not None:
                self.held += claim_spool(spool_dir, sink.name, sink.describe(), replay_elsewhere=replay_spool_elsewhere)
                spool = Spool(Path(spool_dir) / sink.name, max_bytes=max(spool_max_bytes // len(self.sinks), 4096))
                self.spools.append(spool)
            self.workers.append(
                SinkWorker(
                    sink,
                    spool,
                    policy,
                    self.dead_letter,
                    epoch=self.epoch,
                    flush_interval=self.flush_interval,
                    memory_max_bytes=memory_max_bytes,
                    stop=self._stop,
                )
            )
        self._wake = threading.Condition()
        self._cut_now = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="gpulse-delivery", daemon=True)
        self._started = False

    # -- contract ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the delivery threads; each sink replays its spool (from an earlier run) first."""
        if self._started:
            return
        self._started = True
        for w in self.workers:
            if w.spool is not None and w.spool.has_data():
                log.info("%s: replaying %d bytes spooled earlier", w.sink.describe(), w.spool.bytes)
            w.thread.start()
        self._thread.start()

    def submit(self, lines: Sequence[str]) -> int:
        """Queue ``lines`` (each ending in a newline); never blocks. Returns the ticket of the last line."""
        if not lines:
            return self._buffer.ticket
        ticket, full = self._buffer.add(lines)
        if full:
            with self._wake:
                self._wake.notify()
        return ticket

    @property
    def durable_upto(self) -> int:
        """The highest ticket up to which every line was accepted by every sink or fsynced to its spool.

        A line dropped for good (memory caps; the spool's size cap drops only what was fsynced, i.e.
        acknowledged already) holds it back for the rest of this process: an ack is never a lie."""
        upto = min(min(w.durable_upto() for w in self.workers), self._buffer.cut_upto)
        lost = self._buffer.lost_from
        return upto if lost is None else min(upto, lost)

    def flush(self, timeout: float) -> bool:
        """Deliver everything submitted so far; True if it was within ``timeout`` seconds."""
        target = self._buffer.ticket
        deadline = time.monotonic() + timeout
        with self._wake:
            self._cut_now = True
            self._wake.notify()
        while True:
            if self._buffer.cut_upto >= target and all(w.done_upto() >= target for w in self.workers):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def close(self, timeout: float) -> None:
        """Stop within ``timeout`` seconds whatever the sinks do: deliver what can be delivered, spool
        (fsync) the rest, and return without waiting for a sink stuck in a request."""
        start = time.monotonic()
        deadline = start + max(timeout, 0.0)
        # the last part of the time is for spooling what is left and closing the sinks
        settle_until = deadline - min(1.0, 0.25 * max(timeout, 0.0))
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread.is_alive():  # its last cut hands everything submitted to the workers (quick)
            self._thread.join(max(settle_until - time.monotonic(), 0.1))
        else:  # never started: cut and hand over what was submitted
            self._cut_and_offer(force=True)
        target = self._buffer.ticket
        while time.monotonic() < settle_until:
            if all(w.settled() or w.done_upto() >= target for w in self.workers):
                break
            time.sleep(0.005)
        self._stop.set()
        for w in self.workers:
            w.shutdown()
        for w in self.workers:
            if w.thread.is_alive():
                w.thread.join(max(deadline - time.monotonic(), 0.0))
        for s in self.spools:
            s.close()
        closers = [
            threading.Thread(target=_close_quietly, args=(sink,), name=f"gpulse-close-{sink.name}", daemon=True)
            for sink in self.sinks
        ]
        for t in closers:
            t.start()
        for t in closers:
            t.join(max(deadline - time.monotonic(), 0.05))
        stuck = [w.sink.describe() for w in self.workers if w.thread.is_alive()]
        if stuck:
            log.warning("shutdown deadline (%.1f s) reached while a request was still going on: %s", timeout, stuck)

    def stats(self) -> dict[str, int | float | None]:
        db = [w for w in self.workers if w.sink.is_database] or self.workers
        last_mono = max((w.sender.last_write_mono for w in db if w.sender.last_write_mono is not None), default=None)
        last_unix = max((w.sender.last_write_unix for w in db if w.sender.last_write_unix is not None), default=None)
        latency = [w.sender.last_latency_ms for w in db if w.sender.last_latency_ms is not None]
        buffered = self._buffer.lines + sum(w.memory_lines() for w in self.workers)
        return {
            "lines_written": sum(w.written for w in db),
            "lines_spooled": sum(s.lines_spooled for s in self.spools),
            "lines_replayed": sum(w.replayed for w in db),
            "lines_dropped": self._buffer.dropped
            + sum(w.dropped for w in self.workers)
            + sum(s.lines_dropped for s in self.spools),
            "lines_rejected": sum(w.rejected for w in self.workers),
            "spool_bytes": sum(s.bytes for s in self.spools),
            "spool_damaged_lines": sum(s.damaged_lines for s in self.spools),
            "spool_damaged_bytes": sum(s.damaged_bytes for s in self.spools),
            "buffer_lines": buffered,
            "write_latency_ms": max(latency) if latency else None,
            "last_write_age_s": (time.monotonic() - last_mono) if last_mono is not None else None,
            "last_write_unix": last_unix,
        }

    # -- the delivery thread ------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic() + self.flush_interval
        while True:
            with self._wake:
                timeout = next_tick - time.monotonic()
                if timeout > 0 and not self._cut_now and not self._closing:
                    self._wake.wait(timeout)
                force = self._cut_now or self._closing or time.monotonic() >= next_tick
                self._cut_now = False
                closing = self._closing
            self._cut_and_offer(force)
            now = time.monotonic()
            if now >= next_tick:
                for w in self.workers:
                    w.tick()
                next_tick = now + self.flush_interval
            if closing:
                return

    def _cut_and_offer(self, force: bool) -> None:
        for batch in self._buffer.cut(force=force):
            for w in self.workers:
                w.offer(batch)
