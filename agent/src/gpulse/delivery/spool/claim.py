"""A spool belongs to its destination: data spooled for one database is not replayed into another.

Before the agent opens ``<spool_dir>/<sink name>``, :func:`claim_spool` keeps aside a folder whose
recorded destination differs (as ``<sink name>.held-<n>``) and brings back one kept for this
destination.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpulse.delivery.spool.inspect import SpoolSummary, inspect_folder
from gpulse.delivery.spool.layout import (
    ACK_FILE,
    DESTINATION_FILE,
    ack_text,
    fsync_dir,
    read_ack,
    recorded_destination,
    segment_name,
    segments,
)
from gpulse.util.files import private_dir, write_all

log = logging.getLogger("gpulse.spool")

#: a sink's spool kept aside because it was meant for another destination: ``<sink name>.held-<n>``
HELD = ".held-"


def claim_spool(
    spool_dir: str | os.PathLike[str], name: str, destination: str, *, replay_elsewhere: bool = False
) -> list[SpoolSummary]:
    """Make ``spool_dir/name`` the spool of ``destination`` before the agent opens it.

    Data spooled for another destination (the agent restarted with another URL, API, org/bucket or
    database) is not replayed here: that folder is kept aside as ``<name>.held-<n>`` and logged, with
    the flag that replays it anyway; a folder kept earlier for this very destination comes back. With
    ``replay_elsewhere`` (``--replay-spool-to-new-destination``) every kept folder is replayed here.
    Returns the folders still kept aside. A spool without a recorded destination (written before
    destinations were recorded) belongs to whoever opens it."""
    root = Path(spool_dir)
    own = root / name
    if own.is_dir():
        found = recorded_destination(own)
        if found is not None and found != destination and _waiting(own) and not replay_elsewhere:
            own.rename(_free_held_path(root, name))
    private_dir(own)
    kept: list[SpoolSummary] = []
    for folder in sorted(p for p in root.glob(f"{name}{HELD}*") if p.is_dir()):
        meant_for = recorded_destination(folder)
        summary = inspect_folder(folder, folder.name)
        if replay_elsewhere or meant_for == destination:
            log.warning(
                "spool %s: %d lines meant for %s are replayed into %s%s",
                folder,
                summary.lines,
                meant_for,
                destination,
                " (--replay-spool-to-new-destination)" if meant_for != destination else "",
            )
            _merge(folder, own)
        else:
            kept.append(summary)
            log.warning(
                "spool %s holds %d lines (%d bytes) meant for %s, not for %s: kept, not replayed. To deliver them "
                "to %s instead, restart the agent once with --replay-spool-to-new-destination; to deliver them "
                "where they were meant to go, run the agent with that destination again.",
                folder,
                summary.lines,
                summary.bytes,
                meant_for,
                destination,
                destination,
            )
    if recorded_destination(own) != destination:
        _save_text(own / DESTINATION_FILE, destination + "\n")
    return kept


def _waiting(directory: Path) -> bool:
    """Whether a spool folder has anything past its read position."""
    ack_seg, ack_off = read_ack(directory) or (0, 0)
    return any(seg > ack_seg or (seg == ack_seg and size > ack_off) for seg, size in segments(directory).items())


def _free_held_path(root: Path, name: str) -> Path:
    n = 1
    while (root / f"{name}{HELD}{n}").exists():
        n += 1
    return root / f"{name}{HELD}{n}"


def _merge(src: Path, dst: Path) -> None:
    """Move ``src``'s waiting segments behind ``dst``'s (renumbered), keeping ``src``'s read position when
    ``dst`` has nothing waiting; then remove ``src``. Records already delivered may come again: harmless."""
    dst_sizes = segments(dst)
    dst_ack = read_ack(dst)
    ack_seg, ack_off = read_ack(src) or (0, 0)
    number = max(max(dst_sizes, default=0), dst_ack[0] if dst_ack else 0) + 1
    first: tuple[int, int] | None = None
    for seg in segments(src):
        path = src / segment_name(seg)
        if seg < ack_seg:
            path.unlink()  # delivered already
            continue
        os.rename(path, dst / segment_name(number))
        if first is None:
            first = (number, ack_off if seg == ack_seg else 0)
        number += 1
    if not dst_sizes and first is not None:
        _save_text(dst / ACK_FILE, ack_text(*first).decode())
    fsync_dir(dst)
    for leftover in src.iterdir():
        leftover.unlink()
    src.rmdir()


def _save_text(path: Path, text: str) -> None:
    """Replace ``path``'s content atomically and durably (a crash leaves the old or the new text, never half)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
