"""A ``Dataset.__getitem__`` made slow in a known way, for the data-loading tests' training loops:
CPU burnt on the thread's own clock (the same cost however busy the machine is), or one ``O_DIRECT``
read of a throttled test disk (:class:`support.cgroup_limits.SlowDisk`)."""

from __future__ import annotations

import time

from support.cgroup_limits import READ_SIZE, read_block


def slow_item(i: int, cpu_s: float, device: str | None = None, size: int = 0) -> None:
    """Item ``i``'s cost: a read of ``device`` (``size`` bytes, read round) if one is given, else ``cpu_s`` of CPU."""
    if device is not None:
        read_block(device, (i * READ_SIZE) % size)
        return
    t0 = time.thread_time()
    while time.thread_time() - t0 < cpu_s:
        pass
