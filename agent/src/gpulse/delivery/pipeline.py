"""Batched, ordered, lossless delivery of line protocol to every sink.

::

    submit(lines) ─▶ LineBuffer ─(cut by lines/bytes, or every flush interval)─▶ one SinkWorker per sink
                     (never blocks)                                              │ memory queue ─▶ send
                                                                                 └ spool (disk) ─▶ replay

Per sink, one thread sends one request at a time, oldest first. A batch waits in memory only
while the sink keeps up: as soon as a send fails, or a batch (or the request in flight) has waited
longer than one flush interval, the in-flight batch and everything queued behind it are appended
to that sink's spool (fsynced), and new batches go behind them until the spool is drained, so the
order never changes and a SIGKILL loses at most the last flush interval. A spool left by an earlier
run is replayed first, while new samples keep flowing behind it.

Tickets: :meth:`Delivery.submit` returns the cumulative number of lines submitted;
:attr:`Delivery.durable_upto` is the highest ticket every sink has either finished (written,
dead-lettered, or dropped and counted) or fsynced to its spool, so the training channel can ack.

Counters (:meth:`Delivery.stats`) add up over sinks, except ``lines_written``,
``lines_replayed``, ``write_latency_ms`` and the last-write times, which describe the database
sinks (all sinks when there is none, e.g. ``--record`` only).

For a one-shot push (``gpulse upload``) use :func:`deliver_batches`: the same sinks, retry policy,
413 splits and dead letters, synchronously, with no spool.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulse.delivery.buffer import Batch, LineBuffer
from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.sender import BatchSender, DeliveryStopped, SendResult
from gpulse.delivery.spool import Spool
from gpulse.influx.connection import Connection
from gpulse.sinks.base import Sink
from gpulse.sinks.errors import ErrorKind, WriteError
from gpulse.sinks.factory import build_sinks as _build_sinks
from gpulse.util.ratelog import RateLimitedLog

log = logging.getLogger("gpulse.delivery")

__all__ = ["Delivery", "DeliveryResult", "build_sinks", "deliver_batches"]


def build_sinks(conn: Connection | None, record_path: str | None) -> list[Sink]:
    """The sinks for a connection (``None`` or no URL: recording only) and an optional ``--record`` file."""
    return _build_sinks(conn, record_path)


def _private_dir(path: Path) -> None:
    """Create ``path`` 0700 (spooled lines may be private), tightening an existing one we own."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, 0o700)


