"""What a spool holds, read without changing anything: for ``gpulse doctor`` and ``gpulse status``.

It walks the segments with the same reader as the store (:mod:`.damage`), so the damage it reports
is what a replay will skip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpulse.delivery.spool.damage import Damage, walk
from gpulse.delivery.spool.layout import open_read, read_ack, recorded_destination, segment_name, segments


@dataclass(frozen=True)
class SpoolSummary:
    """What a spool holds, read without changing anything.

    For :func:`inspect_spool` on the agent's ``--spool-dir``: the figures are totals over the folder
    itself and every sink's subfolder (the agent spools into ``<spool_dir>/<sink name>/``), and
    ``sinks`` has one summary per subfolder."""

    path: Path
    #: the sink's subfolder name ("" for the directory given)
    name: str
    #: the destination the spooled data was meant for (a sink's description, no secrets), if recorded
    destination: str | None
    segments: int
    #: intact records waiting to be delivered (from the read position on), and their lines
    records: int
    lines: int
    #: bytes on disk
    bytes: int
    #: the timestamp (ns) of the first waiting line: how long data has waited
    oldest_point_ns: int | None
    #: damaged (torn or corrupt) records in the waiting part, the bytes the reader will skip and the
    #: lines lost with them (estimated by their newlines where a header is unreadable)
    damaged_records: int
    damaged_bytes: int
    damaged_lines: int
    sinks: tuple[SpoolSummary, ...] = ()


def inspect_spool(directory: str | os.PathLike[str]) -> SpoolSummary:
    """Read a spool directory and each sink's subfolder without changing anything (the agent's
    :class:`Spool` deletes and re-points as it opens, which a diagnosis must not do).

    Raises ``OSError`` when the directory cannot be read."""
    root = Path(directory)
    own = inspect_folder(root, "")
    sinks = tuple(inspect_folder(p, p.name) for p in sorted(root.iterdir()) if p.is_dir())
    every = (own, *sinks)
    oldest = [s.oldest_point_ns for s in every if s.oldest_point_ns is not None]
    return SpoolSummary(
        path=root,
        name="",
        destination=own.destination,
        segments=sum(s.segments for s in every),
        records=sum(s.records for s in every),
        lines=sum(s.lines for s in every),
        bytes=sum(s.bytes for s in every),
        oldest_point_ns=min(oldest, default=None),
        damaged_records=sum(s.damaged_records for s in every),
        damaged_bytes=sum(s.damaged_bytes for s in every),
        damaged_lines=sum(s.damaged_lines for s in every),
        sinks=sinks,
    )


def inspect_folder(directory: Path, name: str) -> SpoolSummary:
    sizes = segments(directory)
    ack_seg, ack_off = read_ack(directory) or (0, 0)
    records = lines = 0
    oldest: int | None = None
    damage: list[Damage] = []
    for seg, size in sizes.items():
        if seg < ack_seg:
            continue  # delivered; the agent deletes it when it next opens the spool
        fd = open_read(directory / segment_name(seg))
        try:
            start = ack_off if seg == ack_seg and 0 <= ack_off <= size else 0
            for item in walk(fd, seg, start, size):
                if isinstance(item, Damage):
                    damage.append(item)
                    continue
                records, lines = records + 1, lines + len(item.lines)
                if oldest is None and item.lines:
                    oldest = _timestamp(item.lines[0])
        finally:
            if fd is not None:
                os.close(fd)
    return SpoolSummary(
        path=directory,
        name=name,
        destination=recorded_destination(directory),
        segments=len(sizes),
        records=records,
        lines=lines,
        bytes=sum(sizes.values()),
        oldest_point_ns=oldest,
        damaged_records=len(damage),
        damaged_bytes=sum(d.end - d.start for d in damage),
        damaged_lines=sum(d.lines for d in damage),
    )


def _timestamp(line: str) -> int | None:
    """The timestamp at the end of a line of line protocol (None if it has none)."""
    tail = line.rstrip("\n").rpartition(" ")[2]
    return int(tail) if tail.lstrip("-").isdigit() else None
