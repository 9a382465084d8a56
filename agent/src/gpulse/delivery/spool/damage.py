"""The walk over a segment: its intact records and the damaged regions between them.

A damaged record (torn write, flipped bit, garbage) is skipped to where its length leads, or to the
next record that checks out, or to the end of the segment; the lines it held are counted as lost.
The store (replaying) and the inspection (``gpulse doctor``/``status``) skip and count the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from gpulse.delivery.spool.codec import HEADER, MAGIC, Record, read_record

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Damage:
    """A damaged region of a segment the reader skips: ``start`` to ``end`` (bytes), about ``lines`` lines."""

    segment: int
    start: int
    end: int
    lines: int


def walk(fd: int | None, seg: int, start: int, size: int) -> Iterator[Record | Damage]:
    """Every record of a segment from ``start``, and every damaged region between them, in order."""
    off = start
    while off < size:
        rec = read_record(fd, seg, off, size)
        if rec is None:
            resume, lost = skip(fd, seg, off, size)
            yield Damage(seg, off, resume, lost)
            off = resume
        else:
            yield rec
            off = rec.end_offset


def skip(fd: int | None, seg: int, start: int, size: int) -> tuple[int, int]:
    """Where reading resumes after the bad record at ``start``, and how many lines the skip costs.

    * a damaged payload (the header's length leads to the next record's magic): exactly the lines the
      header names (that next record is read, or found damaged, on its own);
    * a torn tail (the header's length runs past the end, nothing valid follows): the lines the
      header names;
    * otherwise (a damaged header or length field): the reader resynchronises on the next valid record
      of the segment (or its end), and the loss is the newlines skipped, past the header if it has one
      (its binary fields may hold a newline byte)."""
    header = b""
    if fd is not None:
        try:
            header = os.pread(fd, HEADER.size, start)
        except OSError:
            header = b""
    has_header = len(header) == HEADER.size and header[:4] == MAGIC
    end, nlines = size, 0
    if has_header:
        _, _, plen, nlines, _, _ = HEADER.unpack(header)
        end = start + HEADER.size + plen
        if end < size and _magic_at(fd, end):
            return end, nlines
    resume = _resync(fd, seg, start + 1, size)
    if has_header and resume == size and end >= size:
        return size, nlines
    return resume, _count_newlines(fd, start + (HEADER.size if has_header else 0), resume)


def _magic_at(fd: int | None, off: int) -> bool:
    try:
        return fd is not None and os.pread(fd, len(MAGIC), off) == MAGIC
    except OSError:
        return False


def _resync(fd: int | None, seg: int, start: int, size: int) -> int:
    """Offset of the next valid record in ``seg`` at or after ``start``, else ``size``."""
    off = start
    while fd is not None and off < size:
        try:
            chunk = os.pread(fd, min(_CHUNK, size - off), off)
        except OSError:
            break
        i = chunk.find(MAGIC)
        while i >= 0:
            if read_record(fd, seg, off + i, size) is not None:
                return off + i
            i = chunk.find(MAGIC, i + 1)
        if len(chunk) < _CHUNK:
            break
        off += len(chunk) - len(MAGIC) + 1
    return size


def _count_newlines(fd: int | None, start: int, end: int) -> int:
    n, off = 0, start
    while fd is not None and off < end:
        try:
            chunk = os.pread(fd, min(_CHUNK, end - off), off)
        except OSError:
            break
        if not chunk:
            break
        n += chunk.count(b"\n")
        off += len(chunk)
    return n
