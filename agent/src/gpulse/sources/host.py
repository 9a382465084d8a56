"""The host beside the GPUs: the node's CPU, memory, disks and network (from ``/proc``, :mod:`.procfs`),
and each training process with its DataLoader workers (psutil), sampled every agent cycle.

A starved DataLoader is a CPU or storage problem that GPU metrics cannot show; these readings are
what the report's data-loading finding reads to say which (``gpulse.report.host``).

Cheap calls only, and the objects kept between cycles: every rate (CPU %, bytes/s) is the
difference of two cumulative counters read one cycle apart, so the first sample of the node and of
each process has no rates (psutil's first ``cpu_percent()`` is meaningless for the same reason; it
is primed when the process is first seen, as nvitop's ``HostProcess`` does). psutil ``Process``
objects are cached per PID and checked against the process's start time, so a reused PID is a new
process. A process that vanishes is a reading with ``state="gone"`` (once), never an exception.

The training processes are those registered on the training channel (run, rank, pid); their
workers are their direct children (DataLoader workers are forked by the training process),
numbered in order of appearance. Python's own multiprocessing helpers (resource tracker,
forkserver) are children too but never load data, so they are left out. PIDs are the ones the
training process sees, so the agent must share its PID namespace (run it on the host, or with
``--pid=host`` beside containers, as the GPU process list needs too): in another namespace the PID
names no process, or another one.

Memory: RSS is read every cycle (one read of ``/proc/PID/statm``); PSS, which splits the pages
forked workers share copy-on-write among them (their RSS counts them once each, pytorch#13246),
walks the page tables (``/proc/PID/smaps_rollup``), so it is read every :data:`PSS_EVERY_S` and
only where the kernel has ``smaps_rollup`` and lets the agent read it (same user or root).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from gpulse.sources.procfs import NodeCounters, counter_delta, read_node

#: Seconds between two PSS reads of one process (the smaps walk costs more than the rest of a sample).
PSS_EVERY_S = 10.0
#: Command-line marks of multiprocessing's helper processes, which are children but not data workers.
HELPER_MARKS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "multiprocessing.semaphore_tracker")
#: ``Process.status()`` values, as ``state`` is written.
RUNNING = psutil.STATUS_RUNNING
DISK_SLEEP = psutil.STATUS_DISK_SLEEP
GONE = "gone"
_HAS_SMAPS_ROLLUP = os.path.exists(f"/proc/{os.getpid()}/smaps_rollup")
#: the kernel lists each thread's children (CONFIG_PROC_CHILDREN): no scan of every process needed
_HAS_CHILDREN_LIST = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


@dataclass(frozen=True)
class TrainingProcess:
    """A process the training channel registered: its run, rank and PID."""

    run: str
    rank: str
    pid: int


@dataclass(frozen=True)
class NodeReading:
    """One ``host`` point (fields as in ``gpulse.schema.HOST``); rates are ``None`` on the first sample."""

    cpus: int
    mem_total_bytes: int
    mem_available_bytes: int
    swap_used_bytes: int
    cpu_busy_pct: float | None = None
    cpu_idle_pct: float | None = None
    cpu_iowait_pct: float | None = None
    cpu_steal_pct: float | None = None
    swap_in_bytes_per_s: float | None = None
    swap_out_bytes_per_s: float | None = None
    disk_read_bytes_per_s: float | None = None
    disk_write_bytes_per_s: float | None = None
    disk_busy_pct: float | None = None
    net_recv_bytes_per_s: float | None = None
    net_sent_bytes_per_s: float | None = None

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class ProcessReading:
    """One ``host_process`` point: a training process (``process="main"``) or one of its workers."""

    run: str
    rank: str
    process: str
    pid: int
    state: str
    cpu_pct: float | None = None
    mem_rss_bytes: int | None = None
    mem_pss_bytes: int | None = None
    read_bytes_per_s: float | None = None
    write_bytes_per_s: float | None = None
    read_chars_per_s: float | None = None
    threads: int | None = None
    workers: int | None = None
    cpu_limit_cores: float | None = None

    @property
    def tags(self) -> dict[str, str]:
        return {"run": self.run, "rank": self.rank, "process": self.process}

    def fields(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if v is not None and k not in ("run", "rank", "process", "state")}
        out["state"] = self.state
        out["running"] = int(self.state == RUNNING)
        out["disk_sleep"] = int(self.state == DISK_SLEEP)
        return out


@dataclass
class _Counters:
    """A process's cumulative counters at one instant, for the next sample's rates."""

    at: float
    read_bytes: int
    write_bytes: int
    read_chars: int


@dataclass
class _Tracked:
    proc: psutil.Process
    run: str
    rank: str
    process: str
    last: _Counters | None = None
    pss_due: float = 0.0
    gone: bool = False
    #: its CPU share has been read once since the priming call (the first read is meaningless)
    primed: bool = False
    cpu_limit: float | None = None
    #: worker PID -> its number, for a main process
    workers: dict[int, int] = field(default_factory=dict)
    #: children that are multiprocessing's helpers, not workers
    helpers: set[int] = field(default_factory=set)


def _per_s(now: float, then: float, before: int, after: int) -> float | None:
    dt = now - then
    return (after - before) / dt if dt > 0 and after >= before else None


def cgroup_cpu_limit(pid: int, root: str = "/sys/fs/cgroup") -> float | None:
    """Cores the cgroup of ``pid`` may use (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), ``None`` unlimited.

    Only the process's own cgroup is read, not its ancestors'; a limit set higher up is not seen."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            limit = _read_quota(f"{root}/{path.lstrip('/')}/cpu.max", v2=True)
        elif "cpu" in controllers.split(","):
            limit = _read_quota(f"{root}/{controllers}/{path.lstrip('/')}/cpu.cfs_quota_us", v2=False)
        else:
            continue
        if limit is not None:
            return limit
    return None


