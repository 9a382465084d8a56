"""The channel's offline form: points no agent acknowledged, in a private file for ``gpulse upload``.

A training client that cannot hand its points to an agent (none listening, no acknowledgement in
time, a socket it does not trust, a full buffer) appends them here, tagged with the agent's
``host`` as the agent would, so that ``gpulse upload`` later writes exactly the series the agent
would have written (a point uploaded twice overwrites itself). The file is the user's run data:
it is created 0600, like the agent's own files.

It is a file of lines, each a message the agent would have received, so that writing it formats
nothing. Step rows (:class:`~gpulse.channel.protocol.StepRows`), nearly all of a run's points, are
kept as rows datagrams: a line ``@gpulse-rows <count> <base64>`` holds up to
:data:`ROWS_PER_LINE` of them, packed, no number formatted. Any other point (the run's start and
end, events) is a line ``@gpulse-point <json>``, its channel message. Why: formatting line protocol
(three floats in 17 digits a step) costs several times what packing does, and a run without an
agent would pay it on its own background thread; and importing the line-protocol encoder's modules
costs CPU that the first recording would pay on that thread while holding the GIL, so the training
loop would stand still for as long. The formatting is done by
whoever reads the file (:func:`read_records`: ``gpulse upload``, ``gpulse report --from-file``),
with the agent's own reading of a datagram (:func:`~gpulse.channel.protocol.decode_rows`) and the
agent's encoder, so a recorded point
becomes the very line the agent would have written (the same text, not only the same value). Steps
with more fields than a point may have, or names that alone fill a datagram, are written as
``@gpulse-point`` lines, one a step. These lines are not line protocol: InfluxDB's own tools reject
them (loudly, never skipping them as comments). Plain line-protocol lines (an agent's ``--record``
file, a recording of an older version) are read as they are.

An append never leaves half a line: ranks that share the file take a lock around their append, and
when the disk fills up the part of the last line that was written is cut away again
(:class:`PartialRecording` says how many whole points made it).

Imported only when something must be recorded or read (``import gpulse.training`` stays cheap); writing
imports nothing beyond the channel's protocol, reading imports the agent's encoder.
"""

from __future__ import annotations

import binascii
import fcntl
import os
import stat
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from gpulse.channel.protocol import (
    RECORD_FILE,
    Point,
    PointHead,
    Rejected,
    StepRows,
    decode_json,
    decode_rows,
    encode,
    encode_rows,
    rows_per_datagram,
)

if TYPE_CHECKING:
    from pathlib import Path

    from gpulse.lineprotocol.encode import Encoder
    from gpulse.lineprotocol.parse import LineError
    from gpulse.lineprotocol.parse import ParsedLine as LinePoint

__all__ = [
    "MARK", "POINT_MARK", "PRIVATE_FILE_MODE", "RECORD_FILE", "ROWS_MARK", "PartialRecording", "Recorder", "count_records",
    "open_private", "read_records",
]  # fmt: skip
#: Mode of files holding a run's data (the recording, ``metrics_report.json``): the user's only.
PRIVATE_FILE_MODE = 0o600
#: How a line that is not line protocol starts: a channel message (the module's docstring).
MARK = "@gpulse-"
#: How a line of step rows starts (then the number of rows, a space, the rows datagram in base64).
ROWS_MARK = MARK + "rows "
#: How a line of one point starts (then its channel message, JSON).
POINT_MARK = MARK + "point "
#: Step rows per ``@gpulse-rows`` line at most: its header is then a few percent of the line, and a
#: nearly full disk still takes some lines.
ROWS_PER_LINE = 64
#: Series heads (with the ``host`` tag) a recorder keeps.
MAX_HEADS = 1024
_ROWS = ROWS_MARK.encode()
_POINT = POINT_MARK.encode()


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
    """An append failed (a full disk): ``written`` points are in the file in whole lines, ``lost``
    are not, and no part of a line is."""

    def __init__(self, cause: OSError, written: int, lost: int) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.written = written
        self.lost = lost


