"""One sink's queue, spool and delivery thread (a :class:`SinkWorker` per sink of a :class:`~gpulse.delivery.pipeline.Delivery`).

Per sink, one thread sends one request at a time, oldest first. The queue is, in order: the *head*
(the batch being sent), the spool (on disk, fsynced), then memory. A batch waits in memory only while
the sink keeps up (:attr:`Mode.MEMORY`): as soon as a send fails, or a batch (or the head) has waited
longer than one flush interval, a copy of the head and everything in memory are appended to the spool
and new batches go behind them (:attr:`Mode.SPOOLING`) until the spool is drained, so the order never
changes and a SIGKILL loses at most the last flush interval. A spool left by an earlier run is
replayed first (:attr:`Mode.REPLAYING_BACKLOG`), while new samples keep flowing behind it.

What the spool cannot take (a full disk) stays in memory, behind what it holds, up to the memory cap,
and is not durable until it is delivered: a training client is acknowledged only for lines that were
delivered or fsynced (``durable_upto``). A line dropped for good (the memory cap, shutdown without a
spool) holds ``durable_upto`` back for the rest of this process: its clients record what they sent.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from gpulse.delivery.buffer import Batch
from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.sender import BatchSender, DeliveryStopped, SendResult
from gpulse.delivery.spool import Spool
from gpulse.sinks.base import Sink
from gpulse.sinks.errors import ErrorKind, WriteError
from gpulse.util.countlog import CountedLog

log = logging.getLogger("gpulse.delivery")


class Mode(enum.Enum):
    """Where new batches go, and what the sink thread reads."""

    #: the sink keeps up: batches wait in memory (the spool is empty)
    MEMORY = "memory"
    #: the sink is behind: new batches go to the spool (memory only for what the spool cannot take)
    SPOOLING = "spooling"
    #: as SPOOLING, and the spool starts with an earlier run's batches (``done_upto`` is -1 until they are through)
    REPLAYING_BACKLOG = "replaying_backlog"
    #: shutting down: what is left goes to the spool (or is counted as dropped), the thread stops
    CLOSING = "closing"


@dataclass
class Head:
    """The batch the sink thread is sending, until it is finished (delivered, rejected, or given up)."""

    batch: Batch
    since: float
    #: its records in the spool (replayed from there, or copied there while in flight): it is durable
    spooled: list[tuple[int, int]] | None = None
    #: counted as lost at shutdown while its send was still going on
    given_up: bool = False

    @property
    def durable(self) -> bool:
        return self.spooled is not None


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
        self.mode = Mode.REPLAYING_BACKLOG if spool is not None and spool.has_data() else Mode.MEMORY
        self.head: Head | None = None
        self.mem: deque[Batch] = deque()
        self.mem_bytes = 0
        self.offered_upto = 0
        self._done_upto = 0
        #: the start of the first batch of ours dropped for good: nothing from there on is ever durable
        self._lost_from: int | None = None
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
            if self.spool is not None and (self.mode is not Mode.MEMORY or self._stalled(time.monotonic())):
                self._spill_locked()
                if not self.mem:  # else the spool is failing: nothing may overtake what waits in memory
                    batch = self._to_spool(batch)
            if batch.lines:
                if self.mode is Mode.CLOSING:
                    self._lose(batch)
                else:
                    self._to_memory(batch)
            self.cv.notify_all()

    def tick(self) -> None:
        """Once per flush interval: spool what has waited too long (the SIGKILL bound)."""
        with self.cv:
            if self.spool is not None and self._stalled(time.monotonic()):
                self._spill_locked()

    def _stalled(self, now: float) -> bool:
        head = self.head
        if head is not None and not head.durable and now - head.since > self.flush_interval:
            return True
        return bool(self.mem) and now - self.mem[0].cut_at > self.flush_interval

    def _to_memory(self, batch: Batch) -> None:
        """Queue ``batch`` behind everything; beyond the memory cap the oldest queued batch is dropped."""
        self.mem.append(batch)
        self.mem_bytes += batch.nbytes
        while self.mem_bytes > self.memory_max_bytes and len(self.mem) > 1:
            old = self.mem.popleft()
            self.mem_bytes -= old.nbytes
            self._lose(old)
            self._log.log(
                f"mem-{self.sink.name}",
                logging.WARNING,
                "%s is behind and %s: dropped %d old lines (memory cap %d bytes)",
                self.sink.describe(),
                "there is no spool" if self.spool is None else "the spool cannot take more",
                len(old),
                self.memory_max_bytes,
            )

    def _to_spool(self, batch: Batch) -> Batch:
        """Append a queued ``batch`` durably; returns what the spool could not take now (empty when all is
        stored). A line larger than the whole spool is dropped for good."""
        assert self.spool is not None
        stored = self.spool.append(batch.lines, epoch=batch.epoch, end_ticket=batch.end)
        if stored.too_big:
            self._lose(batch, stored.too_big)
        rest = batch.lines[stored.lines + stored.too_big :]
        nbytes = sum(map(len, rest)) if rest else 0
        return Batch(rest, batch.end, batch.end - len(rest), nbytes, batch.epoch, batch.cut_at)

    def _spill_locked(self) -> None:
        """Make the queue durable: a copy of the head (the send goes on), then memory, to the spool, in order.
        What the spool cannot take (disk full) stays in memory, and everything after it too."""
        if self.spool is None:
            return
        if self.mode is Mode.MEMORY:
            self.mode = Mode.SPOOLING
        head = self.head
        if head is not None and not head.durable:
            # Stored only in part, the head stays not durable (the part on disk is replayed later: a
            # harmless duplicate); its send goes on either way.
            b = head.batch
            stored = self.spool.append(b.lines, epoch=b.epoch, end_ticket=b.end, pin=True)
            if stored.lines == len(b):
                head.spooled = stored.positions
        while self.mem:
            b = self.mem[0]
            rest = self._to_spool(b)
            self.mem_bytes -= b.nbytes - rest.nbytes
            if rest.lines:
                self.mem[0] = rest
                return
            self.mem.popleft()

    def _lose(self, batch: Batch, lines: int | None = None) -> None:
        """``lines`` of ``batch`` (all by default) are gone for good: counted, and never acknowledged."""
        self.dropped += len(batch) if lines is None else lines
        if batch.epoch == self.epoch:
            self._lost_from = batch.start if self._lost_from is None else min(self._lost_from, batch.start)

    # -- the sink's thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            head = self._next_head()
            if head is None:
                return
            try:
                result = self.sender.send(head.batch.lines)
            except DeliveryStopped:
                with self.cv:
                    self._spill_locked()
                    if head.given_up:
                        pass  # shutdown counted it
                    elif not head.durable or self.spool is None or not self.spool.holds(head.spooled or []):
                        self._lose(head.batch)  # not delivered, and no copy left on disk
                    self.head = None
                return
            except Exception:  # a sink bug must not kill delivery: keep the batch (it stays the head), back off
                log.exception("%s: unexpected error while writing", self.sink.describe())
                with self.cv:
                    self._spill_locked()
                self.stop.wait(1.0)
                continue
            self._finish(head, result)

    def _next_head(self) -> Head | None:
        """The batch to send next (the current head again after an unexpected error), or None to stop."""
        with self.cv:
            while True:
                if self.stop.is_set():
                    return None
                if self.head is not None:
                    return self.head
                rec = self.spool.peek() if self.spool is not None and self.spool.has_data() else None
                if rec is not None:
                    if self.mode is Mode.REPLAYING_BACKLOG and rec.epoch == self.epoch:
                        self.mode = Mode.SPOOLING
                    batch = Batch(rec.lines, rec.end_ticket, rec.end_ticket - len(rec.lines), 0, rec.epoch)
                    self.head = Head(batch, time.monotonic(), [(rec.segment, rec.offset)])
                elif self.mem:
                    batch = self.mem.popleft()
                    self.mem_bytes -= batch.nbytes
                    self.head = Head(batch, time.monotonic())
                else:
                    if self.mode is Mode.CLOSING:
                        return None
                    self.mode = Mode.MEMORY
                    self.cv.wait()
                    continue
                if self.mode is Mode.REPLAYING_BACKLOG and rec is None:
                    self.mode = Mode.SPOOLING  # the backlog is through; what remains is ours
                return self.head

    def _finish(self, head: Head, result: SendResult) -> None:
        with self.cv:
            self.written += result.written
            self.rejected += result.rejected
            if head.given_up:
                self.dropped -= len(head.batch)  # shutdown counted it as lost, but the send made it in the end
            if head.durable:
                self.replayed += result.written
                if self.spool is not None:
                    for seg, off in head.spooled or []:
                        self.spool.ack(seg, off)
            if head.batch.epoch == self.epoch:
                self._done_upto = max(self._done_upto, head.batch.end)
            self.head = None
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
    def _empty_locked(self) -> bool:
        return self.head is None and not self.mem and (self.spool is None or not self.spool.has_data())

    def done_upto(self) -> int:
        """The highest ticket finished (delivered, rejected or dropped); -1 while an earlier run's backlog remains."""
        with self.cv:
            if self.mode is Mode.REPLAYING_BACKLOG:
                return -1
            return self.offered_upto if self._empty_locked() else self._done_upto

    def durable_upto(self) -> int:
        """The highest ticket up to which every line was delivered or fsynced to the spool (never past a lost line)."""
        with self.cv:
            head = self.head
            if head is not None and not head.durable and head.batch.epoch == self.epoch:
                upto = head.batch.start
            elif self.mem:
                upto = self.mem[0].start
            else:
                upto = self.offered_upto
            return upto if self._lost_from is None else min(upto, self._lost_from)

    def settled(self) -> bool:
        """Nothing left to do now: everything delivered, or everything durable while the sink is failing."""
        with self.cv:
            if self._empty_locked():
                return True
            return (
                self.spool is not None
                and self.sender.sleeping
                and not self.mem
                and self.head is not None
                and self.head.durable
            )

    def memory_lines(self) -> int:
        """Lines waiting in memory only (not on disk): lost if the process dies now."""
        with self.cv:
            head = self.head
            return sum(len(b) for b in self.mem) + (len(head.batch) if head is not None and not head.durable else 0)

    def shutdown(self) -> None:
        """At the deadline: spool what is left (without a spool, or beyond what it takes, count it as dropped).

        Never waits for the sink thread: a send still going on is counted as lost unless it has a copy
        on disk (the thread undoes that if the send makes it after all)."""
        with self.cv:
            self.mode = Mode.CLOSING
            self._spill_locked()
            lost = [*self.mem]
            head = self.head
            if head is not None and not head.durable and not head.given_up:
                head.given_up = True
                lost.append(head.batch)
            if lost:
                log.error(
                    "%s: %d lines not delivered before the deadline and %s: lost",
                    self.sink.describe(),
                    sum(len(b) for b in lost),
                    "no spool" if self.spool is None else "the spool could not take them",
                )
            for b in lost:
                self._lose(b)
            self.mem.clear()
            self.mem_bytes = 0
            self.cv.notify_all()