class SinkWorker:
    """One sink's queue, spool and delivery thread."""

    def __init__(
        self,
        sink: Sink,
        spool: Spool | None,
        policy: RetryPolicy,
        dead_letter: DeadLetter,
        *,
        epoch: int,
        flush_interval: float,
        memory_max_bytes: int,
        stop: threading.Event,
    ) -> None:
        self.sink = sink
        self.spool = spool
        self.epoch = epoch
        self.flush_interval = flush_interval
        self.memory_max_bytes = memory_max_bytes
        self.stop = stop
        self.cv = threading.Condition()
        self.mem: deque[Batch] = deque()
        self.mem_bytes = 0
        self.inflight: Batch | None = None
        self.inflight_since = 0.0
        self.inflight_pos: list[tuple[int, int]] | None = None  # its copy's records in the spool, if it has one
        self.spool_mode = spool is not None and spool.has_data()
        #: spooled by an earlier run and not yet replayed: it comes before anything of ours
        self.backlog = self.spool_mode
        self.offered_upto = 0
        self._done_upto = 0
        self.closing = False
        self.written = 0
        self.replayed = 0
        self.rejected = 0
        self.dropped = 0
        self.retries = 0
        self.sender = BatchSender(sink, policy, dead_letter, stop=stop, on_retry=self._on_retry)
        self._log = RateLimitedLog(log)
        self.thread = threading.Thread(target=self._run, name=f"gpulse-sink-{sink.name}", daemon=True)

    # -- called by the delivery thread ----------------------------------------------------------
    def offer(self, batch: Batch) -> None:
        with self.cv:
            self.offered_upto = batch.end
            if self.spool is None:
                self.mem.append(batch)
                self.mem_bytes += batch.nbytes
                while self.mem_bytes > self.memory_max_bytes and len(self.mem) > 1:
                    old = self.mem.popleft()
                    self.mem_bytes -= old.nbytes
                    self.dropped += len(old)
                    self._log.log(
                        f"mem-{self.sink.name}",
                        logging.WARNING,
                        "%s is behind and there is no spool: dropped %d old lines (memory cap %d bytes)",
                        self.sink.describe(),
                        len(old),
                        self.memory_max_bytes,
                    )
            elif self.spool_mode or self.spool.has_data() or self._stalled(time.monotonic()):
                self._spill_locked()
                self._append_locked(batch)
            else:
                self.mem.append(batch)
                self.mem_bytes += batch.nbytes
            self.cv.notify_all()

    def tick(self) -> None:
        """Once per flush interval: spool what has waited too long (the SIGKILL bound)."""
        with self.cv:
            if self.spool is not None and not self.spool_mode and self._stalled(time.monotonic()):
                self._spill_locked()

    def _stalled(self, now: float) -> bool:
        if self.inflight is not None and self.inflight_pos is None and now - self.inflight_since > self.flush_interval:
            return True
        return bool(self.mem) and now - self.mem[0].cut_at > self.flush_interval

    def _append_locked(self, batch: Batch) -> None:
        assert self.spool is not None
        stored = self.spool.append(batch.lines, epoch=batch.epoch, end_ticket=batch.end)
        self.dropped += len(batch) - stored.lines

    def _spill_locked(self) -> None:
        """Move the in-flight batch (a copy: the send goes on) and the memory queue to the spool, in order."""
        if self.spool is None:
            return
        self.spool_mode = True
        if self.inflight is not None and self.inflight_pos is None:
            # a copy: the send goes on. Stored only in part (disk full), it stays in memory as not durable
            # (the part on disk is replayed later: a harmless duplicate)
            b = self.inflight
            stored = self.spool.append(b.lines, epoch=b.epoch, end_ticket=b.end, pin=True)
            if stored.lines == len(b):
                self.inflight_pos = stored.positions
        while self.mem:
            b = self.mem.popleft()
            self.mem_bytes -= b.nbytes
            self._append_locked(b)

    # -- the sink's thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self.cv:
                batch = None
                while batch is None:
                    if self.stop.is_set():
                        return
                    if self.mem:
                        batch = self.mem.popleft()
                        self.mem_bytes -= batch.nbytes
                        self.inflight_pos = None
                    elif self.spool is not None and self.spool.has_data():
                        rec = self.spool.peek()
                        if rec is not None:
                            self.backlog = self.backlog and rec.epoch != self.epoch
                            batch = Batch(rec.lines, rec.end_ticket, rec.end_ticket - len(rec.lines), 0, rec.epoch)
                            self.inflight_pos = [(rec.segment, rec.offset)]
                    else:
                        self.spool_mode = self.backlog = False
                        if self.closing:
                            return
                        self.cv.wait()
                self.inflight = batch
                self.inflight_since = time.monotonic()
            try:
                result = self.sender.send(batch.lines)
            except DeliveryStopped:
                with self.cv:
                    self._spill_locked()
                    if self.spool is None or self.inflight_pos is None or not self.spool.holds(self.inflight_pos):
                        self.dropped += len(batch)  # not delivered, and no copy left on disk
                    self.inflight = None
                return
            except Exception:  # a sink bug must not kill delivery: keep the batch, back off
                log.exception("%s: unexpected error while writing", self.sink.describe())
                with self.cv:
                    self._spill_locked()
                    if self.inflight_pos is None:
                        self.mem.appendleft(batch)
                        self.mem_bytes += batch.nbytes
                    self.inflight = None
                self.stop.wait(1.0)
                continue
            self._finish(batch, result)

    def _finish(self, batch: Batch, result: SendResult) -> None:
        with self.cv:
            self.written += result.written
            self.rejected += result.rejected
            if self.inflight_pos is not None:
                self.replayed += result.written
                if self.spool is not None:
                    for seg, off in self.inflight_pos:
                        self.spool.ack(seg, off)
            if batch.epoch == self.epoch:
                self._done_upto = max(self._done_upto, batch.end)
            self.inflight = None
            self.inflight_pos = None
            self.cv.notify_all()

    def _on_retry(self, error: WriteError, delay: float) -> None:
        with self.cv:
            self.retries += 1
            self._spill_locked()
        where = self.sink.describe()
        kept = "kept in the spool" if self.spool is not None else "kept in memory (no spool)"
        if error.kind is ErrorKind.CONFIG:
            self._log.log(
                f"config-{self.sink.name}",
                logging.ERROR,
                "CONFIGURATION ERROR writing to %s: %s. Check --url, --org, --bucket and the token; data is %s, retrying every %.0f s",
                where,
                error.describe(),
                kept,
                delay,
            )
        else:
            self._log.log(
                f"retry-{self.sink.name}",
                logging.WARNING,
                "%s: %s; data is %s, retrying in %.1f s",
                where,
                error.describe(),
                kept,
                delay,
            )

    # -- state ------------------------------------------------------------------------------------
    def idle(self) -> bool:
        with self.cv:
            return not self.mem and self.inflight is None and (self.spool is None or not self.spool.has_data())

    def done_upto(self) -> int:
        """The highest ticket finished (delivered, rejected or dropped); -1 while an earlier run's backlog remains."""
        with self.cv:
            if self.backlog:
                return -1
            if not self.mem and self.inflight is None and (self.spool is None or not self.spool.has_data()):
                return self.offered_upto
            return self._done_upto

    def durable_upto(self) -> int:
        with self.cv:
            if self.inflight is not None and self.inflight_pos is None and self.inflight.epoch == self.epoch:
                return self.inflight.start
            if self.mem:
                return self.mem[0].start
            return self.offered_upto

    def settled(self) -> bool:
        """Nothing left to do now: everything delivered, or everything durable while the sink is failing."""
        with self.cv:
            if not self.mem and self.inflight is None and (self.spool is None or not self.spool.has_data()):
                return True
            return self.spool is not None and self.sender.sleeping and not self.mem and self.inflight_pos is not None

    def shutdown(self) -> None:
        """At the deadline: spool what is left (without a spool, count it as dropped)."""
        with self.cv:
            self.closing = True
            if self.spool is not None:
                self._spill_locked()
            else:
                lost = sum(len(b) for b in self.mem) + (len(self.inflight) if self.inflight is not None else 0)
                if lost:
                    log.error(
                        "%s: %d lines not delivered before the deadline and no spool: lost", self.sink.describe(), lost
                    )
                self.dropped += sum(len(b) for b in self.mem)
                self.mem.clear()
                self.mem_bytes = 0
            self.cv.notify_all()


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
    ) -> None:
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
            _private_dir(Path(spool_dir))
            if dead_letter_path is None:
                dead_letter_path = Path(spool_dir) / "dead-letter.lp"
        self.dead_letter = DeadLetter(dead_letter_path)
        policy = policy or RetryPolicy()
        self.spools: list[Spool] = []
        self.workers: list[SinkWorker] = []
        for sink in self.sinks:
            spool = None
            if spool_dir is not None:
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
        """The highest ticket already accepted by every sink, or fsynced to its spool (or settled for good)."""
        return min(min(w.durable_upto() for w in self.workers), self._buffer.cut_upto)

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
        """Stop: deliver what can be delivered within ``timeout``, spool (fsync) the rest, return."""
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread.is_alive():  # its last cut hands everything submitted to the workers (quick)
            self._thread.join(max(deadline - time.monotonic(), 2.0))
        else:  # never started: cut and hand over what was submitted
            self._cut_and_offer(force=True)
        target = self._buffer.ticket
        while time.monotonic() < deadline:
            if all(w.settled() or w.done_upto() >= target for w in self.workers):
                break
            time.sleep(0.005)
        self._stop.set()
        for w in self.workers:
            w.shutdown()
        end = time.monotonic() + 2.0
        for w in self.workers:
            if w.thread.is_alive():
                w.thread.join(max(end - time.monotonic(), 0.0))
        for s in self.spools:
            s.close()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:  # closing must not raise at shutdown
                log.debug("closing %s failed", sink.describe(), exc_info=True)

    def stats(self) -> dict[str, int | float | None]:
        db = [w for w in self.workers if w.sink.is_database] or self.workers
        last_mono = max((w.sender.last_write_mono for w in db if w.sender.last_write_mono is not None), default=None)
        last_unix = max((w.sender.last_write_unix for w in db if w.sender.last_write_unix is not None), default=None)
        latency = [w.sender.last_latency_ms for w in db if w.sender.last_latency_ms is not None]
        buffered = self._buffer.lines
        for w in self.workers:
            with w.cv:
                buffered += sum(len(b) for b in w.mem)
                if w.inflight is not None and w.inflight_pos is None:
                    buffered += len(w.inflight)
        return {
            "lines_written": sum(w.written for w in db),
            "lines_spooled": sum(s.lines_spooled for s in self.spools),
            "lines_replayed": sum(w.replayed for w in db),
            "lines_dropped": self._buffer.dropped
            + sum(w.dropped for w in self.workers)
            + sum(s.lines_dropped for s in self.spools),
            "lines_rejected": sum(w.rejected for w in self.workers),
            "spool_bytes": sum(s.bytes for s in self.spools),
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


# -- one-shot delivery ------------------------------------------------------------------------------
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
    chunk: list[str] = []
    size = 0

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
        for line in lines:
            if not line.endswith("\n"):
                line += "\n"
            if chunk and (len(chunk) >= max_lines or size + len(line) > max_bytes):
                push(chunk)
                chunk, size = [], 0
            chunk.append(line)
            size += len(line)
        if chunk:
            push(chunk)
    finally:
        if timer is not None:
            timer.cancel()
    return out
