"""The host beside a run's GPUs: its ``host`` and ``host_process`` points summarised, and which case of
slow data loading they show, with advice that weighs the cores the host has free.

Stdlib only, like the rest of the report (the training process builds it too; there it has no host
points and the summary is ``None``). The cases, from what a starved DataLoader looks like on the host:

* **I/O-bound**: the loaders are blocked on block I/O (state D) a good share of the samples, or the
  host's CPUs sit in iowait: more CPU work per item will not help, faster or closer storage will.
* **CPU-bound workers**: the workers are on (or waiting for) a CPU most of the time.
* **Too few workers**: the training process loads its own batches (no workers, or idle ones) and is
  on a CPU while it waits; only when the host has a free core, else it is **no free core**.
* **Waiting elsewhere**: the loaders mostly sleep: a pipe, a lock, network storage, a remote service.

More workers are advised only when at least ``free_core_min`` cores are free: on a host without one
they compete with the training process and each other, and the run gets slower.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from gpulse.report.records import HostSummary

if TYPE_CHECKING:
    from gpulse.report.diagnose import Thresholds

Row = Mapping[str, Any]
#: states of a ``host_process`` point that carry no figures
NO_FIGURES = ("gone", "no_permission")


class LoadingCase(Enum):
    IO_BOUND = "io_bound"
    CPU_BOUND_WORKERS = "cpu_bound_workers"
    TOO_FEW_WORKERS = "too_few_workers"
    NO_FREE_CORE = "no_free_core"
    WAITING_ELSEWHERE = "waiting_elsewhere"


@dataclass(frozen=True)
class LoadingDiagnosis:
    """Which case, the figures that show it, and what to do about it."""

    case: LoadingCase
    evidence: str
    action: str
    #: the figures the case was judged by, as numbers (the finding's ``data``; a live finding's
    #: ``figure_*`` fields), so that tools and alerts need not parse the evidence
    figures: dict[str, float] = field(default_factory=dict)


def _value(row: Row, key: str) -> float | None:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _mean(rows: Iterable[Row], key: str) -> float | None:
    xs = [v for v in (_value(r, key) for r in rows) if v is not None]
    return sum(xs) / len(xs) if xs else None


def _per_instant(rows: Iterable[Row], key: str) -> float | None:
    """The mean over sampling instants of the sum of ``key`` over the rows of each instant."""
    sums: dict[tuple[Any, Any], float] = defaultdict(float)
    for r in rows:
        v = _value(r, key)
        if v is not None:
            sums[(r.get("host"), r.get("time"))] += v
    return sum(sums.values()) / len(sums) if sums else None


def summarize(host: Sequence[Row], processes: Sequence[Row]) -> HostSummary | None:
    """The summary of a run's host points; ``None`` when the agent sampled none of its processes."""
    procs = [r for r in processes if r.get("state") not in NO_FIGURES]
    if not procs:
        return None
    main = [r for r in procs if r.get("process") == "main"]
    workers = [r for r in procs if str(r.get("process", "")).startswith("worker")]
    loaders = workers or main
    counts = [int(v) for r in main if (v := _value(r, "workers")) is not None]
    limits = [v for r in main if (v := _value(r, "cpu_limit_cores")) is not None]
    cpus = [int(v) for r in host if (v := _value(r, "cpus")) is not None]
    run_cpu = _per_instant(procs, "cpu_pct")
    run_cores = run_cpu / 100 if run_cpu is not None else None
    idle = [
        ((_value(r, "cpu_idle_pct") or 0.0) + (_value(r, "cpu_iowait_pct") or 0.0)) / 100 * c
        for r in host
        if (c := _value(r, "cpus")) is not None and _value(r, "cpu_idle_pct") is not None
    ]
    free = sum(idle) / len(idle) if idle else None
    limit = min(limits) if limits else None
    if limit is not None and run_cores is not None:
        free = min(free, limit - run_cores) if free is not None else limit - run_cores
    avail = [int(v) for r in host if (v := _value(r, "mem_available_bytes")) is not None]
    busy_disk = [v for r in host if (v := _value(r, "disk_busy_pct")) is not None]
    return HostSummary(
        host_samples=len(host),
        process_samples=len(procs),
        cpus=max(cpus) if cpus else None,
        cpu_limit_cores=limit,
        avg_cpu_busy_pct=_round(_mean(host, "cpu_busy_pct")),
        avg_cpu_iowait_pct=_round(_mean(host, "cpu_iowait_pct")),
        avg_cpu_steal_pct=_round(_mean(host, "cpu_steal_pct")),
        max_disk_busy_pct=_round(max(busy_disk)) if busy_disk else None,
        free_cores=_round(max(free, 0.0)) if free is not None else None,
        run_cpu_cores=_round(run_cores),
        workers=max(counts) if counts else len({r.get("process") for r in workers}),
        ranks_per_host=max(Counter(h for h, _ in {(r.get("host"), r.get("rank")) for r in main}).values(), default=1),
        main_cpu_pct=_round(_mean(main, "cpu_pct")),
        main_running_ratio=_round(_mean(main, "running")),
        main_disk_sleep_ratio=_round(_mean(main, "disk_sleep")),
        worker_cpu_pct=_round(_mean(workers, "cpu_pct")),
        worker_running_ratio=_round(_mean(workers, "running")),
        worker_disk_sleep_ratio=_round(_mean(workers, "disk_sleep")),
        loaders_read_bytes_per_s=_round(_per_instant(loaders, "read_bytes_per_s")),
        min_mem_available_bytes=min(avail) if avail else None,
    )


