"""The channel's offline form: points no agent acknowledged, as line protocol in a private file.

A training client that cannot hand its points to an agent (none listening, no acknowledgement in
time, a socket it does not trust, a full buffer) appends them here, tagged with the agent's
``host`` as the agent would, so that ``gpulse upload`` later writes exactly the series the agent
would have written (a point uploaded twice overwrites itself). The file is the user's run data:
it is created 0600, like the agent's own files.

The lines are the agent's encoder's (:mod:`gpulse.lineprotocol.encode`), with one shortcut for
step points (:class:`~gpulse.channel.protocol.NumericPoint`): once a shape's first point has been
encoded the usual way, its field keys and types are known, and the next points of that shape are
one ``%`` format; durations are written from their integer nanoseconds as ``<ns>e-9``, a float
InfluxDB (checked against 1.x's parser) and ``gpulse upload`` read as exactly ``ns / 1e9``.

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

from gpulse.channel.protocol import KIND_FLOAT, KIND_INT, KIND_NS, RECORD_FILE, FieldShape, NumericPoint, Point
from gpulse.lineprotocol.encode import Encoder

__all__ = ["PRIVATE_FILE_MODE", "RECORD_FILE", "PartialRecording", "Recorder", "open_private"]
#: Mode of files holding a run's data (the recording, ``metrics_report.json``): the user's only.
PRIVATE_FILE_MODE = 0o600
#: Line-protocol value formats by (schema type, how the shape carries the value).
_LP_VALUE = {("i", KIND_INT): "%di", ("f", KIND_FLOAT): "%r", ("f", KIND_NS): "%de-9"}
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
        #: (series head, host) -> the line prefix; shape -> its fields template (``None``: not possible)
        self._prefixes: dict[tuple[object, str], bytes] = {}
        self._templates: dict[FieldShape, bytes | None] = {}

    def write(self, points: Iterable[Point], host: str) -> int:
        """Append ``points`` tagged with ``host``; returns the lines written.

        Raises :class:`PartialRecording` when the file took only some of them, other ``OSError``
        when it could not be opened."""
        lines = []
        templates = self._templates
        head: object = None
        prefix = b""
        for p in points:
            if type(p) is NumericPoint:
                template = templates.get(p.shape)
                if template is not None:  # the shortcut (see the module's docstring)
                    if p.head is not head:
                        head, prefix = p.head, self._prefix(p, host)
                    lines.append(b"%s %s %d\n" % (prefix, template % p.values, p.ts))
                    continue
                line = self._first_line(p, host)
            else:
                line = self._line(p, host)
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

    def _first_line(self, p: NumericPoint, host: str) -> bytes | None:
        """A step point of a shape without a template: the encoder's own way, which learns the
        shape's keys, then the template when one is possible (tried once per shape)."""
        line = self._line(p, host)
        if p.shape not in self._templates:
            if len(self._templates) >= MAX_TEMPLATES:
                self._templates.clear()
            self._templates[p.shape] = self._template(p, host) if line is not None else None
        return line

    def _prefix(self, p: NumericPoint, host: str) -> bytes:
        key = (p.head, host)
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) >= MAX_TEMPLATES:
                self._prefixes.clear()
            series = self._encoder.series(p.measurement, {**p.tags, "host": host})
            prefix = self._prefixes[key] = series.prefix.encode()
        return prefix

    def _template(self, p: NumericPoint, host: str) -> bytes | None:
        """The fields of ``p``'s shape as a ``%`` format, when the encoder keeps every one of them
        with the type the shape carries (else ``None``: such points take the encoder's way)."""
        specs = self._encoder.series(p.measurement, {**p.tags, "host": host}).specs
        parts = []
        for name, kind in zip(p.shape.names, p.shape.kinds, strict=True):
            spec = specs.get(name)
            value = _LP_VALUE.get((spec[1], kind)) if spec is not None else None
            if value is None:
                return None
            parts.append(spec[0].replace("%", "%%") + value)  # type: ignore[index]
        return ",".join(parts).encode()  # bytes: formatting them is faster than str

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
