"""The per-destination segment store: batches a sink could not take, kept in order until it can.

Records (:mod:`.codec`) are appended to numbered segments (:mod:`.layout`). Each append is fsynced
(one fsync per batch, about once per flush interval); a process restarted after a crash never
appends behind a possibly torn tail: it opens a new segment. The read position is overwritten in
place and not fsynced: a crash may replay a few records twice, which is harmless. Damage met while
replaying is skipped and counted (:mod:`.damage`) and each damaged segment is logged once.

The store is bounded in bytes: to make room, the oldest segment is deleted and its undelivered lines
are counted as dropped. A failed write (ENOSPC, EIO) is undone (truncated away), reported to the
caller, and never raised. Memory use is a few integers per segment: records are read from disk one
at a time, and a fully delivered segment is deleted.

Why segments and not SQLite (issue 9, decided by measurement): a SQLite WAL spool behind the same
interface passed the same suite (``agent/tests/delivery/test_spool.py``) for order, crashes and a
torn write, but lost many batches to one flipped byte (a page header), outgrew its size cap (WAL and
free pages; its files never shrink) and stopped accepting appends for good once its disk was full;
it was not faster (BENCHMARKS.md, "Spool: segments or SQLite", ``bench/bench_spool.py``).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulse.delivery.spool.codec import HEADER, MAX_RECORD_BYTES, Record, encode_record, read_record
from gpulse.delivery.spool.damage import Damage, skip, walk
from gpulse.delivery.spool.layout import ACK_FILE, ack_text, fsync_dir, read_ack, segment_name, segments
from gpulse.util.countlog import CountedLog
from gpulse.util.files import TornAppend, append_fsync, open_append, private_dir

log = logging.getLogger("gpulse.spool")
_rlog = CountedLog(log)

_TOO_BIG = (-1, -1)  # what _append_record answers for a record larger than the whole spool


@dataclass
class Appended:
    """Where a batch went: its records' (segment, offset), how many of its lines were stored, and how many
    were refused for good (a line larger than the whole spool). Stored and refused lines are the batch's
    first ones: after a write error (disk full) the rest is not tried."""

    positions: list[tuple[int, int]]
    lines: int
    too_big: int = 0


class Spool:
    """Append-only, checksummed, size-capped FIFO of line batches on disk. Thread-safe."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 1 << 30, segment_bytes: int | None = None):
        self.dir = Path(directory)
        self.max_bytes = int(max_bytes)
        self.segment_bytes = segment_bytes or max(4096, min(self.max_bytes // 8, 64 << 20))
        self._lock = threading.RLock()
        self._closed = False
        # counters (since this process started)
        self.lines_spooled = 0
        self.lines_dropped = 0  # oldest segments dropped for room, or lost to damage
        #: damage met while replaying (torn writes, corruption): regions skipped, their bytes and lines
        self.damaged_records = 0
        self.damaged_bytes = 0
        self.damaged_lines = 0
        self._damage_log = CountedLog(log, period_s=None)  # each damaged segment is logged once
        self.write_errors = 0
        private_dir(self.dir)
        self._sizes = segments(self.dir)
        self._wfd: int | None = None
        self._wseg: int | None = None  # the segment being appended to (never one from an earlier run)
        self._next_seg = max(self._sizes, default=0) + 1
        self._rfd: int | None = None
        self._rfd_seg: int | None = None
        self._roff = 0
        self._peeked: Record | None = None  # the head record handed out by peek(), until acked
        #: records being delivered right now (peeked, or the spooled copy of a batch in flight): if the
        #: size cap drops them, they are not counted as dropped, since the delivery in flight may still succeed
        self._pinned: set[tuple[int, int]] = set()
        self._ackfd: int | None = None
        self._load_ack()

    # -- setup ------------------------------------------------------------------------------------
    def _load_ack(self) -> None:
        ack = read_ack(self.dir)
        if ack is None:
            return
        seg, off = ack
        for old in [s for s in self._sizes if s < seg]:
            self._delete(old)
        if seg in self._sizes and 0 <= off <= self._sizes[seg]:
            self._roff = off

    # -- state ------------------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """Bytes on disk (segments still holding undelivered records)."""
        return sum(self._sizes.values())

    def has_data(self) -> bool:
        """Whether any record is waiting to be delivered."""
        with self._lock:
            if not self._sizes:
                return False
            head = next(iter(self._sizes))
            return len(self._sizes) > 1 or self._sizes[head] > self._roff

    # -- writing ----------------------------------------------------------------------------------
    def append(self, lines: Sequence[str], *, epoch: int = 0, end_ticket: int = 0, pin: bool = False) -> Appended:
        """Append one batch durably (fsync per record). A batch larger than a segment is stored as several
        records (so a tiny spool can still hold it in part). Lines that could not be stored (disk error, or
        a line larger than the whole spool) are missing from the result: the caller keeps or counts them.
        ``pin``: the batch is also being delivered right now (see ``_pinned``)."""
        out = Appended([], 0)
        remaining = len(lines)
        for group in self._groups(lines):
            remaining -= len(group)
            with self._lock:
                pos = self._append_record(group, epoch, end_ticket - remaining)
                if pos is _TOO_BIG:
                    out.too_big += len(group)
                    continue
                if pos is None:
                    break
                if pin:
                    self._pinned.add(pos)
            out.positions.append(pos)
            out.lines += len(group)
        return out

    def _groups(self, lines: Sequence[str]) -> list[Sequence[str]]:
        limit = min(self.segment_bytes, self.max_bytes) - HEADER.size
        if sum(map(len, lines)) <= limit // 4:  # the common case: characters <= bytes <= 4 x characters
            return [lines]
        groups: list[Sequence[str]] = []
        cur: list[str] = []
        size = 0
        for line in lines:
            n = len(line.encode("utf-8", "replace"))
            if cur and size + n > limit:
                groups.append(cur)
                cur, size = [], 0
            cur.append(line)
            size += n
        if cur:
            groups.append(cur)
        return groups

    def _append_record(self, lines: Sequence[str], epoch: int, end_ticket: int) -> tuple[int, int] | None:
        """Where the record went; None if it could not be written now; ``_TOO_BIG`` if it never can."""
        record, payload_bytes = encode_record(lines, epoch, end_ticket)
        with self._lock:
            if self._closed:
                return None
            if len(record) > self.max_bytes or payload_bytes > MAX_RECORD_BYTES:
                _rlog.log(
                    "too-big",
                    logging.ERROR,
                    "spool %s: a %d-byte line exceeds the spool size; dropped",
                    self.dir,
                    len(record),
                )
                return _TOO_BIG
            self._make_room(len(record))
            if (
                self._wseg is not None
                and self._sizes[self._wseg]
                and self._sizes[self._wseg] + len(record) > self.segment_bytes
            ):
                self._close_writer()
            try:
                if self._wseg is None:
                    self._open_writer()
                assert self._wfd is not None and self._wseg is not None
                offset = self._sizes[self._wseg]
                try:
                    append_fsync(self._wfd, record)
                except TornAppend:
                    self._close_writer()  # the torn tail stays; the reader skips it (damage to the segment's end)
                    raise
            except OSError as e:
                self.write_errors += 1
                _rlog.log(
                    f"write-{e.errno}",
                    logging.ERROR,
                    "spool %s: cannot write (%s); %d lines not stored: they wait in memory, not acknowledged, "
                    "until the disk has room or the database takes them",
                    self.dir,
                    os.strerror(e.errno) if e.errno else e,
                    len(lines),
                )
                return None
            self._sizes[self._wseg] = offset + len(record)
            self.lines_spooled += len(lines)
            return self._wseg, offset

    def _open_writer(self) -> None:
        seg = self._next_seg
        path = self._path(seg)
        fd = open_append(path)
        self._next_seg += 1
        self._wfd, self._wseg = fd, seg
        self._sizes[seg] = 0
        fsync_dir(self.dir)  # make the new file's directory entry durable too

    def _close_writer(self) -> None:
        seg, fd = self._wseg, self._wfd
        self._wfd, self._wseg = None, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        if seg is not None and seg in self._sizes:
            try:  # an abandoned torn tail makes the file longer than we counted
                self._sizes[seg] = self._path(seg).stat().st_size
            except OSError:
                pass

    def _make_room(self, need: int) -> None:
        while self._sizes and self.bytes + need > self.max_bytes:
            oldest = next(iter(self._sizes))
            lost = self._count_lines(oldest)
            if oldest == self._wseg:
                self._close_writer()
            self._delete(oldest)
            self.lines_dropped += lost
            _rlog.log(
                "full",
                logging.WARNING,
                "spool %s is full (%d bytes): dropped its oldest segment, %d lines",
                self.dir,
                self.max_bytes,
                lost,
            )

    def _count_lines(self, seg: int) -> int:
        """Undelivered lines in a segment (from the read position if it is the head), except a pinned record;
        damaged records count with the lines they are estimated to hold."""
        start = self._roff if seg == next(iter(self._sizes)) else 0
        total = 0
        for item in walk(self._reader(seg), seg, start, self._sizes.get(seg, 0)):
            if isinstance(item, Damage):
                total += item.lines
            elif (item.segment, item.offset) not in self._pinned:
                total += len(item.lines)
        return total

    # -- reading ----------------------------------------------------------------------------------
    def peek(self) -> Record | None:
        """The oldest undelivered record (the same one until :meth:`ack`), or ``None`` if there is none.

        Damage (torn or corrupt record) is skipped: the rest of that segment is counted as lost."""
        with self._lock:
            while self._sizes and not self._closed:
                head = next(iter(self._sizes))
                size = self._sizes[head]
                if self._roff >= size:
                    if head == self._wseg:
                        return None
                    self._delete(head)
                    continue
                rec = self._read(head, self._roff, size)
                if rec is None:
                    self._skip_damage(head, size)
                    continue
                self._peeked = rec
                self._pinned.add((rec.segment, rec.offset))
                return rec
            return None

    def ack(self, segment: int, offset: int) -> bool:
        """Mark the record at (segment, offset) delivered; ignored unless it is the current head."""
        with self._lock:
            if self._closed or not self._sizes:
                return False
            head = next(iter(self._sizes))
            if (segment, offset) != (head, self._roff):
                return False
            rec = self._peeked
            if rec is None or (rec.segment, rec.offset) != (segment, offset):
                rec = self._read(head, offset, self._sizes[head])
                if rec is None:
                    return False
            self._peeked = None
            self._pinned.discard((segment, offset))
            self._roff = rec.end_offset
            if self._roff >= self._sizes[head]:  # fully delivered: delete it (the writer starts a new one)
                if head == self._wseg:
                    self._close_writer()
                self._delete(head)
            else:
                self._save_ack(head, self._roff)
            return True

    def holds(self, positions: Sequence[tuple[int, int]]) -> bool:
        """Whether all these records are still waiting in the spool (not dropped for room, not acked)."""
        with self._lock:
            if not self._sizes:
                return not positions
            head = next(iter(self._sizes))
            return all(seg in self._sizes and (seg > head or off >= self._roff) for seg, off in positions)

    def _save_ack(self, seg: int, off: int) -> None:
        """Overwrite the read position in place (fixed width, checksummed; no rename: on ext4 a rename over
        a file waits for its data, which made replay many times slower). Not fsynced: after a crash a few records
        may be replayed twice, which is harmless (same series and timestamp)."""
        try:
            if self._ackfd is None:
                self._ackfd = os.open(self.dir / ACK_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.pwrite(self._ackfd, ack_text(seg, off), 0)
        except OSError as e:
            _rlog.log("ack", logging.WARNING, "spool %s: cannot save the read position: %s", self.dir, e)

    def _drop_ack(self) -> None:
        if self._ackfd is not None:
            os.close(self._ackfd)
            self._ackfd = None
        try:
            (self.dir / ACK_FILE).unlink()
        except OSError:
            pass

    def _read(self, seg: int, off: int, size: int) -> Record | None:
        return read_record(self._reader(seg), seg, off, size)

    def _skip_damage(self, seg: int, size: int) -> None:
        """Skip a bad record at the read position (see :func:`.damage.skip`), count what it cost, log the segment once."""
        start = self._roff
        resume, lost = skip(self._reader(seg), seg, start, size)
        self.damaged_records += 1
        self.damaged_bytes += resume - start
        self.damaged_lines += lost
        self.lines_dropped += lost
        self._damage_log.log(
            f"{seg}",
            logging.ERROR,
            "spool %s: segment %d is damaged at byte %d (torn write or corruption): skipped %d bytes, about %d "
            "lines lost (counted in spool_damaged_lines; further damage in this segment is counted, not logged)",
            self.dir,
            seg,
            start,
            resume - start,
            lost,
        )
        self._roff = resume
        if resume >= size and seg != self._wseg:
            self._delete(seg)
        else:
            self._save_ack(seg, resume)

    def _reader(self, seg: int) -> int | None:
        if self._rfd_seg != seg:
            self._close_reader()
            try:
                self._rfd = os.open(self._path(seg), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            self._rfd_seg = seg
        return self._rfd

    def _close_reader(self) -> None:
        if self._rfd is not None:
            try:
                os.close(self._rfd)
            except OSError:
                pass
        self._rfd, self._rfd_seg = None, None

    # -- housekeeping -----------------------------------------------------------------------------
    def _path(self, seg: int) -> Path:
        return self.dir / segment_name(seg)

    def _delete(self, seg: int) -> None:
        was_head = bool(self._sizes) and seg == next(iter(self._sizes))
        if self._rfd_seg == seg:
            self._close_reader()
        if self._peeked is not None and self._peeked.segment == seg:
            self._peeked = None
        self._pinned = {p for p in self._pinned if p[0] != seg}
        self._sizes.pop(seg, None)
        try:
            self._path(seg).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ENOENT,):
                _rlog.log("unlink", logging.WARNING, "spool %s: cannot delete segment %d: %s", self.dir, seg, e)
        if was_head:
            self._roff = 0
            if self._sizes:
                self._save_ack(next(iter(self._sizes)), 0)
            else:
                self._drop_ack()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_writer()
            self._close_reader()
            if self._ackfd is not None:
                os.close(self._ackfd)
                self._ackfd = None
