"""Real kernel limits for tests, through cgroups (v1 or v2; needs root, which CI and this machine have):

* :class:`SlowDisk`: a loop device whose reads the kernel throttles for the processes of one cgroup
  (v1 ``blkio.throttle.read_bps_device``, v2 ``io.max rbps``). A process reading it with ``O_DIRECT``
  waits in the block layer, in state D, as it would on a saturated disk.
* :class:`CpuLimit`: a cgroup whose processes may use at most N cores (v1 ``cpu.cfs_quota_us``, v2
  ``cpu.max``), as a container's ``--cpus`` does.
"""

from __future__ import annotations

import mmap
import os
import subprocess
from pathlib import Path

V1_BLKIO = Path("/sys/fs/cgroup/blkio")
V1_CPU = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
#: bytes one test read takes (a multiple of the logical block size, as O_DIRECT needs)
READ_SIZE = 32 * 1024


class SlowDisk:
    """A throttled loop device over a file in ``tmp``; :meth:`prefix` runs a program inside its cgroup."""

    def __init__(self, tmp: Path, read_bytes_per_s: int, size: int = 8 << 20) -> None:
        assert os.geteuid() == 0, "a throttled test disk needs root (loop device and cgroup)"
        image = tmp / "slowdisk.img"
        image.write_bytes(os.urandom(size))
        self.size = size
        self.device = subprocess.run(
            ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
        ).stdout.strip()
        dev = Path(f"/sys/block/{Path(self.device).name}/dev").read_text().strip()
        name = f"gpulse-slowdisk-{os.getpid()}-{Path(self.device).name}"
        if V1_BLKIO.is_dir():
            self.cgroup = V1_BLKIO / name
            self.cgroup.mkdir()
            (self.cgroup / "blkio.throttle.read_bps_device").write_text(f"{dev} {read_bytes_per_s}")
        else:
            (V2_ROOT / "cgroup.subtree_control").write_text("+io")
            self.cgroup = V2_ROOT / name
            self.cgroup.mkdir()
            (self.cgroup / "io.max").write_text(f"{dev} rbps={read_bytes_per_s}")

    def prefix(self) -> list[str]:
        """A command prefix that puts the program (and the children it forks) in the throttled cgroup."""
        return enter(self.cgroup)

    def close(self) -> None:
        """Remove the cgroup (its processes must have ended) and detach the loop device."""
        try:
            self.cgroup.rmdir()
        finally:
            subprocess.run(["losetup", "--detach", self.device], check=False)


class CpuLimit:
    """A cgroup whose processes together may use at most ``cores`` CPUs."""

    PERIOD_US = 100_000

    def __init__(self, cores: float) -> None:
        assert os.geteuid() == 0, "a CPU-limited test cgroup needs root"
        quota = round(cores * self.PERIOD_US)
        name = f"gpulse-cpulimit-{os.getpid()}-{quota}"
        if V1_CPU.is_dir():
            self.cgroup = V1_CPU / name
            self.cgroup.mkdir()
            (self.cgroup / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.cgroup / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (V2_ROOT / "cgroup.subtree_control").write_text("+cpu")
            self.cgroup = V2_ROOT / name
            self.cgroup.mkdir()
            (self.cgroup / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")

    def prefix(self) -> list[str]:
        return enter(self.cgroup)

    def close(self) -> None:
        self.cgroup.rmdir()


def enter(cgroup: Path) -> list[str]:
    """A command prefix that moves the program into ``cgroup`` and execs it (children inherit it)."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs")]


def read_block(device: str, offset: int) -> bytes:
    """One ``O_DIRECT`` read of :data:`READ_SIZE` bytes at ``offset`` (page cache bypassed: every read
    reaches the device, and its throttle)."""
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, READ_SIZE)  # page-aligned, as O_DIRECT needs
        os.preadv(fd, [buf], offset - offset % READ_SIZE)
        return bytes(buf)
    finally:
        os.close(fd)