def _numbers(**values: float | None) -> dict[str, float]:
    """The figures that are known, as floats."""
    return {k: float(v) for k, v in values.items() if v is not None}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _host_line(s: HostSummary) -> str:
    cores = f"{s.cpus} cores" if s.cpus is not None else "? cores"
    limit = f", the run's cgroup limited to {s.cpu_limit_cores:g}" if s.cpu_limit_cores is not None else ""
    free = "n/a" if s.free_cores is None else f"{s.free_cores:.1f}"
    return (
        f"host: {cores}{limit}, {_pct(s.avg_cpu_busy_pct)} busy, iowait {_pct(s.avg_cpu_iowait_pct)}, "
        f"{free} core(s) free on average; the run's processes used {s.run_cpu_cores or 0:.2f} core(s)"
    )


def classify(s: HostSummary, t: Thresholds) -> LoadingDiagnosis:
    """The case of a run whose training waits for data, from its host summary (see the module docstring)."""
    has_workers = s.workers > 0 and s.worker_running_ratio is not None
    loaders = f"{s.workers} worker(s)" if has_workers else "the training process (no workers)"
    run_share = s.worker_running_ratio if has_workers else s.main_running_ratio
    d_share = s.worker_disk_sleep_ratio if has_workers else s.main_disk_sleep_ratio
    cpu = s.worker_cpu_pct if has_workers else s.main_cpu_pct
    loader_line = (
        f"{loaders}: on a CPU {_share(run_share)} of samples at {_pct(cpu)} of a core each, "
        f"blocked on disk (state D) {_share(d_share)}"
    )
    figures = f"{loader_line}; {_host_line(s)}."
    main_line = (
        f"The training process: on a CPU {_share(s.main_running_ratio)} of samples at {_pct(s.main_cpu_pct)} "
        f"of a core{f', its {s.workers} worker(s) on a CPU {_share(s.worker_running_ratio)}' if has_workers else ''}; "
        f"{_host_line(s)}."
    )
    free = s.free_cores
    can_grow = free is not None and free >= t.free_core_min
    # the free cores are shared by the training processes on the host: each rank's loader gets its part
    per_rank = math.floor(free / s.ranks_per_host) if free is not None else 0
    can_grow = can_grow and per_rank >= 1
    grow = f"num_workers={s.workers + per_rank}" if can_grow else ""
    ranks = f" per rank ({s.ranks_per_host} ranks share the host)" if s.ranks_per_host > 1 else ""
    shared = f" for its {s.ranks_per_host} ranks" if s.ranks_per_host > 1 else ""
    no_core = (
        f"Do not add DataLoader workers: the host has {'no' if free is None else f'{free:.1f}'} core(s) free{shared} "
        "(more workers would compete with the training processes and each other, and slow the run). "
    )
    iowait = s.avg_cpu_iowait_pct
    numbers = _numbers(
        workers=s.workers,
        loader_running_ratio=run_share,
        loader_disk_sleep_ratio=d_share,
        loader_cpu_pct=cpu,
        cpu_iowait_pct=iowait,
        free_cores=free,
        loaders_read_bytes_per_s=s.loaders_read_bytes_per_s,
        max_disk_busy_pct=s.max_disk_busy_pct,
    )
    if (d_share or 0.0) >= t.loader_disk_sleep_ratio or (iowait or 0.0) >= t.loader_iowait_pct:
        disk = f"; busiest disk {_pct(s.max_disk_busy_pct)} busy" if s.max_disk_busy_pct is not None else ""
        read = (
            f"; loaders read {s.loaders_read_bytes_per_s / 1e6:.2f} MB/s from disk"
            if s.loaders_read_bytes_per_s is not None
            else ""
        )
        return LoadingDiagnosis(
            LoadingCase.IO_BOUND,
            f"I/O-bound: {figures[:-1]}{disk}{read}.",
            "Storage is the limit, not CPU: copy the dataset to local NVMe or RAM (/dev/shm), read fewer larger "
            "files (sharded tar/WebDataset, Arrow, LMDB), cache decoded items after the first epoch; more "
            "workers help only while the device is not at its limit (disk busy below 100%).",
            numbers,
        )
    if has_workers and (run_share or 0.0) >= t.loader_busy_ratio:
        lighten = (
            "make each item cheaper: pre-tokenize or pre-decode offline and cache, lighter transforms, "
            "decode on the GPU (DALI, torchvision.io.decode_jpeg(device='cuda'))."
        )
        action = (
            f"Raise DataLoader {grow}{ranks}: {free:.1f} core(s) are free; set persistent_workers=True. Or {lighten}"
            if can_grow
            else f"{no_core}Instead {lighten}"
        )
        return LoadingDiagnosis(LoadingCase.CPU_BOUND_WORKERS, f"CPU-bound workers: {figures}", action, numbers)
    if (s.main_running_ratio or 0.0) >= t.loader_busy_ratio:  # the workers (if any) are not the busy ones
        if can_grow:
            return LoadingDiagnosis(
                LoadingCase.TOO_FEW_WORKERS,
                f"Too few workers: the training process loads its own batches. {main_line}",
                f"Load in worker processes: DataLoader {grow}{ranks} ({free:.1f} core(s) are free), "
                "persistent_workers=True, pin_memory=True.",
                numbers,
            )
        return LoadingDiagnosis(
            LoadingCase.NO_FREE_CORE,
            f"No free core: the training process loads its own batches. {main_line}",
            f"{no_core}Make loading cheaper instead: pre-tokenize or pre-decode offline and cache, or run on a "
            "host with more cores per GPU.",
            numbers,
        )
    return LoadingDiagnosis(
        LoadingCase.WAITING_ELSEWHERE,
        f"Loaders mostly sleep: {figures}",
        "The loaders wait on something that is neither CPU nor local disk: network storage, a pipe or queue, "
        "a lock, a remote service. Profile one worker (py-spy dump --pid <worker pid>) to see where it sleeps.",
        numbers,
    )