class Recorder:
    """Appends points to one recording file, a whole number of lines per call."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        #: (series head, host) -> the head with the ``host`` tag, as the rows lines carry it
        self._heads: dict[tuple[PointHead, str], PointHead] = {}

    def write(self, points: Iterable[Point | StepRows], host: str) -> int:
        """Append ``points`` (and the points of step rows) tagged with ``host``; returns the points written.

        Raises :class:`PartialRecording` when the file took only some of them, other ``OSError``
        when it could not be opened."""
        lines: list[bytes] = []
        counts: list[int] = []  # points per line
        for p in points:
            if type(p) is StepRows:
                self._rows(p, host, lines, counts)
            else:
                self._line(p, host, lines, counts)  # type: ignore[arg-type]
        if not lines:
            return 0
        if self._fd is None:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
        self._append(lines, counts)
        return sum(counts)

    def _line(self, p: Point, host: str, lines: list[bytes], counts: list[int]) -> None:
        try:
            data = encode(Point(p.measurement, p.ts, {**p.tags, "host": host}, p.fields))  # a file has no seq
        except ValueError:  # NaN or infinity, which the agent refuses too (the client drops such points first)
            return
        lines.append(b"%s%s\n" % (_POINT, data))  # JSON escapes newlines: one line
        counts.append(1)

    def _rows(self, batch: StepRows, host: str, lines: list[bytes], counts: list[int]) -> None:
        """``@gpulse-rows`` lines of :data:`ROWS_PER_LINE` rows (the module's docstring)."""
        key = (batch.head, host)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()
            head = self._heads[key] = PointHead(batch.head.measurement, {**batch.head.tags, "host": host})
        shape, rows = batch.shape, batch.rows
        per = min(ROWS_PER_LINE, rows_per_datagram(head, shape))
        if not per:  # more fields than a point may have, or names that fill a datagram: a point a line
            for p in batch.points():
                self._line(p, host, lines, counts)
            return
        for i in range(0, len(rows), per):
            part = rows[i : i + per]
            data = encode_rows(StepRows(head, shape, part), 0)  # a file has no seq: 0
            lines.append(b"%s%d %s" % (_ROWS, len(part), binascii.b2a_base64(data)))  # b2a ends it in a newline
            counts.append(len(part))

    def _append(self, lines: list[bytes], counts: list[int]) -> None:
        """Append whole lines (``counts[i]`` points in ``lines[i]``), under a lock shared with other
        ranks' recorders of this file.

        On a failed write (ENOSPC) the file is cut back to its last whole line, so it never ends in
        a torn one; :class:`PartialRecording` says how many points made it."""
        fd = self._fd
        assert fd is not None
        data = b"".join(lines)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            start = os.fstat(fd).st_size  # O_APPEND: this append starts at the end, which the lock holds still
            done = 0
            try:
                view = memoryview(data)
                while done < len(data):  # a short write (full disk) continues where it stopped
                    done += os.write(fd, view[done:])
            except OSError as exc:
                whole = written = 0
                for line, count in zip(lines, counts, strict=True):
                    if whole + len(line) > done:
                        break
                    whole += len(line)
                    written += count
                os.ftruncate(fd, start + whole)
                raise PartialRecording(exc, written, sum(counts) - written) from exc
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


# -- reading ----------------------------------------------------------------------------------------
def read_records(path: str | Path) -> Iterator[tuple[int, str, LinePoint | LineError]]:
    """Every point of a recording file (a run's, or an agent ``--record`` file of plain line
    protocol) as ``(line number, its line protocol, Point or LineError)``: the points of a rows line
    share its number, each with the line the agent's encoder writes for it. A damaged line is
    reported alone (:func:`gpulse.lineprotocol.parse.read_lines`)."""
    from gpulse.lineprotocol.encode import Encoder
    from gpulse.lineprotocol.parse import read_lines

    encoder = Encoder()
    return read_lines(path, (MARK, lambda line: _expand(line, encoder)))


def _expand(line: str, encoder: Encoder) -> Iterator[tuple[str, LinePoint | LineError]]:
    """The points of one ``@gpulse-`` line, read as the agent reads a datagram: a rows line's rows, or
    a point line's point."""
    from gpulse.lineprotocol.parse import LineError, parse_line

    shown = line[:80]
    kind = line[len(MARK) :].split(" ", 1)[0]
    try:
        if line.startswith(ROWS_MARK):
            count, b64 = line[len(ROWS_MARK) :].split(" ", 1)
            messages = decode_rows(binascii.a2b_base64(b64, strict_mode=True))
            if len(messages) != int(count):
                raise ValueError(f"{len(messages)} rows where the line says {count}")
        elif line.startswith(POINT_MARK):
            messages = [decode_json(line[len(POINT_MARK) :].encode())]  # no datagram limit: a wide step is one line
        else:
            raise ValueError("not a kind of line this version writes")
        texts = []
        for msg in messages:
            text = encoder.line(encoder.series(msg["m"], msg["tags"]), msg["fields"], msg["ts"])
            if text is not None:
                texts.append(text)
    except Rejected as exc:
        yield shown, LineError(f"a {kind} line the agent would refuse ({exc})")
        return
    except (ValueError, TypeError, AttributeError, KeyError, binascii.Error) as exc:  # base64, count, m, tags...
        yield shown, LineError(f"a damaged {kind} line ({exc})")
        return
    for text in texts:
        try:
            yield text, parse_line(text)
        except LineError as exc:
            yield text, exc


def count_records(path: str | Path) -> int:
    """How many items :func:`read_records` yields for a whole file, without decoding a point (a
    damaged rows line counts as the rows it says it holds): the total of a progress bar."""
    n = 0
    with open(path, "rb") as f:
        for data in f:
            stripped = data.strip()
            if stripped.startswith(_ROWS):
                count = stripped[len(_ROWS) :].split(b" ", 1)[0]
                n += int(count) if count.isdigit() else 1
            else:
                n += bool(stripped) and not stripped.startswith(b"#")
    return n
