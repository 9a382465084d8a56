"""The dead-letter file: lines a database refused for good, each group under the server's reason.

The reason is a ``#`` comment line, so after fixing the cause the file is valid input for the
write API again (comments are ignored). The file is capped (default 100 MiB): a stream of bad lines
must not fill the disk; beyond the cap, lines are only counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpulse.util.countlog import CountedLog
from gpulse.util.files import append_fsync, open_append

log = logging.getLogger("gpulse.delivery")


class DeadLetter:
    def __init__(self, path: str | os.PathLike[str] | None, max_bytes: int = 100 << 20) -> None:
        self.path = Path(path) if path is not None else None
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._log = CountedLog(log)

    def write(self, lines: Sequence[str], reason: str) -> None:
        """Keep ``lines`` with ``reason``; logs (at most once a minute) and never raises."""
        reason = " ".join(reason.split())[:2000]
        self._log.log(
            "rejected",
            logging.WARNING,
            "the database rejected %d line(s): %s (kept in %s)",
            len(lines),
            reason,
            self.path or "no dead-letter file",
        )
        if self.path is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = f"# gpulse dead letter {stamp}: {reason}\n" + "".join(lines)
        data = text.encode("utf-8", "replace")
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if self.path.exists() and self.path.stat().st_size + len(data) > self.max_bytes:
                    self._log.log(
                        "dl-full",
                        logging.ERROR,
                        "dead-letter file %s is full; rejected lines are only counted",
                        self.path,
                    )
                    return
                fd = open_append(self.path)
                try:
                    append_fsync(fd, data)
                finally:
                    os.close(fd)
            except OSError as e:
                self._log.log("dl-error", logging.ERROR, "cannot write the dead-letter file %s: %s", self.path, e)
