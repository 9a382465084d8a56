"""The report's typed records: what ``metrics_report.json`` holds, one dataclass per object in it.

Stdlib only, like :mod:`gpulse.report.model` (the training process writes the report too). Field
names are the JSON keys (seed 000's names; ``agent/tests/report/test_report_json.py`` keeps them),
in the order the file lists them; :meth:`RunReport.to_json` is the file's content. Readers (the
diagnosis, the text and HTML renderers, the demo) use attributes, so a misspelt field fails in the
type checker or at the first run of a test, not in a user's report.

Adding a field: add it here where it belongs in the file, fill it in :mod:`gpulse.report.model`,
and add its name to ``ADDED_KEYS`` in the JSON test (which otherwise guards seed 000's names).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

REPORT_VERSION = 1


def as_json(record: Any) -> dict[str, Any]:
    """A record as the JSON object it stands for (nested records and lists of them included)."""
    return dataclasses.asdict(record)


@dataclass
class RunInfo:
    """Who the run was: from its ``train_run`` points and the tags of its steps."""

    id: str | list[str] | None
    name: str | None
    status: str
    world_size: int | None
    ranks: list[int]
    hosts: list[str]
    gpus: list[str]
    mfu_formula: str | None
    peak_flops: float | None
    flops_per_token: float | None
    config: str | None


@dataclass
class StepTimeStats:
    mean: float | None
    median: float | None
    p90: float | None
    max: float | None


@dataclass
class RankSummary:
    """One rank's steps (``per_rank``)."""

    rank: int
    host: str | None
    gpus: list[str]
    steps: int
    mean_step_time_s: float | None
    median_step_time_s: float | None
    median_compute_time_s: float | None
    data_loading_time_ratio: float | None
    #: exposed communication, the part that is not waiting for slower ranks (see ``RunReport``)
    communication_time_ratio: float | None
    samples_per_second: float | None
    peak_memory_allocated_gb: float | None
    alloc_retries: int
    slowdown_vs_median: float | None = None
    communication_in_flight_ratio: float | None = None
    #: mean seconds per step this rank waited for slower ranks to reach the collective
    wait_for_slower_ranks_s: float | None = None
    #: median seconds per step of the rank's own work: data wait + compute (the step less its
    #: communication wait); ``slowdown_vs_median`` compares it across ranks
    median_busy_time_s: float | None = None


@dataclass
class GpuSummary:
    """One GPU's samples over the report's window (``per_gpu``); run and node reports share it."""

    key: str
    host: str | None
    gpu: str | None
    uuid: str | None
    model: str | None
    samples: int
    avg_utilization_percent: float | None
    max_utilization_percent: float | None
    avg_sm_active_percent: float | None
    avg_tensor_active_percent: float | None
    peak_memory_used_gb: float | None
    memory_total_gb: float | None
    avg_memory_used_percent: float | None
    avg_power_w: float | None
    energy_j: float | None
    throttle_time_ratio: float | None
    throttle_time_s: float | None
    throttle_reasons: dict[str, float]
    avg_sm_clock_mhz: float | None

    def label(self, with_host: bool = False) -> str:
        """``GPU 3`` (``node2 GPU 3`` with the host), as people name GPUs; the key where no index is known."""
        name = f"GPU {self.gpu}" if self.gpu is not None else self.key
        return f"{self.host} {name}" if with_host else name

    def name(self, with_host: bool = False) -> str:
        """``GPU 3 (GPU-1d0b…)``: the index the tables use, and the start of the uuid that tells the card."""
        label = self.label(with_host)
        return f"{label} ({short_uuid(self.uuid)})" if self.uuid and self.gpu is not None else label

    def order(self) -> tuple[str, int, str]:
        return gpu_order(self.host, self.gpu, self.key)


def short_uuid(uuid: str) -> str:
    """``GPU-1d0b…``: enough of a GPU's uuid to tell it from the node's others at a glance."""
    return uuid if len(uuid) <= 9 else f"{uuid[:8]}…"


def gpu_order(host: Any, index: Any, key: str) -> tuple[str, int, str]:
    """Sort key for GPUs: by host, then by index as a number (GPU 2 before GPU 10)."""
    i = str(index)
    return (str(host), int(i) if i.isdigit() else 1 << 30, key)


@dataclass
class GpuTotals:
    """The GPUs taken together: the ``gpu_*``, ``energy_*`` and ``throttle_*`` figures of both reports."""

    gpu_avg_utilization_percent: float | None
    gpu_max_utilization_percent: float | None
    gpu_avg_sm_active_percent: float | None
    gpu_avg_tensor_active_percent: float | None
    gpu_avg_memory_used_percent: float | None
    gpu_avg_power_w: float | None
    energy_j: float | None
    throttle_time_ratio: float | None
    throttle_time_s: float | None

    def report_fields(self) -> dict[str, float | None]:
        """The figures both reports carry under the same names (energy goes in as kWh, by each report)."""
        return {k: v for k, v in vars(self).items() if k != "energy_j"}


@dataclass
class RunEvent:
    """A ``train_event`` point (checkpoint, eval, ...)."""

    time_ns: int | None
    kind: str | None
    text: str | None
    step: Any
    rank: Any


