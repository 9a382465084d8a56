"""``--record FILE``: append the line protocol to a local file, fsynced per batch.

The file holds plain lines, exactly what InfluxDB's write API accepts (``gpulse upload FILE``,
``influx write -f FILE`` or ``curl --data-binary @FILE``). Re-sending the same line overwrites the
same point, so a file that overlaps what the database already has is harmless.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gpulse.sinks.base import ErrorKind, Sink, WriteError, encode_body
from gpulse.util.files import append_fsync, open_append


class RecordSink(Sink):
    name = "record"
    is_database = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None

    def write(self, lines: Sequence[str]) -> None:
        try:
            if self._fd is None:
                self._fd = open_append(self.path)
            append_fsync(self._fd, encode_body(lines))  # all of the batch or none of it: never a torn line
        except OSError as e:
            self.close()
            raise WriteError(ErrorKind.TRANSIENT, f"cannot write {self.path}: {e.strerror or e}") from None

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def describe(self) -> str:
        return f"record file {self.path}"
