"""The spool folder's files: numbered segments, the read position (``ack``) and the destination.

Layout (directory mode 0700, files 0600)::

    00000000000000000001.seg   append-only segments of records (see :mod:`.codec`)
    00000000000000000002.seg
    ack                        "<segment> <offset> <crc32>": where the next record to deliver starts
    destination                the destination the data is meant for (a sink's description, no secrets)

The store, the read-only inspection and the claim all read these files through this module.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

_SEGMENT = re.compile(r"^(\d{20})\.seg$")
ACK_FILE = "ack"
#: the file in a spool folder naming the destination its data is meant for
DESTINATION_FILE = "destination"


def segment_name(seg: int) -> str:
    return f"{seg:020d}.seg"


def segments(directory: Path) -> dict[int, int]:
    """Segment number -> size in bytes, oldest first."""
    sizes: dict[int, int] = {}
    for p in sorted(directory.iterdir()):
        m = _SEGMENT.match(p.name)
        if m:
            sizes[int(m.group(1))] = p.stat().st_size
    return sizes


def ack_text(seg: int, off: int) -> bytes:
    """The ack file's content: fixed width (overwritten in place), with a CRC to tell a torn write."""
    head = f"{seg:020d} {off:020d}"
    return f"{head} {zlib.crc32(head.encode()):08x}\n".encode()


def read_ack(directory: Path) -> tuple[int, int] | None:
    """The saved read position ``(segment, offset)``, if there is a readable one (else: read from the start)."""
    try:
        text = (directory / ACK_FILE).read_text()
        fields = text.split()
        seg, off = int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) == 2 or text.encode() == ack_text(seg, off):  # two fields: written by an older gpulse
        return seg, off
    return None  # torn


def recorded_destination(directory: str | os.PathLike[str]) -> str | None:
    """The destination a spool's data is meant for, as recorded by the agent (None: not recorded)."""
    try:
        text = (Path(directory) / DESTINATION_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def open_read(path: Path) -> int | None:
    """A read-only descriptor of ``path``, or None if it cannot be opened (the reader treats it as damage)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def fsync_dir(directory: Path) -> None:
    """Make ``directory``'s entries (a new segment, a renamed one) durable; best effort."""
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
