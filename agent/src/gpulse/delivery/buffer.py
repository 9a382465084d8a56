"""Lines waiting to be cut into batches: never blocks the producer, bounded in memory.

Every submitted line gets a *ticket* (the cumulative count of lines submitted), so
"everything up to ticket T is safe" is one integer (see ``Delivery.durable_upto``). Batches are
cut by line count and by bytes (characters of line protocol, i.e. bytes for ASCII lines); the
delivery thread cuts the remainder once per flush interval.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field


def batched(lines: Iterable[str], max_lines: int, max_bytes: int) -> Iterator[list[str]]:
    """Consecutive ``lines`` in batches of at most ``max_lines`` lines and ``max_bytes`` characters
    (a single longer line makes a batch alone). Lazy: reads one line past a batch, never more.

    The one batching rule: the agent's :class:`LineBuffer` and the one-shot ``deliver_batches`` both use it."""
    chunk: list[str] = []
    size = 0
    for line in lines:
        if chunk and (len(chunk) >= max_lines or size + len(line) > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(line)
        size += len(line)
    if chunk:
        yield chunk


@dataclass
class Batch:
    """Consecutive lines ``start+1 .. end`` (tickets) of one process, or a batch replayed from the spool."""

    lines: list[str]
    end: int
    start: int
    nbytes: int
    #: the :class:`~gpulse.delivery.pipeline.Delivery` instance that cut it; a spooled batch of an earlier run has another
    epoch: int = 0
    cut_at: float = field(default_factory=time.monotonic)

    def __len__(self) -> int:
        return len(self.lines)


class LineBuffer:
    """Thread-safe FIFO of submitted lines. Beyond ``hard_max_bytes`` the oldest lines are dropped and counted."""

    def __init__(self, max_lines: int, max_bytes: int, hard_max_bytes: int, epoch: int = 0) -> None:
        if max_lines < 1 or max_bytes < 1:
            raise ValueError("max_lines and max_bytes must be positive")
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.hard_max_bytes = max(hard_max_bytes, max_bytes)
        self.epoch = epoch
        self._lock = threading.Lock()
        self._lines: deque[str] = deque()
        self._bytes = 0
        self.ticket = 0  # lines submitted so far
        self.cut_upto = 0  # tickets cut into batches (or dropped)
        self.dropped = 0
        #: the first ticket dropped for the memory cap, minus one: nothing from there on is ever durable
        self.lost_from: int | None = None

    def add(self, lines: Sequence[str]) -> tuple[int, bool]:
        """Append ``lines``; returns (ticket, a full batch is ready)."""
        with self._lock:
            self._lines.extend(lines)
            self._bytes += sum(map(len, lines))
            self.ticket += len(lines)
            while self._bytes > self.hard_max_bytes and len(self._lines) > 1:
                self._bytes -= len(self._lines.popleft())
                if self.lost_from is None:
                    self.lost_from = self.cut_upto
                self.dropped += 1
                self.cut_upto += 1
            full = len(self._lines) >= self.max_lines or self._bytes >= self.max_bytes
            return self.ticket, full

    @property
    def lines(self) -> int:
        return len(self._lines)

    def cut(self, force: bool) -> list[Batch]:
        """Every full batch; with ``force`` also the partial remainder."""
        out: list[Batch] = []
        with self._lock:
            if not self._lines:
                return out
            chunks = list(batched(self._lines, self.max_lines, self.max_bytes))
            last = chunks[-1]
            keep: list[str] = []
            if not force and len(last) < self.max_lines and sum(map(len, last)) < self.max_bytes:
                keep = chunks.pop()  # not full yet: it waits for more lines or the flush interval
            self._lines = deque(keep)
            for lines in chunks:
                size = sum(map(len, lines))
                self._bytes -= size
                start = self.cut_upto
                self.cut_upto += len(lines)
                out.append(Batch(lines, end=self.cut_upto, start=start, nbytes=size, epoch=self.epoch))
        return out
