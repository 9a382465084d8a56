"""A real full disk for tests: a small tmpfs, mounted for one program only (a private mount namespace).

As root a mount namespace is enough; otherwise a user namespace maps the user to root inside it, so
the same tests run as root (CI) and as a user (where unprivileged user namespaces are allowed).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def on_tmpfs(mountpoint: Path, size: str) -> list[str]:
    """A command prefix that runs a program with a fresh tmpfs of ``size`` (e.g. ``"64k"``) on
    ``mountpoint``, seen by that program only. It execs: the program keeps the pid, so signals reach it."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    mount = 'mount -t tmpfs -o size="$1",mode=0700 gpulse-test "$0" && shift && exec "$@"'
    prefix = ["unshare", *user, "--mount", "--propagation", "private", "sh", "-c", mount, str(mountpoint), size]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    assert probe.returncode == 0, f"cannot mount a test tmpfs (needs root or user namespaces): {probe.stderr}"
    return prefix


def fill(directory: str | Path, leave: int = 4096) -> None:
    """Fill the filesystem of ``directory`` (a test tmpfs), then free ``leave`` bytes again (a page:
    room for a few lines, not for all). Run inside the program that has the tmpfs mounted."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    os.ftruncate(fd, os.fstat(fd).st_size - leave)
    os.close(fd)
