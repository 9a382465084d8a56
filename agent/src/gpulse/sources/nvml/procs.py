"""Per-process GPU use (``gpu_process``): running processes, their memory and utilisation.

Utilisation comes from ``nvmlDeviceGetProcessUtilization``, which returns "one utilization sample
structure ... per process running, that had some non-zero utilization during the last sample
period", stamped with the CPU time of that sample (NVML reference). It is a snapshot of the
driver's last sample period, not a history: each busy process gets its newest sample's values,
nothing is averaged. A stored ``lastSeenTimeStamp`` cursor per GPU asks only for samples newer than
the previous read; ``NotFound`` ("if sample entries are not found") means no process was busy
since then, so every process reads 0, not a gap. Garbage rows (pid 0, values above 100) seen around
zombie contexts are dropped or clamped. On MIG the parent's utilisation is "not currently
supported" and the fields are absent; each MIG instance's processes come from its own device
handle and carry its ``mig`` tag.

Each process is tagged with its job (``processes.job_tags``): the one its cgroup names, completed
from a Slurm prolog's job file, else the one job the prolog's mapping gives its GPU
(``attribution/slurm_files``). A GPU is held by a job when all its processes belong to that one
job, or, with no process on it, when the kubelet allocated it to a pod or the prolog's mapping
names one job for it. :attr:`ProcessSampler.holders` keeps that per GPU for the source's ``gpu`` readings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpulse.schema import JOB_TAGS
from gpulse.sources.attribution.cgroup import Attribution
from gpulse.sources.attribution.podresources import PodHolder
from gpulse.sources.attribution.slurm_files import SlurmMapping
from gpulse.sources.base import Reading
from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml.probe import GpuPlan
from gpulse.sources.processes import ProcessDescriber, container_of, job_tags


def _memory_by_pid(lists: list[Callable[[Any], Any]], handle: Any) -> dict[int, int | None]:
    procs: dict[int, int | None] = {}
    for fn in lists:
        for p in fn(handle):
            pid = int(p.pid)
            if pid <= 0:
                continue
            mem = p.usedGpuMemory  # None when NVML answers "not available" (WDDM)
            prev = procs.get(pid)
            procs[pid] = mem if prev is None else max(prev, mem or 0)
    return procs


class ProcessSampler:
    def __init__(self, nvml: Any, describer: ProcessDescriber, window_us: int = 5_000_000) -> None:
        self.nvml = nvml
        self.describer = describer
        self.window_us = window_us
        self.cursor_us: dict[int, int] = {}  # GPU index -> newest sample timestamp seen (CPU µs)
        #: GPU index -> the job tags of its holder, as of the last process sample (empty: none or several)
        self.holders: dict[int, dict[str, str]] = {}

    def sample(self, plan: GpuPlan, now_ns: int) -> list[Reading]:
        """The gpu_process readings of one GPU and its MIG devices; NVML errors propagate."""
        util = self._utilization(plan, now_ns) if plan.proc_util is not None else None
        pods = self.describer.pods.holders()
        held_by = pods.get(plan.identity.uuid)
        slurm = self.describer.slurm_mapping()
        mapped = slurm.holder(plan.index)
        procs = _memory_by_pid(plan.proc_lists, plan.handle)
        out = self._readings(plan.index, procs, util, now_ns, None, held_by, slurm, mapped)
        for m in plan.migs:
            if m.proc_lists:
                procs = _memory_by_pid(m.proc_lists, m.handle)
                mig_mapped = slurm.holder(plan.index, m.gpu_instance)
                out += self._readings(
                    plan.index, procs, None, now_ns + len(out), m.tags, pods.get(m.uuid), slurm, mig_mapped
                )
        jobs = [{k: v for k, v in (r.tags or {}).items() if k in JOB_TAGS} for r in out]
        if not jobs:  # no process: the job the prolog mapped the GPU to, or the pod the kubelet gave it to
            jobs.append(job_tags(mapped, held_by))
        self.holders[plan.index] = jobs[0] if all(j == jobs[0] for j in jobs) else {}
        return out

    def _readings(
        self,
        gpu: int,
        procs: dict[int, int | None],
        util: dict[int, tuple[float, float]] | None,
        ts: int,
        tags: dict[str, str] | None,
        holder: PodHolder | None,
        slurm: SlurmMapping,
        mapped: Attribution | None,
    ) -> list[Reading]:
        """``mapped``: the one job the prolog's mapping gives this GPU, for a process whose cgroup names none."""
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
            container = container_of(d, holder)
            if container is not None:
                fields["container"] = container
            job = job_tags(slurm.complete(d.job) if d.job is not None else mapped, holder)
            out.append(Reading("gpu_process", gpu, fields, ts + i, {**tags, **job} if tags else job or None))
        return out

    def _utilization(self, plan: GpuPlan, now_ns: int) -> dict[int, tuple[float, float]]:
        """pid -> (SM %, memory %) of the driver's newest sample per busy process."""
        idx = plan.index
        cursor = self.cursor_us.get(idx)
        if cursor is None:  # first read: only a sample from the last window counts
            cursor = now_ns // 1000 - self.window_us
        try:
            samples = plan.proc_util(plan.handle, cursor)  # type: ignore[misc]
        except self.nvml.NVMLError as e:
            if E.code_of(e) == E.NOT_FOUND:  # nothing newer than the cursor: every process idle
                self.cursor_us[idx] = cursor
                return {}
            raise
        newest: dict[int, tuple[int, float, float]] = {}
        top = cursor
        for s in samples:
            ts, pid = int(s.timeStamp), int(s.pid)
            if ts <= cursor or pid == 0:
                continue
            top = max(top, ts)
            if pid not in newest or ts >= newest[pid][0]:
                sm = float(min(max(int(s.smUtil), 0), 100))
                mu = float(min(max(int(s.memUtil), 0), 100))
                newest[pid] = (ts, sm, mu)
        self.cursor_us[idx] = top
        return {pid: (sm, mu) for pid, (_, sm, mu) in newest.items()}
