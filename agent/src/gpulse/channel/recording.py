"""The channel's offline form: points no agent acknowledged, as line protocol in a private file.

A training client that cannot hand its points to an agent (none listening, no acknowledgement in
time, a socket it does not trust, a full buffer) appends them here, tagged with the agent's
``host`` as the agent would, so that ``gpulse upload`` later writes exactly the series the agent
would have written (a point uploaded twice overwrites itself). The file is the user's run data:
it is created 0600, like the agent's own files.

The lines are the agent's encoder's (:mod:`gpulse.lineprotocol.encode`), with one shortcut for
step rows (:class:`~gpulse.channel.protocol.StepRows`): once a shape's first row has been encoded
the usual way, its field keys and types are known, and each next row of that shape is one ``%``
format of the whole line; durations are written from their integer nanoseconds as ``<ns>e-9``, a
float InfluxDB (checked against 1.x's parser) and ``gpulse upload`` read as exactly ``ns / 1e9``.

An append never leaves half a line: ranks that share the file take a lock around their append, and
when the disk fills up the part of the last line that was written is cut away again
(:class:`PartialRecording` says how many whole lines made it).

Imported only when something must be recorded: the line-protocol encoder is not needed on the
happy path, and ``import gpulse.training`` stays cheap.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterable

from gpulse.channel.protocol import KIND_FLOAT, KIND_INT, KIND_NS, RECORD_FILE, FieldShape, Point, PointHead, StepRows
from gpulse.lineprotocol.encode import Encoder

__all__ = ["PRIVATE_FILE_MODE", "RECORD_FILE", "PartialRecording", "Recorder", "open_private"]
#: Mode of files holding a run's data (the recording, ``metrics_report.json``): the user's only.
PRIVATE_FILE_MODE = 0o600
#: Line-protocol value formats by (schema type, how the shape carries the value). A float is written
#: with 17 significant digits, which read back as the very same double (IEEE 754 binary64 needs at
#: most 17) and format faster than ``repr``'s shortest form: the text may differ from the agent's
#: (``0.10000000000000001`` for ``0.1``), the stored value does not.
_LP_VALUE = {("i", KIND_INT): "%di", ("f", KIND_FLOAT): "%.17g", ("f", KIND_NS): "%de-9"}
#: Shapes whose line template a recorder keeps.
MAX_TEMPLATES = 1024


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


class PartialRecording(OSError):
    """An append failed (a full disk): ``written`` whole lines are in the file, ``lost`` are not,
    and no part of a line is."""

    def __init__(self, cause: OSError, written: int, lost: int) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.written = written
        self.lost = lost


class Recorder:
    """Appends points to one recording file, a whole number of lines per call."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._encoder = Encoder()
        self._fd: int | None = None
        #: (series head, shape, host) -> the line template of such rows (``None``: not possible)
        self._templates: dict[tuple[PointHead, FieldShape, str], bytes | None] = {}

    def write(self, points: Iterable[Point | StepRows], host: str) -> int:
        """Append ``points`` (and the points of step rows) tagged with ``host``; returns the lines written.

        Raises :class:`PartialRecording` when the file took only some of them, other ``OSError``
        when it could not be opened."""
        lines: list[bytes] = []
        for p in points:
            if type(p) is StepRows:
                self._rows(p, host, lines)
            else:
                line = self._line(p, host)  # type: ignore[arg-type]
                if line is not None:
                    lines.append(line)
        if not lines:
            return 0
        if self._fd is None:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
        self._append(b"".join(lines), len(lines))
        return len(lines)

    def _line(self, p: Point, host: str) -> bytes | None:
        enc = self._encoder
        line = enc.line(enc.series(p.measurement, {**p.tags, "host": host}), p.fields, p.ts)
        return None if line is None else line.encode()

    def _rows(self, batch: StepRows, host: str, lines: list[bytes]) -> None:
        """The lines of step rows: the encoder's own way for the first row of a shape (which teaches
        the encoder the shape's keys), then one ``%`` format per row (the module's docstring)."""
        key = (batch.head, batch.shape, host)
        start = 0
        if key not in self._templates:
            first = self._line(batch[:1].points()[0], host)
            if first is not None:
                lines.append(first)
            start = 1
            if len(self._templates) >= MAX_TEMPLATES:
                self._templates.clear()
            self._templates[key] = self._template(batch, host) if first is not None else None
        template = self._templates[key]
        if template is None:
            lines.extend(filter(None, (self._line(p, host) for p in batch[start:].points())))
        else:
            lines.extend(map(template.__mod__, batch.rows[start:] if start else batch.rows))

    def _template(self, batch: StepRows, host: str) -> bytes | None:
        """The line of a row of ``batch``'s shape as a ``%`` format, when the encoder keeps every field
        with the type the shape carries (else ``None``: such rows take the encoder's way)."""
        series = self._encoder.series(batch.head.measurement, {**batch.head.tags, "host": host})
        parts = []
        for name, kind in zip(batch.shape.names, batch.shape.kinds, strict=True):
            spec = series.specs.get(name)
            value = _LP_VALUE.get((spec[1], kind)) if spec is not None else None
            if value is None:
                return None
            parts.append(spec[0].replace("%", "%%") + value)  # type: ignore[index]
        prefix = series.prefix.replace("%", "%%")
        return f"{prefix} {','.join(parts)} %d\n".encode()  # bytes: formatting them is faster than str

    def _append(self, data: bytes, lines: int) -> None:
        """Append whole lines, under a lock shared with other ranks' recorders of this file.

        On a failed write (ENOSPC) the file is cut back to its last whole line, so it never ends in
        a torn one; :class:`PartialRecording` says how many lines made it."""
        fd = self._fd
        assert fd is not None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            start = os.fstat(fd).st_size  # O_APPEND: this append starts at the end, which the lock holds still
            done = 0
            try:
                view = memoryview(data)
                while done < len(data):  # a short write (full disk) continues where it stopped
                    done += os.write(fd, view[done:])
            except OSError as exc:
                whole = data.rfind(b"\n", 0, done) + 1
                os.ftruncate(fd, start + whole)
                written = data.count(b"\n", 0, whole)
                raise PartialRecording(exc, written, lines - written) from exc
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """fsync and close (raises ``OSError``); a recorder that wrote nothing has no file."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
