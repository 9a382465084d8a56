"""Files that must survive a crash or stay private: one way to append durably, one way to make a private directory."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TornAppend", "append_fsync", "open_append", "private_dir", "write_all"]


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until everything is written (a short write is possible on any file)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class TornAppend(OSError):
    """An append failed and its partial data could not be cut away: the file ends in a torn fragment."""


def open_append(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """Open ``path`` for appending (created ``mode``, private by default), close-on-exec."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, mode)


def append_fsync(fd: int, data: bytes) -> None:
    """Append ``data`` to ``fd`` (opened by :func:`open_append`) and fsync: all of it is on disk, or none.

    On failure (ENOSPC, EIO) the partial write is cut away, so a reader never sees half a record or a
    torn line, and the error is raised; :class:`TornAppend` when even the cut failed."""
    start = os.fstat(fd).st_size
    try:
        write_all(fd, data)
        os.fsync(fd)
    except OSError as e:
        try:
            os.ftruncate(fd, start)
        except OSError:
            raise TornAppend(e.errno, e.strerror) from e
        raise


def private_dir(path: str | os.PathLike[str], mode: int = 0o700, *, must_own: bool = True) -> Path:
    """Create directory ``path`` (and its parents) with ``mode``, or tighten an existing one of ours to it.

    A directory of another user is refused (``PermissionError``: someone else could read or plant
    files there) unless ``must_own`` is false, for a parent such as ``/tmp`` that only holds ours."""
    p = Path(path)
    p.mkdir(mode=mode, parents=True, exist_ok=True)
    st = p.stat()
    if st.st_uid != os.getuid():
        if must_own:
            raise PermissionError(f"directory {p} belongs to another user (uid {st.st_uid})")
        return p
    if st.st_mode & 0o777 & ~mode:
        os.chmod(p, mode)
    return p
