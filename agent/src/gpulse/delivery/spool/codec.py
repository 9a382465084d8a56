"""The spool's record format: a 32-byte header and the payload, checksummed.

A record is ``magic "GPS1", crc32, payload length, line count, epoch, end ticket`` (little-endian)
followed by the payload (the lines, UTF-8). The CRC covers everything after itself, so a torn write
(power cut, SIGKILL mid-write) or a flipped bit is detected: :func:`read_record` then answers None and
:mod:`.damage` decides where reading resumes.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = b"GPS1"
HEADER = struct.Struct("<4sIIIQQ")  # magic, crc32, payload length, lines, epoch, end ticket
MAX_RECORD_BYTES = 1 << 30
_REST = struct.Struct("<IIQQ")  # the header after magic and CRC: what the CRC covers with the payload
_U64 = 2**64 - 1


@dataclass(frozen=True)
class Record:
    """One intact record of a segment: where it is, where the next one starts, its lines and tickets."""

    segment: int
    offset: int
    end_offset: int
    lines: list[str]
    epoch: int
    end_ticket: int


def encode_record(lines: Sequence[str], epoch: int, end_ticket: int) -> tuple[bytes, int]:
    """The bytes of a record holding ``lines``, and its payload's length."""
    payload = "".join(lines).encode("utf-8", "replace")
    rest = _REST.pack(len(payload), len(lines), epoch & _U64, end_ticket & _U64)
    crc = zlib.crc32(payload, zlib.crc32(rest))
    return MAGIC + struct.pack("<I", crc) + rest + payload, len(payload)


def read_record(fd: int | None, seg: int, off: int, size: int) -> Record | None:
    """The intact record at ``off`` of segment ``seg`` (``size`` bytes long), or None (torn, corrupt, missing)."""
    if fd is None:
        return None
    try:
        head = os.pread(fd, HEADER.size, off)
        if len(head) < HEADER.size:
            return None
        magic, crc, plen, nlines, epoch, end_ticket = HEADER.unpack(head)
        if magic != MAGIC or off + HEADER.size + plen > size or plen > MAX_RECORD_BYTES:
            return None
        payload = os.pread(fd, plen, off + HEADER.size)
    except OSError:
        return None
    if len(payload) != plen or zlib.crc32(payload, zlib.crc32(head[8:])) != crc:
        return None
    lines = payload.decode("utf-8", "replace").splitlines(keepends=True)
    if len(lines) != nlines:
        return None
    return Record(seg, off, off + HEADER.size + plen, lines, epoch, end_ticket)
