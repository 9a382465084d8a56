"""Prototype: the disk spool as one SQLite database in WAL mode, behind the segment spool's interface.

Written to decide, by measurement, between it and :mod:`gpulse.delivery.spool` (issue 9); the shared
suite ``agent/tests/delivery/test_spool_strategies.py`` runs against both.

One table, one row per record (``id`` gives the order; ``crc`` covers the row so a damaged payload
is found as in the segment spool). ``synchronous=FULL`` in WAL mode: every append is one transaction
whose commit fsyncs the WAL (one fsync per batch, as the segment spool). Acks delete the row; their
commit is not fsynced (``synchronous`` is lowered for them), as the segment spool's ack file is not.
The size cap counts payload bytes; the oldest rows are deleted to make room, and the WAL is
checkpointed and truncated at a quarter of the cap. A database SQLite finds malformed is salvaged row
by row into a new one (a row on a damaged page is lost and counted). On a full disk even a delete
needs room: acknowledged rows are then skipped (``_floor``) and deleted later.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

from gpulse.delivery.spool import MAX_RECORD_BYTES, Appended, Record
from gpulse.util.files import private_dir

log = logging.getLogger("gpulse.spool")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, "
    "end_ticket INTEGER NOT NULL, nlines INTEGER NOT NULL, crc INTEGER NOT NULL, payload BLOB NOT NULL)"
)


def _crc(epoch: int, end_ticket: int, nlines: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(f"{epoch} {end_ticket} {nlines}".encode()))


class SqliteSpool:
    """Size-capped FIFO of line batches in SQLite (WAL). Thread-safe. Positions are ``(row id, 0)``."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 1 << 30, segment_bytes: int | None = None):
        self.dir = private_dir(directory)
        self.max_bytes = int(max_bytes)
        self._lock = threading.RLock()
        self._closed = False
        self.lines_spooled = 0
        self.lines_dropped = 0
        self.damaged_records = 0
        self.damaged_bytes = 0
        self.damaged_lines = 0
        self.write_errors = 0
        self._pinned: set[int] = set()
        self._peeked: Record | None = None
        self._floor = 0  # rows up to this id are acknowledged (deleted, or to be deleted)
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        path = self.dir / "spool.db"
        try:
            return self._connect(path)
        except sqlite3.DatabaseError as e:  # malformed: salvage what can still be read, row by row
            log.error("spool %s is damaged (%s): salvaging it row by row", path, e)
            return self._salvage(path)

    def _salvage(self, path: Path) -> sqlite3.Connection:
        old = sqlite3.connect(path)
        rows = []
        lost_guess = 0
        size = path.stat().st_size
        for rid in range(1, size // 16 + 2):
            try:
                row = old.execute(
                    "SELECT id, epoch, end_ticket, nlines, crc, payload FROM records WHERE id = ?", (rid,)
                ).fetchone()
            except sqlite3.DatabaseError:
                lost_guess += 1
                continue
            if row is not None:
                rows.append(row)
        old.close()
        for suffix in ("", "-wal", "-shm"):
            p = Path(f"{path}{suffix}")
            if p.exists():
                os.replace(p, Path(f"{path}.damaged{suffix}"))
        db = self._connect(path)
        db.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)", rows)
        self.damaged_records += lost_guess
        (self._payload_bytes,) = db.execute("SELECT coalesce(sum(length(payload)), 0) FROM records").fetchone()
        return db

    def _connect(self, path: Path) -> sqlite3.Connection:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(f"PRAGMA wal_autocheckpoint={max(16, self.max_bytes // 4 // 4096)}")
        db.execute(f"PRAGMA journal_size_limit={max(64 << 10, self.max_bytes // 4)}")
        db.execute(_SCHEMA)
        db.execute("SELECT count(*) FROM records").fetchone()  # reads the table: a malformed one raises
        (self._payload_bytes,) = db.execute("SELECT coalesce(sum(length(payload)), 0) FROM records").fetchone()
        return db

    @property
    def bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.stat(self.dir / f"spool.db{suffix}").st_size
            except OSError:
                pass
        return total if self.has_data() else 0

    def has_data(self) -> bool:
        with self._lock:
            if self._closed or self._payload_bytes <= 0:
                return False
            return self._db.execute("SELECT 1 FROM records WHERE id > ? LIMIT 1", (self._floor,)).fetchone() is not None

    # -- writing ----------------------------------------------------------------------------------
    def append(self, lines: Sequence[str], *, epoch: int = 0, end_ticket: int = 0, pin: bool = False) -> Appended:
        payload = "".join(lines).encode("utf-8", "replace")
        out = Appended([], 0)
        with self._lock:
            if self._closed:
                return out
            if len(payload) > min(self.max_bytes, MAX_RECORD_BYTES):
                out.too_big = len(lines)
                return out
            try:
                self._make_room(len(payload))
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                cur = db.execute(
                    "INSERT INTO records (epoch, end_ticket, nlines, crc, payload) VALUES (?, ?, ?, ?, ?)",
                    (epoch, end_ticket, len(lines), _crc(epoch, end_ticket, len(lines), payload), payload),
                )
                db.execute("COMMIT")  # synchronous=FULL: the WAL is fsynced
            except sqlite3.Error as e:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self.write_errors += 1
                log.error("spool %s: cannot write (%s); %d lines not stored", self.dir, e, len(lines))
                return out
            row = int(cur.lastrowid or 0)
            self._payload_bytes += len(payload)
            if pin:
                self._pinned.add(row)
            self.lines_spooled += len(lines)
            return Appended([(row, 0)], len(lines))

    def _make_room(self, need: int) -> None:
        while self._payload_bytes and self._payload_bytes + need > self.max_bytes:
            row = self._db.execute("SELECT id, nlines, length(payload) FROM records ORDER BY id LIMIT 1").fetchone()
            if row is None:
                return
            self._delete(row[0], durable=True)
            if row[0] not in self._pinned:
                self.lines_dropped += row[1]

    # -- reading ----------------------------------------------------------------------------------
    def peek(self) -> Record | None:
        with self._lock:
            while not self._closed:
                if self._peeked is not None:
                    return self._peeked
                row = self._db.execute(
                    "SELECT id, epoch, end_ticket, nlines, crc, payload FROM records WHERE id > ? ORDER BY id LIMIT 1",
                    (self._floor,),
                ).fetchone()
                if row is None:
                    return None
                rid, epoch, end_ticket, nlines, crc, payload = row
                lines = bytes(payload).decode("utf-8", "replace").splitlines(keepends=True)
                if crc != _crc(epoch, end_ticket, nlines, payload) or len(lines) != nlines:
                    self.damaged_records += 1
                    self.damaged_bytes += len(payload)
                    self.damaged_lines += nlines
                    self.lines_dropped += nlines
                    self._delete(rid, durable=False)
                    continue
                self._peeked = Record(rid, 0, 0, lines, epoch, end_ticket)
                self._pinned.add(rid)
                return self._peeked
            return None

    def ack(self, segment: int, offset: int) -> bool:
        with self._lock:
            if self._closed or self._peeked is None or self._peeked.segment != segment:
                return False
            self._peeked = None
            self._floor = max(self._floor, segment)
            try:
                self._delete(segment, durable=False)
            except sqlite3.OperationalError:  # a full disk: deleted later; skipped meanwhile
                pass
            return True

    def holds(self, positions: Sequence[tuple[int, int]]) -> bool:
        with self._lock:
            if self._closed:
                return False
            ids = [p[0] for p in positions]
            if not ids:
                return True
            marks = ",".join("?" * len(ids))
            (n,) = self._db.execute(f"SELECT count(*) FROM records WHERE id IN ({marks})", ids).fetchone()
            return n == len(ids)

    def _delete(self, rid: int, durable: bool) -> None:
        db = self._db
        if not durable:
            db.execute("PRAGMA synchronous=OFF")
        try:
            row = db.execute(
                "SELECT coalesce(sum(length(payload)), 0) FROM records WHERE id = ? OR id <= ?", (rid, self._floor)
            ).fetchone()
            db.execute("DELETE FROM records WHERE id = ? OR id <= ?", (rid, self._floor))
        finally:
            if not durable:
                db.execute("PRAGMA synchronous=FULL")
        if row is not None:
            self._payload_bytes -= row[0]
        self._pinned.discard(rid)
        if self._peeked is not None and self._peeked.segment == rid:
            self._peeked = None

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
