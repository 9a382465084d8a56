"""The agent's live status: one line redrawn in place on a terminal, a plain log line otherwise.

On a TTY the line is redrawn at most once a second with ``\\r`` + erase-line; log records printed
in between first erase the status line (a filter on the stderr log handlers), so a log message
never ends up glued to the status text. Without a TTY (systemd, docker, CI) the same text goes to
the log every ``log_every`` seconds, which keeps journals readable.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

_ERASE = "\r\x1b[K"
log = logging.getLogger("gpulse.agent")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - loop always returns


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 1:
        return "just now"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def heard_runs(s: Mapping[str, Any]) -> set[str]:
    """The runs the agent hears from: those of its training processes and those holding a GPU.

    A CPU-only run, or a GPU run before its ranks register, counts too; the headline and the
    ``Runs:`` line of ``gpulse status`` both use this, so they never disagree.
    """
    runs = {str(p.get("run")) for p in s.get("training") or []}
    runs.update(str(g["run"]) for g in s.get("gpus") or [] if g.get("run"))
    return runs


def format_status(s: Mapping[str, Any]) -> str:
    """The one-line text for a status snapshot (also used by ``gpulse status``)."""
    gpus = s.get("gpus") or []
    lost = sum(1 for g in gpus if g.get("lost"))
    gpu_text = f"{len(gpus)} GPU" + ("s" if len(gpus) != 1 else "") + (f" ({lost} lost)" if lost else "")
    runs = heard_runs(s)
    run_text = f", {len(runs)} run(s)" if runs else ""
    spool = s.get("spool_bytes") or 0
    spool_text = f"spool {human_bytes(spool)}" if spool else "spool empty"
    dropped = s.get("lines_dropped") or 0
    drop_text = f", {dropped} dropped" if dropped else ""
    skipped = s.get("cycles_skipped") or 0
    skip_text = f", {skipped} cycles skipped" if skipped else ""
    return (
        f"{gpu_text}{run_text} | {s.get('lines_per_s', 0.0):.0f} lines/s | {spool_text}{drop_text}"
        f" | last write {human_age(s.get('last_write_age_s'))}{skip_text}"
    )


class _EraseBeforeLog(logging.Filter):
    """Erases the status line before a log record is written to the same terminal."""

    def __init__(self, owner: StatusLine) -> None:
        super().__init__()
        self.owner = owner

    def filter(self, record: logging.LogRecord) -> bool:
        self.owner.erase()
        return True


class StatusLine:
    """Call :meth:`tick` from the agent loop; it decides when and how to show the status."""

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, Any]],
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        redraw_every: float = 1.0,
        log_every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.snapshot = snapshot
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = redraw_every if self.tty else log_every
        self.clock = clock
        self._next = clock() + self.every
        self._shown = False
        self._filter: _EraseBeforeLog | None = None
        if self.tty:
            self._filter = _EraseBeforeLog(self)
            for h in self._stream_handlers():
                h.addFilter(self._filter)

    def _stream_handlers(self) -> list[logging.Handler]:
        return [
            h
            for h in logging.getLogger().handlers
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is self.stream
        ]

    def tick(self) -> bool:
        """Show the status if it is due; returns whether it did."""
        now = self.clock()
        if now < self._next:
            return False
        self._next = now + self.every
        self.show()
        return True

    def show(self) -> None:
        text = format_status(self.snapshot())
        if self.tty:
            self.stream.write(f"{_ERASE}gpulse: {text}")
            self.stream.flush()
            self._shown = True
        else:
            log.info("status: %s", text)

    def erase(self) -> None:
        if self._shown:
            self.stream.write(_ERASE)
            self._shown = False

    def close(self) -> None:
        """Leave the terminal clean (the final summary follows on its own line)."""
        if self.tty:
            self.erase()
            self.stream.flush()
            if self._filter is not None:
                for h in self._stream_handlers():
                    h.removeFilter(self._filter)