@dataclass(frozen=True)
class ProfileOperator:
    """One operator of a profiler window: its self time over the window and how often it ran."""

    name: str
    device: str
    self_ms: float
    calls: int


@dataclass
class ProfileSummary:
    """What a profiler window's trace showed (``gpulse.training.trace_summary``)."""

    steps: int
    window_ms: float
    top_ops: list[ProfileOperator]
    comm_ms: float
    compute_ms: float
    dataloader_wait_ms: float


@dataclass
class ProfileRecord:
    """A profiler window a rolling finding asked for (``gpulse.training.profiling``): the rule, the
    steps it recorded, its trace and what the trace showed, and the DataLoader workers' stacks."""

    rule: str
    evidence: str
    rank: int
    #: the gzipped Chrome trace (Perfetto, Holistic Trace Analysis)
    path: str
    #: the run's steps the window recorded
    steps: list[int]
    #: ``None`` where the trace could not be read back (``error`` says why)
    summary: ProfileSummary | None
    #: ``None`` where the dump is in ``pyspy_path`` or the rule asks for none; else what the window says of it
    #: (``gpulse.training.profiling.pyspy_note``: why none was taken, or the dump its file could not take)
    pyspy: str | None
    #: the file the py-spy dump was saved to, beside the trace
    pyspy_path: str | None
    error: str | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProfileRecord | None:
        """The record of a profile's JSON (the ``train_event`` point's ``profile`` field, or
        ``Profile.to_json``); ``None`` when it is not one."""
        try:
            s = d.get("summary")
            summary = (
                ProfileSummary(
                    int(s["steps"]),
                    float(s["window_ms"]),
                    [ProfileOperator(str(o["name"]), str(o["device"]), float(o["self_ms"]), int(o["calls"]))
                     for o in s["top_ops"]],
                    float(s["comm_ms"]),
                    float(s["compute_ms"]),
                    float(s["dataloader_wait_ms"]),
                )
                if isinstance(s, dict)
                else None
            )  # fmt: skip
            return cls(
                str(d["rule"]),
                str(d.get("evidence") or ""),
                int(d.get("rank") or 0),
                str(d["path"]),
                [int(x) for x in d.get("steps") or []],
                summary,
                _opt_str(d.get("pyspy")),
                _opt_str(d.get("pyspy_path")),
                _opt_str(d.get("error")),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def parts(self) -> list[tuple[str, str]]:
        """What the window showed, as (label, text) pairs: the text and HTML reports list these."""
        steps = f"{self.steps[0]}-{self.steps[-1]} ({len(self.steps)} steps)" if self.steps else "none recorded"
        out = [("asked for by", f"{self.rule}: {self.evidence}" if self.evidence else self.rule), ("steps", steps)]
        s = self.summary
        if s is None:
            out.append(("summary", f"the trace could not be read back: {self.error or 'unknown error'}"))
        else:
            out[-1] = ("steps", f"{steps}, {s.window_ms:.1f} ms in all")
            ops = "; ".join(f"{o.name} ({o.device}) {o.self_ms:.2f} ms in {o.calls} call(s)" for o in s.top_ops)
            out += [
                ("top operators by self time", ops or "none"),
                ("communication vs compute", f"{s.comm_ms:.2f} ms vs {s.compute_ms:.2f} ms"),
                ("DataLoader wait", f"{s.dataloader_wait_ms:.2f} ms"),
            ]
        if self.pyspy_path:
            out.append(("py-spy dump", self.pyspy_path))
        elif self.pyspy is not None:  # why none, or the dump its file could not take (it says which)
            out.append(("py-spy dump", self.pyspy))
        else:
            out.append(("py-spy dump", f"none: the {self.rule} rule asks for none (only data loading's does)"))
        out.append(("trace", self.path))
        return out


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


@dataclass
class GpuEvent:
    """A ``gpu_event`` point: XID, ECC error, GPU lost or recovered."""

    time_ns: int | None
    host: str | None
    gpu: str | None
    kind: str | None
    xid: int | None
    text: str | None
    uuid: str | None = None

    def what(self) -> str:
        """``XID 31``, else the kind (``ecc_double_bit``, ``gpu_lost``, ...)."""
        return f"XID {self.xid}" if self.kind == "xid" and self.xid else (self.kind or "event")

    def describe(self) -> str:
        """The event in words: its text where that names it (``XID 31: ...`` from the agent), else ``XID 31 (text)``."""
        if not self.text:
            return self.what()
        return self.text if self.what() in self.text else f"{self.what()} ({self.text})"


@dataclass
class Sources:
    """How many points of each measurement the report was built from."""

    train_step: int
    gpu: int
    train_run: int
    train_event: int
    gpu_event: int = 0


@dataclass
class HostSummary:
    """The host beside the run's GPUs over its window (``host`` and ``host_process`` points), as the
    data-loading finding reads it. Shares are of samples (``running``: on or waiting for a CPU;
    ``disk_sleep``: blocked on block I/O); CPU is in % of one core. "Loaders" are the workers, or the
    training process itself when it has none (``num_workers=0``: it loads its own batches)."""

    host_samples: int
    process_samples: int
    cpus: int | None
    #: the training process's cgroup CPU limit, where it has one
    cpu_limit_cores: float | None
    avg_cpu_busy_pct: float | None
    avg_cpu_iowait_pct: float | None
    avg_cpu_steal_pct: float | None
    max_disk_busy_pct: float | None
    #: cores neither the host nor the cgroup limit keeps busy, on average (idle + iowait, less the limit's use)
    free_cores: float | None
    #: CPU of the run's processes together, in cores, on average
    run_cpu_cores: float | None
    workers: int
    #: training processes (ranks) sampled on one host, at most: they share its free cores
    ranks_per_host: int
    main_cpu_pct: float | None
    main_running_ratio: float | None
    main_disk_sleep_ratio: float | None
    worker_cpu_pct: float | None
    worker_running_ratio: float | None
    worker_disk_sleep_ratio: float | None
    loaders_read_bytes_per_s: float | None
    min_mem_available_bytes: int | None


@dataclass
class Finding:
    """One diagnosis: what was seen (numbers), the threshold crossed, and what to change."""

    id: str
    title: str
    evidence: str
    threshold: str
    action: str
    data: dict[str, Any]


@dataclass
class RunReport:
    """``metrics_report.json``: a training run's numbers and its diagnosis."""

    gpulse_report_version: int
    run: RunInfo
    #: the report lacks ranks of the run (``partial_reason`` says which, and why)
    partial: bool
    partial_reason: str | None
    start_time_ns: int | None
    end_time_ns: int | None
    train_runtime: float | None
    train_steps: int
    train_samples: int
    #: ``None`` where no step counted tokens (unknown, not zero)
    train_tokens: int | None
    train_samples_per_second: float | None
    train_steps_per_second: float | None
    train_tokens_per_second: float | None
    step_time_s: StepTimeStats
    #: mean seconds per step of each part of a step that appears (data_wait, forward, backward's
    #: compute, comm, optimizer, custom phases, other: :mod:`gpulse.report.phases`)
    phases_s: dict[str, float]
    data_loading_time_ratio: float | None
    #: exposed communication: the step waiting for it after backward's compute (Σ over ranks of the
    #: least-waiting rank's mean wait, per step), the share that is not waiting for slower ranks
    communication_time_ratio: float | None
    #: time any collective was in flight or waited for, overlapped with compute or not
    communication_in_flight_ratio: float | None
    #: time the ranks waited for slower ranks to reach the collective (a straggler)
    wait_for_slower_ranks_ratio: float | None
    tflops_per_gpu: float | None
    mfu: float | None
    gpu_peak_memory_allocated_gb: float | None
    gpu_peak_memory_reserved_gb: float | None
    gpu_memory_capacity_gb: float | None
    alloc_retries: int | None
    gpu_avg_utilization_percent: float | None
    gpu_max_utilization_percent: float | None
    gpu_avg_sm_active_percent: float | None
    gpu_avg_tensor_active_percent: float | None
    gpu_avg_memory_used_percent: float | None
    gpu_avg_power_w: float | None
    energy_kwh: float | None
    energy_j_per_step: float | None
    throttle_time_ratio: float | None
    throttle_time_s: float | None
    per_gpu: list[GpuSummary]
    per_rank: list[RankSummary]
    events: list[RunEvent]
    #: XID, ECC and GPU-lost events of the run's GPUs during the run
    gpu_events: list[GpuEvent]
    sources: Sources
    #: every diagnosis threshold by name, as applied (defaults with the overrides)
    thresholds: dict[str, float]
    diagnosis: list[Finding] = field(default_factory=list)
    not_evaluated: list[str] = field(default_factory=list)
    #: one-line advice on what the run did not measure and how to get it
    hints: list[str] = field(default_factory=list)
    #: the host beside the GPUs (``None`` without the agent's host_process points for the run)
    host: HostSummary | None = None
    #: the profiler windows rolling findings asked for (the run's ``train_event`` points of kind ``profile``)
    profiles: list[ProfileRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return as_json(self)


@dataclass
class NodeReport:
    """``node_report.json``: what a node's GPUs did over a recording that holds no training run
    (``gpulse agent --record`` without training): utilisation, memory, power, energy, throttling,
    events, and the diagnosis rules that need only GPU samples."""

    gpulse_report_version: int
    hosts: list[str]
    start_time_ns: int | None
    end_time_ns: int | None
    duration_s: float | None
    gpus: int
    gpu_avg_utilization_percent: float | None
    gpu_max_utilization_percent: float | None
    gpu_avg_sm_active_percent: float | None
    gpu_avg_tensor_active_percent: float | None
    gpu_avg_memory_used_percent: float | None
    gpu_avg_power_w: float | None
    energy_kwh: float | None
    throttle_time_ratio: float | None
    throttle_time_s: float | None
    per_gpu: list[GpuSummary]
    events: list[GpuEvent]
    #: points read per measurement
    sources: dict[str, int]
    thresholds: dict[str, float]
    diagnosis: list[Finding] = field(default_factory=list)
    not_evaluated: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return as_json(self)
