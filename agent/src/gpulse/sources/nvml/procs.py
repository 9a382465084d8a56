"""Per-process GPU use (``gpu_process``): running processes, their memory and utilisation.

Utilisation comes from ``nvmlDeviceGetProcessUtilization`` with a stored ``lastSeenTimeStamp``
cursor per GPU, so each point averages the driver's samples since the previous one instead of the
driver's long default window. ``NotFound`` means "no sample newer than the cursor", i.e.
the process was idle: it reads 0, not a gap. Garbage rows (pid 0, values above 100) seen around
zombie contexts are dropped or clamped. Where per-process utilisation is not supported (MIG) the
fields are absent.
"""

from __future__ import annotations

from typing import Any

from gpulse.sources.base import Reading
from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml.probe import GpuPlan
from gpulse.sources.processes import ProcessDescriber


class ProcessSampler:
    def __init__(self, nvml: Any, describer: ProcessDescriber, window_us: int = 5_000_000) -> None:
        self.nvml = nvml
        self.describer = describer
        self.window_us = window_us
        self.cursor_us: dict[int, int] = {}  # GPU index -> last seen sample timestamp (CPU µs)

    def sample(self, plan: GpuPlan, now_ns: int) -> list[Reading]:
        """The gpu_process readings of one GPU; NVML errors propagate to the source's counting."""
        h = plan.handle
        procs: dict[int, int | None] = {}
        for fn in plan.proc_lists:
            for p in fn(h):
                pid = int(p.pid)
                if pid <= 0:
                    continue
                mem = p.usedGpuMemory  # None on WDDM / MIG without privileges
                prev = procs.get(pid)
                procs[pid] = mem if prev is None else max(prev, mem or 0)
        util = self._utilization(plan, now_ns) if plan.proc_util is not None else None
        out: list[Reading] = []
        for i, pid in enumerate(sorted(procs)):
            fields: dict[str, Any] = {"pid": pid}
            mem = procs[pid]
            if mem is not None:
                fields["mem_used_bytes"] = int(mem)
            if util is not None:
                sm, mu = util.get(pid, (0.0, 0.0))
                fields["sm_util_pct"] = sm
                fields["mem_util_pct"] = mu
            d = self.describer.describe(pid)
            if d.command is not None:
                fields["command"] = d.command
            if d.user is not None:
                fields["user"] = d.user
            if d.container is not None:
                fields["container"] = d.container
            out.append(Reading("gpu_process", plan.index, fields, now_ns + i))
        return out

    def _utilization(self, plan: GpuPlan, now_ns: int) -> dict[int, tuple[float, float]]:
        idx = plan.index
        cursor = self.cursor_us.get(idx)
        if cursor is None:
            cursor = now_ns // 1000 - self.window_us
        try:
            samples = plan.proc_util(plan.handle, cursor)  # type: ignore[misc]
        except self.nvml.NVMLError as e:
            if E.code_of(e) == E.NOT_FOUND:
                self.cursor_us[idx] = cursor
                return {}
            raise
        acc: dict[int, list[float]] = {}
        newest = cursor
        for s in samples:
            ts = int(s.timeStamp)
            if ts <= cursor or s.pid == 0:
                continue
            newest = max(newest, ts)
            a = acc.setdefault(int(s.pid), [0.0, 0.0, 0])
            a[0] += min(max(int(s.smUtil), 0), 100)
            a[1] += min(max(int(s.memUtil), 0), 100)
            a[2] += 1
        self.cursor_us[idx] = newest
        return {pid: (round(a[0] / a[2], 2), round(a[1] / a[2], 2)) for pid, a in acc.items()}
