"""Files that must survive a crash or stay private: one way to append durably, one way to make a private directory."""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until everything is written (a short write is possible on any file)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
