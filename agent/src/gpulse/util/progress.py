"""Progress of long work, for a person watching: a bar on a terminal, a line now and then in a log.

Nothing is shown for work that ends within ``quiet_s`` (a small upload prints only its result).
On a terminal the bar is redrawn in place at most ``redraw_s`` apart; elsewhere (a log, CI) one line
is written every ``every_s`` seconds, so a long run shows it is alive without flooding the log.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24


class Progress:
    def __init__(
        self,
        total: int,
        what: str,
        *,
        label: str = "",
        stream: TextIO | None = None,
        tty: bool | None = None,
        quiet_s: float = 1.0,
        redraw_s: float = 0.2,
        every_s: float = 10.0,
        clock=time.monotonic,
    ) -> None:
        self.total = max(total, 0)
        self.what = what
        self.label = f"{label}: " if label else ""
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.quiet_s, self.redraw_s, self.every_s = quiet_s, redraw_s, every_s
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._last_shown: float | None = None
        self._drawn = False

    def update(self, done: int) -> None:
        self.done = min(done, self.total) if self.total else done
        now = self.clock()
        if now - self.start < self.quiet_s:
            return
        gap = self.redraw_s if self.tty else self.every_s
        if self._last_shown is not None and now - self._last_shown < gap:
            return
        self._last_shown = now
        self._show(now)

    def finish(self) -> None:
        """End the bar's line (the bar stays, at its last value); nothing when nothing was drawn."""
        if self._drawn and self.tty:
            self._show(self.clock())
            self.stream.write("\n")
            self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        share = self.done / self.total if self.total else 1.0
        text = f"{self.done:,} of {self.total:,} {self.what} ({share:.0%}), {rate:,.0f}/s"
        if 0 < self.done < self.total and rate > 0:
            text += f", about {_duration((self.total - self.done) / rate)} left"
        if not self.tty:
            return self.label + text
        filled = round(share * BAR_WIDTH)
        return f"{self.label}[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}"

    def _show(self, now: float) -> None:
        if self.tty:
            self.stream.write("\r" + self.line(now) + "\033[K")
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()
        self._drawn = True


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"
