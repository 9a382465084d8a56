"""Real cgroups for attribution tests: directories in the host's cgroup file systems, real processes in them.

Nothing here stands in for anything: the kernel writes ``/proc/PID/cgroup`` of a process that
:meth:`CgroupTree.start` moved into a cgroup, exactly as it does for slurmstepd's and the kubelet's
tasks. Each tree lives under a directory of its own (``gpulse-test-<random>``) in every hierarchy
it touches, and :meth:`CgroupTree.close` moves the processes back to the root, ends them and
removes the directories, deepest first.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from support.waiting import wait_until

#: The unified (v2) hierarchy of a hybrid layout, or the only one on a pure v2 host.
V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
#: A v1 hierarchy any kernel with cgroup v1 has.
V1_PIDS = Path("/sys/fs/cgroup/pids")


def _is_v2(root: Path) -> bool:
    return (root / "cgroup.controllers").exists()


def v2_root() -> Path | None:
    return next((r for r in V2_ROOTS if _is_v2(r) and os.access(r / "cgroup.procs", os.W_OK)), None)


def v1_root() -> Path | None:
    return V1_PIDS if (V1_PIDS / "tasks").exists() and os.access(V1_PIDS / "cgroup.procs", os.W_OK) else None


def unavailable() -> str | None:
    """Why real cgroups cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "creating cgroups needs root (CI runs as root)"
    if v2_root() is None or v1_root() is None:
        return "needs a writable hybrid cgroup layout (v2 at /sys/fs/cgroup/unified and v1 /sys/fs/cgroup/pids)"
    return None


class CgroupTree:
    def __init__(self) -> None:
        self.name = f"gpulse-test-{uuid.uuid4().hex[:8]}"
        self.made: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def make(self, root: Path, path: str) -> Path:
        """The cgroup ``<root>/<this tree>/<path>``, created with its parents."""
        leaf = root / self.name / path.strip("/")
        missing = [p for p in [leaf, *leaf.parents] if not p.exists()]
        for d in reversed(missing):
            d.mkdir()
            self.made.append(d)
        return leaf

    def start(self, root: Path, path: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A ``sleep`` moved into ``<root>/<this tree>/<path>`` (created), with ``env`` as its whole environment."""
        leaf = self.make(root, path)
        proc = subprocess.Popen(["sleep", "300"], env=env or {}, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        (leaf / "cgroup.procs").write_text(f"{proc.pid}\n")
        # until execve, /proc/PID/{cmdline,environ} are still the forked test process's
        wait_until(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"), 10, "execve", 0.01)
        return proc

    def __enter__(self) -> CgroupTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for proc in self.procs:
            for root in (v2_root(), v1_root()):
                if root is not None and proc.poll() is None:
                    try:
                        (root / "cgroup.procs").write_text(f"{proc.pid}\n")
                    except OSError:
                        pass
            proc.kill()
            proc.wait()
        for d in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            d.rmdir()
