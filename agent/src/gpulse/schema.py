"""The data model: every measurement, tag and field gpulse writes, with its type and unit.

This module is the single source of truth. The line-protocol encoder takes field types from it,
the downsampling tasks and continuous queries are generated from it, the dashboards are checked
against it, and ``docs/schema.md`` is rendered from it (:mod:`gpulse.docs.schema`, ``gpulse schema``).

A field's type never changes: InfluxDB rejects a point whose field type differs from the type
already stored in the shard, so the encoder coerces values to the declared type.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Literal

FieldType = Literal["float", "int", "bool", "str"]
# gauge: a level, downsampled to mean/max/min. counter: monotonically increasing, downsampled
# with last (rates are derived at query time). info/label: descriptive, never downsampled.
FieldKind = Literal["gauge", "counter", "info"]

#: Where a measurement's points land when they are downsampled (see ``influxdb/``).
DOWNSAMPLE_SUFFIXES = ("_max", "_min")


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    unit: str
    doc: str
    kind: FieldKind = "gauge"

    @property
    def numeric(self) -> bool:
        return self.type in ("float", "int")

    @property
    def downsample(self) -> Literal["mean", "last", None]:
        """How the downsampling keeps this field: mean (+ _max/_min), last, or not at all."""
        if not self.numeric or self.kind == "info":
            return None
        return "last" if self.kind == "counter" else "mean"


@dataclass(frozen=True)
class Measurement:
    name: str
    doc: str
    tags: tuple[str, ...]
    fields: tuple[Field, ...]
    #: Tags that may be absent on a point (e.g. ``run`` on a GPU nobody has registered).
    optional_tags: tuple[str, ...] = ()
    #: Extra float fields allowed beyond the declared ones, named by this pattern
    #: (logged training scalars, custom phases). ``None`` means the field set is closed.
    open_fields: str | None = None
    #: Free-form user tags allowed (training runs), at most this many per point.
    max_extra_tags: int = 0
    #: Points of this measurement are copied into the downsampled retention policies.
    downsampled: bool = True
    by_name: dict[str, Field] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {f.name: f for f in self.fields})
        if len(self.by_name) != len(self.fields):
            raise ValueError(f"duplicate field in {self.name}")

    def field_type(self, name: str) -> FieldType | None:
        """The declared type of a field, ``float`` for an allowed open field, else ``None``."""
        f = self.by_name.get(name)
        if f is not None:
            return f.type
        if self.open_fields and _is_open_field(self.open_fields, name):
            return "float"
        return None

    @property
    def all_tags(self) -> tuple[str, ...]:
        return self.tags + self.optional_tags


#: Open-field answers remembered (least recently used forgotten first): a bound, since field
#: names come from outside (training runs, uploaded files) and may all differ.
OPEN_FIELD_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=OPEN_FIELD_CACHE_SIZE)
def _is_open_field(pattern: str, name: str) -> bool:
    return re.fullmatch(pattern, name) is not None


GPU_TAGS = ("host", "gpu", "uuid", "model")
TRAIN_TAGS = ("host", "run", "rank", "local_rank", "world_size")
#: Who a GPU process (and the GPU it holds) works for, from the kernel (``sources/attribution``).
JOB_TAGS = ("job", "job_user", "account", "partition", "pod", "namespace")
#: The job tags of a training point: ``account`` is the agent's, from the sending process's cgroup and initial
#: environment (never the client's), so that a ``[tenants]`` route by account takes a run's points from its first.
TRAINING_JOB_TAGS = ("job", "account")

#: What the tags mean where a reader needs telling (``docs/schema.md``).
TAG_DOCS: dict[str, str] = {
    "job": "the scheduler's job: the Slurm job id, or the Kubernetes pod UID, from the process's cgroup (where it "
    "names none, the one job a Slurm prolog's mapping gives the GPU: `--slurm-job-dir`); on `gpu`, "
    "the job all processes of the GPU belong to as of the last process sample (absent when none or several); "
    "on training points, the job of the rank's process as its cgroup names it, else `SLURM_JOB_ID` as the rank "
    "sends it",
    "job_user": "the Slurm job's user: the uid in the job's cgroup path (v1), else the process's owner "
    "(a job from the prolog's mapping: its `SLURM_JOB_USER`)",
    "account": "the Slurm job's account (`SLURM_JOB_ACCOUNT` of the process's initial environment, where readable, "
    "else of the job's file in the prolog's mapping); on training points, the agent reads it from the rank's "
    "process (a rank cannot set it)",
    "partition": "the Slurm job's partition (`SLURM_JOB_PARTITION`, as `account`)",
    "pod": "the Kubernetes pod the kubelet allocated the GPU to (pod-resources API), also with no process on it",
    "namespace": "that pod's namespace",
}


def _f(name: str, type_: FieldType, unit: str, doc: str, kind: FieldKind = "gauge") -> Field:
    return Field(name, type_, unit, doc, kind)


def _c(name: str, unit: str, doc: str) -> Field:
    return Field(name, "int", unit, doc, "counter")


def _i(name: str, type_: FieldType, unit: str, doc: str) -> Field:
    return Field(name, type_, unit, doc, "info")


# Clock-event reason flags: bit of nvmlDeviceGetCurrentClocksEventReasons -> field name.
CLOCK_EVENT_FLAGS: tuple[tuple[int, str, str], ...] = (
    (0x1, "clk_idle", "GPU idle"),
    (0x2, "clk_app_clocks", "application clocks setting"),
    (0x4, "clk_sw_power_cap", "software power cap"),
    (0x8, "clk_hw_slowdown", "hardware slowdown"),
    (0x10, "clk_sync_boost", "sync boost"),
    (0x20, "clk_sw_thermal", "software thermal slowdown"),
    (0x40, "clk_hw_thermal", "hardware thermal slowdown"),
    (0x80, "clk_hw_power_brake", "hardware power brake slowdown"),
    (0x100, "clk_display", "display clock setting"),
)
#: Reasons that mean the GPU runs slower than it could while busy (everything but idle/app/display).
THROTTLE_MASK = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80

#: NVML error kinds counted by the agent, one field each in ``agent``.
NVML_ERROR_KINDS = (
    "gpu_is_lost",
    "timeout",
    "unknown",
    "no_permission",
    "not_found",
    "driver_not_loaded",
    "lib_rm_version_mismatch",
    "function_not_found",
    "argument_version_mismatch",
    "insufficient_size",
    "other",
)

GPU = Measurement(
    "gpu",
    "One point per GPU per sampling cycle; all GPUs of a cycle share one timestamp. "
    "A metric the GPU does not support is absent, never 0. Slow-tier fields (every ~10 s "
    "and ~60 s) appear only on the cycles that read them. On a MIG-enabled GPU each MIG device "
    "has its own series, tagged `mig` (`<profile>/<index>`, e.g. `1g.18gb/1`), with its memory and GPM fields.",
    GPU_TAGS,
    (
        _f(
            "util_gpu_pct",
            "float",
            "%",
            "GPU busy time (NVML utilization.gpu): a kernel ran during the window; not SM activity",
        ),
        _f("util_mem_pct", "float", "%", "memory controller busy time (NVML utilization.memory); not capacity"),
        _f("mem_used_bytes", "int", "B", "memory used, v2 call (excludes driver-reserved memory)"),
        _f("mem_free_bytes", "int", "B", "memory free (v2)"),
        _f("mem_reserved_bytes", "int", "B", "memory reserved by the driver (v2)"),
        _f("mem_total_bytes", "int", "B", "total memory (v2)"),
        _f("temp_gpu_c", "float", "°C", "GPU die temperature"),
        _f("temp_mem_c", "float", "°C", "HBM temperature"),
        _f("power_w", "float", "W", "instantaneous board power"),
        _f("power_limit_w", "float", "W", "enforced power limit (~10 s tier)"),
        _c("energy_mj", "mJ", "energy since driver load (counter; resets on driver reload)"),
        _f("clock_sm_mhz", "int", "MHz", "SM clock"),
        _f("clock_mem_mhz", "int", "MHz", "memory clock"),
        _f("clock_graphics_mhz", "int", "MHz", "graphics clock"),
        _i("clock_event_reasons", "int", "bitmask", "nvmlDeviceGetCurrentClocksEventReasons bitmask"),
        *(
            _f(name, "int", "0/1", f"1 while clocks are held back by {text} (mean = fraction of time)")
            for _, name, text in CLOCK_EVENT_FLAGS
        ),
        _f("throttled", "int", "0/1", "1 while any power/thermal/hardware/sync-boost reason holds clocks back"),
        _f("pstate", "int", "P-state", "performance state, 0 (max) .. 15 (min)"),
        _f("fan_pct", "float", "%", "fan speed"),
        _f(
            "pcie_tx_bytes_per_s",
            "float",
            "B/s",
            "PCIe transmit rate over the cycle (byte counters); where the GPU lacks them, a 20 ms NVML window every ~10 s",
        ),
        _f("pcie_rx_bytes_per_s", "float", "B/s", "PCIe receive rate, as pcie_tx_bytes_per_s"),
        _f("enc_util_pct", "float", "%", "video encoder busy"),
        _f("dec_util_pct", "float", "%", "video decoder busy"),
        # GPM (Hopper and later), each over the whole cycle from two alternating samples.
        _f("sm_active_pct", "float", "%", "GPM SM activity: fraction of SMs busy, averaged over the cycle"),
        _f("sm_occupancy_pct", "float", "%", "GPM SM occupancy: resident warps / max warps"),
        _f("tensor_active_pct", "float", "%", "GPM any-tensor-pipe activity"),
        _f("hmma_active_pct", "float", "%", "GPM HMMA (FP16/BF16 tensor) activity"),
        _f("dram_bw_pct", "float", "%", "GPM DRAM bandwidth utilisation"),
        _f("fp16_active_pct", "float", "%", "GPM non-tensor FP16 pipe activity"),
        _f("fp32_active_pct", "float", "%", "GPM FP32 pipe activity"),
        _f("fp64_active_pct", "float", "%", "GPM FP64 pipe activity"),
        _f("gpm_pcie_tx_bytes_per_s", "float", "B/s", "GPM PCIe transmit rate over the cycle"),
        _f("gpm_pcie_rx_bytes_per_s", "float", "B/s", "GPM PCIe receive rate over the cycle"),
        _f("nvlink_tx_bytes_per_s", "float", "B/s", "GPM NVLink transmit rate, all links"),
        _f("nvlink_rx_bytes_per_s", "float", "B/s", "GPM NVLink receive rate, all links"),
        # ~10 s tier
        _c(
            "nvlink_tx_kib",
            "KiB",
            "NVLink data transmitted, all links (counter; NVML's all-links scope where it exists)",
        ),
        _c("nvlink_rx_kib", "KiB", "NVLink data received, all links (counter)"),
        _c("throttle_power_us", "µs", "time clocks were held back by power (counter, driver units)"),
        _c("throttle_thermal_us", "µs", "time clocks were held back by temperature (counter)"),
        _c("throttle_sync_boost_us", "µs", "time clocks were held back by sync boost (counter)"),
        _c("throttle_board_limit_us", "µs", "time clocks were held back by board limit (counter)"),
        _c("throttle_low_util_us", "µs", "time clocks were lowered for low utilisation (counter)"),
        _c("throttle_reliability_us", "µs", "time clocks were held back for reliability (counter)"),
        _c("pcie_replays", "count", "PCIe replay counter"),
        _f("pcie_link_gen", "int", "gen", "current PCIe link generation"),
        _f("pcie_link_width", "int", "lanes", "current PCIe link width"),
        # ~60 s tier
        _c("ecc_corrected_volatile", "count", "corrected ECC errors since driver load"),
        _c("ecc_uncorrected_volatile", "count", "uncorrected ECC errors since driver load"),
        _c("ecc_corrected_aggregate", "count", "corrected ECC errors, lifetime"),
        _c("ecc_uncorrected_aggregate", "count", "uncorrected ECC errors, lifetime"),
        _c("remapped_rows_correctable", "count", "rows remapped for correctable errors"),
        _c("remapped_rows_uncorrectable", "count", "rows remapped for uncorrectable errors"),
        _f("remapped_rows_pending", "int", "0/1", "1 when a row remap is pending (reset needed)"),
        _f("remapped_rows_failure", "int", "0/1", "1 when a row remap failed"),
        _c("retired_pages_sbe", "count", "pages retired for single-bit errors"),
        _c("retired_pages_dbe", "count", "pages retired for double-bit errors"),
        _f("retired_pages_pending", "int", "0/1", "1 when a page retirement is pending"),
    ),
    optional_tags=("run", "mig", *JOB_TAGS),
)

GPU_NVLINK = Measurement(
    "gpu_nvlink",
    "Per-link NVLink byte counters, every ~10 s, on GPUs with NVLink.",
    GPU_TAGS + ("link",),
    (
        _c("tx_kib", "KiB", "data transmitted on this link (counter)"),
        _c("rx_kib", "KiB", "data received on this link (counter)"),
        _f("active", "int", "0/1", "1 when the link is up"),
    ),
)

GPU_INFO = Measurement(
    "gpu_info",
    "Written once per agent start (and after a driver re-init): what the GPU is and which metrics it supports.",
    GPU_TAGS,
    (
        _i("name", "str", "", "product name as NVML reports it"),
        _i("driver_version", "str", "", "NVIDIA driver version"),
        _i("cuda_version", "str", "", "CUDA driver API version, e.g. 12.8"),
        _i("nvml_version", "str", "", "NVML library version"),
        _i("pci_bus_id", "str", "", "PCI bus id"),
        _i("vbios_version", "str", "", "VBIOS version"),
        _i("mem_total_bytes", "int", "B", "total memory"),
        _i("power_limit_w", "float", "W", "enforced power limit at start"),
        _i("clock_sm_max_mhz", "int", "MHz", "maximum SM clock"),
        _i("clock_mem_max_mhz", "int", "MHz", "maximum memory clock"),
        _i("clock_graphics_max_mhz", "int", "MHz", "maximum graphics clock"),
        _i("pcie_max_gen", "int", "gen", "maximum PCIe link generation"),
        _i("pcie_max_width", "int", "lanes", "maximum PCIe link width"),
        _i("mig_mode", "int", "0/1", "1 when MIG is enabled"),
        _i("mig_devices", "int", "count", "MIG devices sampled on this GPU (MIG mode only)"),
        _i("mig_uuid", "str", "", "the MIG device's UUID (points tagged mig only)"),
        _i("mig_gpu_instance", "int", "", "the MIG device's GPU instance id (points tagged mig only)"),
        _i("mig_compute_instance", "int", "", "the MIG device's compute instance id (points tagged mig only)"),
        _i("gpm_supported", "int", "0/1", "1 when GPM (SM/tensor activity) is available"),
        _i("nvlink_links", "int", "count", "number of NVLink links"),
        _i(
            "process_access",
            "str",
            "",
            "ok, no_permission (NVML needs privileges: a MIG parent's list for a non-root agent) or not_supported",
        ),
        _i("supported_metrics", "str", "", "comma-separated gpu fields this GPU supports"),
        _i("unsupported_metrics", "str", "", "comma-separated gpu fields this GPU does not support"),
    ),
    optional_tags=("mig",),
    downsampled=False,
)

GPU_PROCESS = Measurement(
    "gpu_process",
    "Processes using each GPU, every ~5 s. The pid is a field (never a tag); processes of one GPU "
    "in one sample get timestamps 1 ns apart so none overwrites another.",
    GPU_TAGS,
    (
        _i("pid", "int", "", "host process id"),
        _i("command", "str", "", "process name and arguments (truncated)"),
        _i("user", "str", "", "owner of the process"),
        _i(
            "container",
            "str",
            "",
            "Docker container name, or its id when the engine is unreachable; in a Kubernetes pod the container's "
            "name from the kubelet, else its id (12 characters)",
        ),
        _f("mem_used_bytes", "int", "B", "GPU memory used by the process"),
        _f("sm_util_pct", "float", "%", "SM utilisation by the process in the driver's last sample period (0: idle)"),
        _f("mem_util_pct", "float", "%", "memory controller utilisation by the process, same period"),
    ),
    optional_tags=("run", "mig", *JOB_TAGS),
)

GPU_EVENT = Measurement(
    "gpu_event",
    "Critical GPU events (XID, ECC, GPU lost/recovered) for Grafana annotations.",
    GPU_TAGS,
    (
        _i("kind", "str", "", "xid, ecc_single_bit, ecc_double_bit, gpu_lost, gpu_recovered, recovery_action, ..."),
        _i("xid", "int", "", "XID number for kind=xid, else 0"),
        _i("data", "int", "", "NVML event data"),
        _i("text", "str", "", "human-readable description"),
    ),
    downsampled=False,
)

AGENT = Measurement(
    "agent",
    "The agent's own health, every 10 s. Counters count since the agent started.",
    ("host",),
    (
        _c("samples", "count", "GPU sampling cycles completed"),
        _c("cycles_skipped", "count", "cycles skipped because the previous one ran late"),
        _f("cycle_ms", "float", "ms", "CPU wall time of the last sampling cycle"),
        _f("gpus", "int", "count", "GPUs being sampled"),
        _f("gpus_lost", "int", "count", "GPUs marked lost"),
        _c("lines_written", "count", "lines the database accepted"),
        _c("lines_spooled", "count", "lines written to the disk spool"),
        _c("lines_replayed", "count", "lines replayed from the spool"),
        _c("lines_dropped", "count", "lines dropped (spool full, encoding errors)"),
        _c("lines_rejected", "count", "lines the database rejected (dead-lettered)"),
        _c("values_dropped_nonfinite", "count", "NaN/Inf field values dropped by the encoder"),
        _f("spool_bytes", "int", "B", "bytes in the disk spool"),
        _c("spool_damaged_lines", "count", "lines lost to spool damage (torn writes, corruption) found at replay"),
        _c("spool_damaged_bytes", "count", "bytes of damaged spool records skipped at replay"),
        _f("buffer_lines", "int", "count", "lines waiting in memory"),
        _f("write_latency_ms", "float", "ms", "duration of the last successful write"),
        _f("last_write_age_s", "float", "s", "seconds since the last successful write"),
        _c("records_received", "count", "training records received on the socket"),
        _c("records_rejected", "count", "training records rejected as malformed"),
        _f("runs_registered", "int", "count", "training runs registered on this node"),
        _c("live_runs_evicted", "count", "runs no longer judged live to make room for a new one (rolling findings)"),
        _c("host_processes_skipped", "count", "training process samples not taken: too many processes at once"),
        _c("training_processes_evicted", "count", "processes named by runs' start points forgotten for newer ones"),
        *(_c(f"nvml_errors_{k}", "count", f"failed NVML calls: {k.replace('_', ' ')}") for k in NVML_ERROR_KINDS),
        _f("uptime_s", "float", "s", "seconds since the agent started"),
    ),
)

TRAIN_STEP = Measurement(
    "train_step",
    "One point per training step per rank, timestamped at the step's end. Phase CPU times are "
    "wall times on the host; *_gpu_s come from CUDA events read only once complete. Extra fields: "
    "custom phases (phase_<name>_s, phase_<name>_gpu_s) and logged scalars (log_<name>).",
    TRAIN_TAGS,
    (
        _c("step", "", "global step index"),
        _i("start_time_ns", "int", "ns", "step start, Unix time"),
        _i("end_time_ns", "int", "ns", "step end, Unix time"),
        _f("step_time_s", "float", "s", "wall time of the step"),
        _f("data_wait_s", "float", "s", "host time blocked waiting for the batch before the step"),
        _f("forward_s", "float", "s", "forward phase, host wall time"),
        _f("backward_s", "float", "s", "backward phase, host wall time"),
        _f("optimizer_s", "float", "s", "optimizer phase, host wall time"),
        _f("forward_gpu_s", "float", "s", "forward phase, GPU time (CUDA events)"),
        _f("backward_gpu_s", "float", "s", "backward phase, GPU time (CUDA events)"),
        _f("optimizer_gpu_s", "float", "s", "optimizer phase, GPU time (CUDA events)"),
        _f(
            "comm_s",
            "float",
            "s",
            "exposed communication: time the step waited for gradient communication after backward's compute "
            "(includes waiting for slower ranks; the report separates the two)",
        ),
        _f(
            "comm_in_flight_s",
            "float",
            "s",
            "time any collective of the step was in flight or waited for (DDP comm hook); overlapped with compute "
            "where comm_s is smaller",
        ),
        _f("samples", "int", "count", "samples processed in the step"),
        _f("tokens", "int", "count", "tokens processed in the step"),
        _f("samples_per_s", "float", "1/s", "samples / step time"),
        _f("tokens_per_s", "float", "1/s", "tokens / step time"),
        _f("tflops", "float", "TFLOP/s", "achieved model TFLOP/s of this rank (formula in train_run.mfu_formula)"),
        _f("mfu", "float", "ratio", "model FLOPs utilisation, achieved / peak FLOP/s (0..1)"),
        _f("mem_allocated_bytes", "int", "B", "CUDA memory allocated at step end"),
        _f("mem_reserved_bytes", "int", "B", "CUDA memory reserved by the caching allocator"),
        _f("mem_peak_bytes", "int", "B", "peak allocated during the step (peak reset each step)"),
        _c("alloc_retries", "count", "caching-allocator retries (cudaMalloc failed, cache flushed)"),
    ),
    open_fields=r"(phase_[a-z0-9_]{1,48}_(gpu_)?s|log_[A-Za-z0-9_./-]{1,64})",
    optional_tags=TRAINING_JOB_TAGS,
    max_extra_tags=8,
)

TRAIN_RUN = Measurement(
    "train_run",
    "Run lifecycle, one point at start and one at end per rank (Grafana annotations).",
    TRAIN_TAGS,
    (
        _i("event", "str", "", "start or end"),
        _i("status", "str", "", "running, finished, failed or interrupted"),
        _i("name", "str", "", "run name"),
        _i("config", "str", "", "JSON summary of the run's configuration"),
        _i("gpus", "str", "", "comma-separated CUDA device UUIDs used by this rank"),
        _i("mfu_formula", "str", "", "how MFU is computed (e.g. 6N+12LHQT per token)"),
        _i("peak_flops", "float", "FLOP/s", "peak FLOP/s per device used for MFU"),
        _i("flops_per_token", "float", "FLOP", "training FLOPs per token used for MFU"),
        _i("steps", "int", "count", "steps completed (at end)"),
        _i("samples", "int", "count", "samples of all the rank's steps (at end)"),
        _i("tokens", "int", "count", "tokens of all the rank's steps (at end)"),
        _i("duration_s", "float", "s", "run duration (at end)"),
        _i("pid", "int", "", "training process id"),
    ),
    optional_tags=TRAINING_JOB_TAGS,
    max_extra_tags=8,
    downsampled=False,
)

TRAIN_EVENT = Measurement(
    "train_event",
    "Run events (eval, checkpoint, oom, ...) for Grafana annotations.",
    TRAIN_TAGS,
    (
        _i("kind", "str", "", "event kind: eval, checkpoint, oom, profile (a profiler window), ..."),
        _i("text", "str", "", "free text"),
        _i("step", "int", "", "step at which the event happened"),
        _i(
            "profile",
            "str",
            "",
            "kind=profile: the window as JSON (rule, steps, trace path, summary, py-spy dump path or why none; "
            "`gpulse.report.records.ProfileRecord`), read back into the report's `profiles`",
        ),
    ),
    optional_tags=TRAINING_JOB_TAGS,
    max_extra_tags=8,
    downsampled=False,
)

TRAIN_FINDING = Measurement(
    "train_finding",
    "A diagnosis rule (docs/report.md) raised or cleared while the run is going, by the agent's rolling "
    "diagnosis over the run's recent steps on its node (`gpulse.report.live`); Grafana annotations and alerts.",
    ("host", "run", "rule"),
    (
        _i("state", "str", "", "raised, cleared, or ended (the run ended while the finding was open)"),
        _i("open", "int", "", "1 at a raise, 0 at a clear or end (what alerts read)"),
        _i("title", "str", "", "the rule's title"),
        _i("evidence", "str", "", "what the window showed, with numbers (at the raise, or the last time it held)"),
        _i("action", "str", "", "what to do about it"),
        _i("threshold", "str", "", "the threshold the window crossed"),
        _i("first_step", "int", "", "the step at which the rule first held"),
        _i("last_step", "int", "", "the last step at which the rule held"),
        _i("window_steps", "int", "count", "steps (of all ranks on the node) in the window judged"),
        _i(
            "case",
            "str",
            "",
            "which case of the rule: data_loading's io_bound, cpu_bound_workers, too_few_workers, ...",
        ),
    ),
    open_fields=r"figure_[a-z0-9_]{1,48}",
    downsampled=False,
)

HOST = Measurement(
    "host",
    "The node beside the GPUs, every sampling cycle (`gpulse.sources.host`): CPU, memory, disks, network. "
    "Rates and CPU shares are over the cycle, from two readings of the kernel's counters, so the agent's "
    "first cycle has none. Turn off with `host_metrics = false`.",
    ("host",),
    (
        _f("cpus", "int", "count", "logical CPUs online"),
        _f("cpu_busy_pct", "float", "%", "CPU time spent working, all CPUs (100 = every CPU busy): user, system, irq"),
        _f("cpu_idle_pct", "float", "%", "CPU time idle, not waiting for I/O"),
        _f(
            "cpu_iowait_pct",
            "float",
            "%",
            "CPU time idle while I/O was pending (only counted when a CPU has nothing else to do)",
        ),
        _f("cpu_steal_pct", "float", "%", "CPU time the hypervisor gave to other guests"),
        _f("mem_total_bytes", "int", "B", "physical memory"),
        _f("mem_available_bytes", "int", "B", "memory available to new work without swapping (MemAvailable)"),
        _f("swap_used_bytes", "int", "B", "swap in use"),
        _f("swap_in_bytes_per_s", "float", "B/s", "swapped in from disk"),
        _f("swap_out_bytes_per_s", "float", "B/s", "swapped out to disk"),
        _f("disk_read_bytes_per_s", "float", "B/s", "read from all block devices (whole disks, not partitions)"),
        _f("disk_write_bytes_per_s", "float", "B/s", "written to all block devices"),
        _f("disk_busy_pct", "float", "%", "the busiest block device's busy time (100: at its limit for one queue)"),
        _f("net_recv_bytes_per_s", "float", "B/s", "received on all interfaces but loopback"),
        _f("net_sent_bytes_per_s", "float", "B/s", "sent on all interfaces but loopback"),
    ),
)

HOST_PROCESS = Measurement(
    "host_process",
    "Each registered training process (`process=main`) and its DataLoader workers (its children, "
    "`process=worker0`, `worker1`, ... in order of appearance), every sampling cycle. The pid is a field; "
    "`run` and `rank` come from the process's registration on the training channel. A process that ended "
    "is one point with `state=gone`.",
    ("host", "process"),
    (
        _i("pid", "int", "", "process id (as the agent sees it)"),
        _i("state", "str", "", "psutil status: running, sleeping, disk-sleep, ..., gone, no_permission"),
        _f(
            "running",
            "int",
            "0/1",
            "1 when running or runnable (state R): mean = share of the time on or waiting for a CPU",
        ),
        _f(
            "disk_sleep",
            "int",
            "0/1",
            "1 when in uninterruptible sleep (state D, blocked on I/O): mean = share of the time",
        ),
        _f("cpu_pct", "float", "%", "CPU used over the cycle, in % of one core (100 = a full core; more with threads)"),
        _f("mem_rss_bytes", "int", "B", "resident memory (counts pages shared with other workers once per process)"),
        _f(
            "mem_pss_bytes",
            "int",
            "B",
            "proportional set size (shared pages split among their users), every ~10 s where the agent may read it",
        ),
        _f("read_bytes_per_s", "float", "B/s", "read from block devices (page-cache hits excluded)"),
        _f("write_bytes_per_s", "float", "B/s", "written to block devices"),
        _f("read_chars_per_s", "float", "B/s", "read through read() and friends, page-cache hits included"),
        _f("threads", "int", "count", "threads of the process"),
        _f("workers", "int", "count", "worker processes of a main process"),
        _i("cpu_limit_cores", "float", "cores", "the CPU limit of the main process's cgroup, absent when unlimited"),
    ),
    optional_tags=("run", "rank", *TRAINING_JOB_TAGS),
)

MEASUREMENTS: dict[str, Measurement] = {
    m.name: m
    for m in (
        GPU,
        GPU_NVLINK,
        GPU_INFO,
        GPU_PROCESS,
        GPU_EVENT,
        AGENT,
        TRAIN_STEP,
        TRAIN_RUN,
        TRAIN_EVENT,
        TRAIN_FINDING,
        HOST,
        HOST_PROCESS,
    )
}

#: Limits on what a point may carry (the agent validates training records against these).
MAX_STRING_LEN = 4096
MAX_TAG_VALUE_LEN = 256
