"""The node's cumulative counters, read straight from ``/proc`` once per agent cycle.

Why not psutil here: the host sampler needs five of its calls every cycle (``cpu_times``,
``virtual_memory``, ``swap_memory``, ``disk_io_counters``, ``net_io_counters``), which open
``/proc/meminfo`` twice, build named tuples of fields nobody reads and keep wrap-around state behind a
lock; on a 1 Hz agent that was the largest part of a cycle besides NVML (``bench/bench_sampling.py``).
These readers open each file once and keep only what a ``host`` point needs, with psutil's meaning
(``psutil/_pslinux.py``, psutil 7.2):

* CPU: the first line of ``/proc/stat`` in clock ticks (psutil divides each by ``SC_CLK_TCK``; shares
  are ratios, so the unit cancels);
* memory: ``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo`` (KiB → bytes); swap used is
  ``SwapTotal - SwapFree``; swapped in/out are ``pswpin``/``pswpout`` of ``/proc/vmstat``, which
  count 4 KiB units as psutil reads them;
* disks: ``/proc/diskstats`` sectors read and written (512 bytes each, as the kernel counts them
  whatever the device's sector size) and the milliseconds spent doing I/O;
* network: ``/proc/net/dev`` bytes received and sent.

Where a file is missing (no ``/proc``: not Linux) or ``MemAvailable`` is (kernels before 3.14),
:func:`read_node` takes the same figures from psutil instead. Counters that go backwards (a 32-bit
counter that wrapped) are the callers' to handle: :func:`counter_delta` does what psutil's
``nowrap=True`` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

#: the unit of /proc/diskstats' sector counts (include/linux/types.h: sector_t is 512 bytes)
SECTOR_BYTES = 512
#: the unit psutil gives /proc/vmstat's pswpin/pswpout (``swap_memory``: "values are expressed in 4 kilo bytes")
SWAP_UNIT_BYTES = 4 * 1024


@dataclass(frozen=True)
class CpuTicks:
    """The whole node's CPU time by mode, in clock ticks (``/proc/stat``'s ``cpu`` line)."""

    total: int  # every mode but guest and guest_nice, which user and nice already count (proc(5))
    idle: int
    iowait: int
    steal: int


@dataclass(frozen=True)
class Disk:
    """One block device's cumulative counters (``/proc/diskstats``)."""

    read_bytes: int
    write_bytes: int
    busy_ms: int


@dataclass(frozen=True)
class Nic:
    """One network interface's cumulative byte counters (``/proc/net/dev``)."""

    bytes_recv: int
    bytes_sent: int


@dataclass(frozen=True)
class NodeCounters:
    """The node's counters at one instant (``at``: the sampler's clock)."""

    at: float
    cpu: CpuTicks
    mem_total_bytes: int
    mem_available_bytes: int
    swap_used_bytes: int
    swap_in_bytes: int
    swap_out_bytes: int
    disks: dict[str, Disk]
    nics: dict[str, Nic]


def counter_delta(before: int, after: int) -> int:
    """How much a cumulative counter grew; one that went back wrapped, and counts from 0 again
    (psutil's ``nowrap=True`` adds the old value to every later reading: the same growth)."""
    return after - before if after >= before else after


def read_node(at: float | None = None) -> NodeCounters:
    """Every counter a ``host`` point needs, from ``/proc`` (from psutil where ``/proc`` lacks them)."""
    now = time.monotonic() if at is None else at
    try:
        return _from_proc(now)
    except (OSError, KeyError):
        return _from_psutil(now)


def _from_proc(at: float) -> NodeCounters:
    with open("/proc/stat", "rb") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    with open("/proc/meminfo", "rb") as f:
        meminfo = f.read()
    with open("/proc/vmstat", "rb") as f:
        vmstat = f.read()
    with open("/proc/diskstats", "rb") as f:
        diskstats = f.read().splitlines()
    with open("/proc/net/dev", "rb") as f:
        netdev = f.read().splitlines()[2:]  # two header lines
    mem = {k: v for k, _, v in (line.partition(b":") for line in meminfo.splitlines())}
    # user nice system idle iowait irq softirq steal guest guest_nice: as many as the kernel has
    modes = cpu + [0] * (10 - len(cpu))
    ticks = CpuTicks(sum(modes[:8]), modes[3], modes[4], modes[7])
    disks = {}
    for line in diskstats:
        f = line.split()
        if len(f) == 14 or len(f) >= 18:  # a disk: sectors read (6th), written (10th), ms doing I/O (13th)
            disks[f[2].decode()] = Disk(int(f[5]) * SECTOR_BYTES, int(f[9]) * SECTOR_BYTES, int(f[12]))
        elif len(f) == 7:  # a partition on kernels before 2.6.25: no busy time
            disks[f[2].decode()] = Disk(int(f[4]) * SECTOR_BYTES, int(f[6]) * SECTOR_BYTES, 0)
    nics = {}
    for line in netdev:
        name, _, rest = line.partition(b":")
        r = rest.split()
        nics[name.strip().decode()] = Nic(int(r[0]), int(r[8]))
    return NodeCounters(
        at,
        ticks,
        _kib(mem[b"MemTotal"]),
        _kib(mem[b"MemAvailable"]),
        _kib(mem[b"SwapTotal"]) - _kib(mem[b"SwapFree"]),
        _vmstat(vmstat, b"pswpin") * SWAP_UNIT_BYTES,
        _vmstat(vmstat, b"pswpout") * SWAP_UNIT_BYTES,
        disks,
        nics,
    )


def _kib(value: bytes) -> int:
    return int(value.split()[0]) * 1024


def _vmstat(text: bytes, key: bytes) -> int:
    """One counter of ``/proc/vmstat`` (``key value`` lines; never the first one: nr_free_pages is)."""
    start = text.find(b"\n" + key + b" ")
    if start < 0:
        raise KeyError(key)
    start += len(key) + 2
    end = text.find(b"\n", start)
    return int(text[start : end if end >= 0 else None])


def _from_psutil(at: float) -> NodeCounters:
    """The same figures through psutil (another OS, or a kernel without ``MemAvailable``)."""
    cpu = psutil.cpu_times()
    tick = 100.0  # any unit will do: only ratios of these are used
    modes = {k: round(v * tick) for k, v in cpu._asdict().items()}
    total = sum(modes.values()) - modes.get("guest", 0) - modes.get("guest_nice", 0)
    mem = psutil.virtual_memory()
    swap = psutil.swap_memory()
    disks = psutil.disk_io_counters(perdisk=True, nowrap=False) or {}
    nics = psutil.net_io_counters(pernic=True, nowrap=False) or {}
    return NodeCounters(
        at,
        CpuTicks(total, modes.get("idle", 0), modes.get("iowait", 0), modes.get("steal", 0)),
        mem.total,
        mem.available,
        swap.used,
        swap.sin,
        swap.sout,
        {k: Disk(v.read_bytes, v.write_bytes, getattr(v, "busy_time", 0)) for k, v in disks.items()},
        {k: Nic(v.bytes_recv, v.bytes_sent) for k, v in nics.items()},
    )
