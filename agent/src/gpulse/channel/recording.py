"""The channel's offline form: points no agent acknowledged, as line protocol in a private file.

A training client that cannot hand its points to an agent (none listening, no acknowledgement in
time, a socket it does not trust, a full buffer) appends them here, tagged with the agent's
``host`` as the agent would, so that ``gpulse upload`` later writes exactly the series the agent
would have written (a point uploaded twice overwrites itself). The file is the user's run data:
it is created 0600, like the agent's own files.

Imported only when something must be recorded: the line-protocol encoder is not needed on the
happy path, and ``import gpulse.training`` stays cheap.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from gpulse.channel.protocol import RECORD_FILE, Point
from gpulse.lineprotocol.encode import Encoder

__all__ = ["PRIVATE_FILE_MODE", "RECORD_FILE", "Recorder", "open_private"]
#: Mode of files holding a run's data (the recording, ``metrics_report.json``): the user's only.
PRIVATE_FILE_MODE = 0o600


def open_private(path: str, flags: int) -> int:
    """``os.open`` creating ``path`` 0600; a file of ours left wider by an older version is narrowed."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode):
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


class Recorder:
    """Appends points to one recording file; a single ``write`` per call, so ranks sharing a file never interleave lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._encoder = Encoder()
        self._fd: int | None = None

    def write(self, points: Iterable[Point], host: str) -> int:
        """Append ``points`` tagged with ``host``; returns the lines written. Raises ``OSError``."""
        enc = self._encoder
        lines = []
        for p in points:
            line = enc.line(enc.series(p.measurement, {**p.tags, "host": host}), p.fields, p.ts)
            if line is not None:
                lines.append(line)
        if not lines:
            return 0
        if self._fd is None:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
        data = memoryview("".join(lines).encode())
        while data:  # O_APPEND: one write lands whole; a short write (full disk) continues where it stopped
            data = data[os.write(self._fd, data) :]
        return len(lines)

    def close(self) -> None:
        """fsync and close (raises ``OSError``); a recorder that wrote nothing has no file."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
