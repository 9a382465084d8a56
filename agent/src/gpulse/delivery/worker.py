"""One sink's queue, spool and delivery thread (a :class:`SinkWorker` per sink of a :class:`~gpulse.delivery.pipeline.Delivery`).

Per sink, one thread sends one request at a time, oldest first. A batch waits in memory only
while the sink keeps up: as soon as a send fails, or a batch (or the request in flight) has waited
longer than one flush interval, the in-flight batch and everything queued behind it are appended
to that sink's spool (fsynced), and new batches go behind them until the spool is drained, so the
order never changes and a SIGKILL loses at most the last flush interval. A spool left by an earlier
run is replayed first, while new samples keep flowing behind it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from gpulse.delivery.buffer import Batch
from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.sender import BatchSender, DeliveryStopped, SendResult
from gpulse.delivery.spool import Spool
from gpulse.sinks.base import Sink
from gpulse.sinks.errors import ErrorKind, WriteError
from gpulse.util.countlog import CountedLog

log = logging.getLogger("gpulse.delivery")


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
        self._log = CountedLog(log)
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