def _read_quota(path: str, *, v2: bool) -> float | None:
    try:
        with open(path) as f:
            text = f.read().split()
        if v2:
            quota, period = text[0], text[1]
        else:
            with open(path.replace("cfs_quota_us", "cfs_period_us")) as f:
                quota, period = text[0], f.read().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, IndexError, ValueError, ZeroDivisionError):
        return None


class HostSampler:
    """Samples the node and the given training processes; keeps psutil objects and counters between calls."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: by (run, rank, pid): two runs (or ranks) in one process each keep their own counters
        self._tracked: dict[tuple[str, str, int], _Tracked] = {}
        self._node: NodeCounters | None = None
        self._whole_disk: dict[str, bool] = {}
        self.cpus = psutil.cpu_count() or 1

    # -- the node ---------------------------------------------------------------------------------
    def node(self) -> NodeReading:
        now = read_node(self.clock())
        base = {
            "cpus": self.cpus,
            "mem_total_bytes": now.mem_total_bytes,
            "mem_available_bytes": now.mem_available_bytes,
            "swap_used_bytes": now.swap_used_bytes,
        }
        prev, self._node = self._node, now
        if prev is None:
            return NodeReading(**base)
        dt = now.at - prev.at
        # guest time is counted in user time already (proc(5)): left out of the total
        total = now.cpu.total - prev.cpu.total
        idle = _share(now.cpu.idle - prev.cpu.idle, total)
        iowait = _share(now.cpu.iowait - prev.cpu.iowait, total)
        steal = _share(now.cpu.steal - prev.cpu.steal, total)
        busy = None if idle is None else max(0.0, 100.0 - idle - (iowait or 0.0) - (steal or 0.0))
        disks = [(prev.disks[k], d) for k, d in now.disks.items() if k in prev.disks and self._is_disk(k)]
        nics = [(prev.nics[k], n) for k, n in now.nics.items() if k in prev.nics and k != "lo"]
        # busy_time is in ms: Δms / (10 × Δs) is the share of the interval in %
        busy_disk = [counter_delta(a.busy_ms, b.busy_ms) / (10 * dt) for a, b in disks] if dt > 0 else []
        return NodeReading(
            **base,
            cpu_busy_pct=busy,
            cpu_idle_pct=idle,
            cpu_iowait_pct=iowait,
            cpu_steal_pct=steal,
            swap_in_bytes_per_s=_per_s(now.at, prev.at, prev.swap_in_bytes, now.swap_in_bytes),
            swap_out_bytes_per_s=_per_s(now.at, prev.at, prev.swap_out_bytes, now.swap_out_bytes),
            disk_read_bytes_per_s=_rate(dt, sum(counter_delta(a.read_bytes, b.read_bytes) for a, b in disks)),
            disk_write_bytes_per_s=_rate(dt, sum(counter_delta(a.write_bytes, b.write_bytes) for a, b in disks)),
            disk_busy_pct=min(100.0, max(busy_disk)) if busy_disk else None,
            net_recv_bytes_per_s=_rate(dt, sum(counter_delta(a.bytes_recv, b.bytes_recv) for a, b in nics)),
            net_sent_bytes_per_s=_rate(dt, sum(counter_delta(a.bytes_sent, b.bytes_sent) for a, b in nics)),
        )

    def _is_disk(self, name: str) -> bool:
        """A whole block device (partitions would count their disk's bytes twice)."""
        whole = self._whole_disk.get(name)
        if whole is None:
            whole = self._whole_disk[name] = os.path.exists(f"/sys/block/{name}")
        return whole

    # -- the training processes -------------------------------------------------------------------
    def processes(self, training: Iterable[TrainingProcess]) -> list[ProcessReading]:
        """One reading per training process and per worker of it; ``gone`` once for each that vanished
        (a worker when seen ended but not yet reaped; once reaped it is no longer a child, nor sampled)."""
        out: list[ProcessReading] = []
        wanted: set[tuple[str, str, int]] = set()
        for t in training:
            main = self._track(t.pid, t.run, t.rank, "main")
            if main is None:
                continue
            wanted.add((t.run, t.rank, t.pid))
            if main.gone:
                continue  # said once; the channel unregisters it at its next liveness check
            workers = self._workers(main)
            wanted.update((t.run, t.rank, w.proc.pid) for w in workers)
            reading = self._read(main)
            if reading.state != GONE:
                reading = replace(reading, workers=len(workers), cpu_limit_cores=main.cpu_limit)
            out.append(reading)
            out.extend(self._read(w) for w in workers if not w.gone)
        for key in [k for k in self._tracked if k not in wanted]:
            del self._tracked[key]  # unregistered, or a worker that ended: no longer sampled
        return out

    def _track(self, pid: int, run: str, rank: str, process: str) -> _Tracked | None:
        t = self._tracked.get((run, rank, pid))
        if t is not None:
            return t
        try:
            proc = psutil.Process(pid)
            proc.cpu_percent()  # primes the counter: the next call is the CPU share since now
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        t = self._tracked[(run, rank, pid)] = _Tracked(proc, run, rank, process)
        if process == "main":
            t.cpu_limit = cgroup_cpu_limit(pid)
        return t

    def _workers(self, main: _Tracked) -> list[_Tracked]:
        out = []
        alive = set()
        for pid in child_pids(main.proc):
            number = main.workers.get(pid)
            if number is None:
                if pid in main.helpers or _is_helper(pid):
                    main.helpers.add(pid)
                    continue
                used = set(main.workers.values())
                number = main.workers[pid] = next(i for i in range(len(used) + 1) if i not in used)
            alive.add(pid)
            w = self._track(pid, main.run, main.rank, f"worker{number}")
            if w is not None:
                out.append(w)
        main.workers = {pid: n for pid, n in main.workers.items() if pid in alive}
        return out

    def _read(self, t: _Tracked) -> ProcessReading:
        """The process's reading; ``gone`` (and marked so) when it ended."""
        p = t.proc
        now = self.clock()
        try:
            with p.oneshot():
                if not p.is_running():
                    raise psutil.NoSuchProcess(p.pid)
                state = p.status()
                cpu: float | None = p.cpu_percent()
                rss = p.memory_info().rss
                threads = p.num_threads()
                io = _io(p)
            pss = self._pss(t, now)
        except psutil.NoSuchProcess:
            state = GONE
        except psutil.AccessDenied:
            return ProcessReading(t.run, t.rank, t.process, p.pid, "no_permission")
        if state in (GONE, psutil.STATUS_ZOMBIE):
            t.gone = True
            return ProcessReading(t.run, t.rank, t.process, p.pid, GONE)
        if not t.primed:  # the priming call was in this same cycle: no interval to speak of
            t.primed, cpu = True, None
        rates: dict[str, float | None] = {}
        if io is not None:
            if t.last is not None:
                rates = {
                    "read_bytes_per_s": _per_s(now, t.last.at, t.last.read_bytes, io.read_bytes),
                    "write_bytes_per_s": _per_s(now, t.last.at, t.last.write_bytes, io.write_bytes),
                    "read_chars_per_s": _per_s(now, t.last.at, t.last.read_chars, io.read_chars),
                }
            t.last = _Counters(now, io.read_bytes, io.write_bytes, io.read_chars)
        return ProcessReading(
            t.run,
            t.rank,
            t.process,
            p.pid,
            state,
            cpu_pct=cpu,
            mem_rss_bytes=rss,
            mem_pss_bytes=pss,
            threads=threads,
            **rates,
        )

    def _pss(self, t: _Tracked, now: float) -> int | None:
        if not _HAS_SMAPS_ROLLUP or now < t.pss_due:
            return None
        t.pss_due = now + PSS_EVERY_S
        try:
            return int(t.proc.memory_full_info().pss)
        except psutil.AccessDenied:
            t.pss_due = float("inf")  # not permitted: RSS only, and no further tries
            return None


def _io(p: psutil.Process) -> Any:
    """The process's I/O counters, ``None`` where the kernel does not let the agent read them."""
    try:
        return p.io_counters()
    except (psutil.AccessDenied, AttributeError):
        return None


def child_pids(p: psutil.Process) -> list[int]:
    """The PIDs of a process's children: the kernel's list of each of its threads (proc(5),
    ``/proc/PID/task/TID/children``), else psutil's scan of every process's parent."""
    if not _HAS_CHILDREN_LIST:
        try:
            return [c.pid for c in p.children()]
        except psutil.Error:
            return []
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{p.pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{p.pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _is_helper(pid: int) -> bool:
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return any(mark in cmd for mark in HELPER_MARKS)


def _share(ticks: int, total: int) -> float | None:
    """``ticks`` of one CPU mode as a share of all CPU time in the same interval, in %; ``None`` without time."""
    if total <= 0:
        return None
    return 100.0 * ticks / total


def _rate(dt: float, delta: int) -> float | None:
    """Bytes per second over ``dt`` (of the devices seen in both samples: 0 when there are none)."""
    return delta / dt if dt > 0 else None
