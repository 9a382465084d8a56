"""The diagnosis: a registry of rules, each a function that finds one bottleneck in a report.

Stdlib only (``Run.finish()`` runs it inside training). A rule is registered with ``@rule(...)``:
its id and title, the thresholds it reads (fields of :class:`Thresholds`, the single table of
limits), and the action to take. Its function looks at the report and returns a :class:`Hit`
(the evidence, with numbers, and the threshold crossed), a :class:`NotEvaluated` (the data it needs
is missing) or ``None`` (nothing found). ``docs/report.md`` is rendered from the thresholds and the
rules (:mod:`gpulse.docs.report`); ``gpulse report --threshold name=value`` and
``build_report(thresholds=...)`` override limits.

Adding a rule: a function with ``@rule`` below the others (findings come in registry order), its
thresholds as fields of :class:`Thresholds`, a test in ``agent/tests/report/test_diagnose.py``,
then ``make generate``. Rules marked ``gpus_only`` read nothing but ``per_gpu`` and also run on a
node report (a recording without a training run).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from gpulse.report.host import classify
from gpulse.report.records import Finding, GpuEvent, GpuSummary, NodeReport, RunReport
from gpulse.report.units import duration


class ThresholdError(ValueError):
    """An unknown threshold name or a value that is no number; the message says which."""


def _limit(default: float, unit: str, doc: str) -> Any:
    return field(default=default, metadata={"unit": unit, "doc": doc})


@dataclass(frozen=True)
class Thresholds:
    """Every limit the rules apply; the field metadata documents each one in ``docs/report.md``."""

    data_loading_ratio: float = _limit(
        0.15, "ratio", "data_loading_time_ratio above this: the input pipeline starves the GPU"
    )
    loader_busy_ratio: float = _limit(
        0.5,
        "ratio",
        "data loading's case: loaders (the workers, else the training process) on or waiting for a CPU at least "
        "this share of samples are CPU-bound",
    )
    loader_disk_sleep_ratio: float = _limit(
        0.2, "ratio", "... loaders blocked on block I/O (state D) at least this share of samples: I/O-bound"
    )
    loader_iowait_pct: float = _limit(20.0, "%", "... or the host's CPUs in iowait at least this on average: I/O-bound")
    free_core_min: float = _limit(
        1.0, "cores", "more DataLoader workers are advised only with at least this many cores free on the host"
    )
    communication_ratio: float = _limit(0.05, "ratio", "communication_time_ratio above this: exposed communication")
    starved_util_pct: float = _limit(
        30.0,
        "%",
        "GPU busy (NVML util) below this on average: the GPU waits for work (its memory use is in the evidence)",
    )
    launch_bound_util_pct: float = _limit(80.0, "%", "NVML util at least this ...")
    launch_bound_sm_active_pct: float = _limit(
        40.0, "%", "... while SM activity (GPM) is below this: busy but mostly idle SMs"
    )
    imbalance_factor: float = _limit(
        1.5, "×", "a rank (data wait + compute per step) or GPU (busy time) this many times worse than the median"
    )
    imbalance_min_util_pct: float = _limit(
        10.0, "%", "GPU imbalance is judged only when the median GPU is busier than this"
    )
    throttle_ratio: float = _limit(0.10, "ratio", "fraction of samples with clocks held back (power/thermal/hardware)")
    fragmentation_memory_pct: float = _limit(
        90.0, "%", "peak reserved (else allocated) memory at least this share of capacity ..."
    )
    fragmentation_retries: float = _limit(1.0, "count", "... with at least this many caching-allocator retries")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Threshold:
    """One row of the thresholds table (for the docs and error messages)."""

    name: str
    default: float
    unit: str
    doc: str


THRESHOLDS: dict[str, Threshold] = {
    f.name: Threshold(f.name, f.default, f.metadata["unit"], f.metadata["doc"]) for f in fields(Thresholds)
}


def resolve_thresholds(overrides: Mapping[str, float] | None = None) -> Thresholds:
    """The defaults with ``overrides`` applied; an unknown name is a :class:`ThresholdError`."""
    unknown = [name for name in overrides or {} if name not in THRESHOLDS]
    if unknown:
        raise ThresholdError(f"unknown threshold {unknown[0]!r}; known: {', '.join(THRESHOLDS)}")
    return Thresholds(**{name: float(v) for name, v in (overrides or {}).items()})


def parse_threshold_args(items: list[str] | None) -> dict[str, float]:
    """``["name=value", ...]`` from ``--threshold`` into a dict, with clear errors."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        if not sep:
            raise ThresholdError(f"--threshold takes name=value, not {item!r}")
        try:
            out[name.strip()] = float(raw)
        except ValueError:
            raise ThresholdError(f"--threshold {name}: {raw!r} is not a number") from None
    resolve_thresholds(out)
    return out


# -- the rule registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hit:
    """A rule fired: what was seen (with numbers), the threshold it crossed, and figures for tools."""

    evidence: str
    threshold: str
    data: dict[str, Any] = field(default_factory=dict)
    #: what to do in this case, where it differs from the rule's general action
    action: str | None = None


@dataclass(frozen=True)
class NotEvaluated:
    """A rule could not look: the data it needs is missing (said in ``not_evaluated``)."""

    why: str


Outcome = Hit | NotEvaluated | None
R = TypeVar("R")


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    #: the :class:`Thresholds` fields the rule reads
    thresholds: tuple[str, ...]
    action: str
    #: reads only ``per_gpu``: also evaluated on node reports
    gpus_only: bool
    check: Callable[[Any, Thresholds], Outcome]


RULES: dict[str, Rule] = {}


def rule(
    rule_id: str, title: str, *, thresholds: tuple[str, ...], action: str, gpus_only: bool = False
) -> Callable[[Callable[[R, Thresholds], Outcome]], Callable[[R, Thresholds], Outcome]]:
    """Register a rule; its thresholds must be fields of :class:`Thresholds` (checked at import)."""
    unknown = [t for t in thresholds if t not in THRESHOLDS]
    if unknown or rule_id in RULES:
        raise ValueError(f"rule {rule_id!r}: duplicate id or unknown thresholds {unknown}")

    def register(fn: Callable[[R, Thresholds], Outcome]) -> Callable[[R, Thresholds], Outcome]:
        RULES[rule_id] = Rule(rule_id, title, thresholds, action, gpus_only, fn)
        return fn

    return register


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


#: GPUs named one by one in a finding's evidence, the worst first; the rest are named in short.
EVIDENCE_GPUS = 3
#: GPUs of the rest named by index; beyond that they are only counted (all are in the data).
EVIDENCE_REST = 12


#: GPU events named in a finding's evidence (all are in the report's ``gpu_events``).
EVIDENCE_EVENTS = 5


def _gpu_name(r: RunReport | NodeReport, uuid: str | None, host: str | None = None, index: str | None = None) -> str:
    """A GPU as the evidence names it (``GPU 3 (GPU-1d0b…)``), from its uuid, else its host and index."""
    hosts = _many_hosts(r)
    for g in r.per_gpu:
        if (uuid and g.uuid == uuid) or (not uuid and g.host == host and g.gpu == index):
            return g.name(hosts)
    return f"{host} GPU {index}" if hosts else f"GPU {index}"


def _event_text(r: RunReport, e: GpuEvent) -> str:
    """``GPU 6 (GPU-…): XID 31: text, 2 min 10 s into the run``."""
    text = f"{_gpu_name(r, e.uuid, e.host, e.gpu)}: {e.describe()}"
    if e.time_ns is not None and r.start_time_ns is not None:
        text += f", {duration(max(0, e.time_ns - r.start_time_ns) / 1e9)} into the run"
    return text


def _many_hosts(r: RunReport | NodeReport) -> bool:
    return len({g.host for g in r.per_gpu}) > 1


def _gpus_hit(
    r: RunReport | NodeReport,
    gpus: Sequence[GpuSummary],
    text: Callable[[GpuSummary], str],
    worst_first: Callable[[GpuSummary], float],
    threshold: str,
    **data: Any,
) -> Outcome:
    """The finding for the GPUs a rule picked (none: nothing found), readable at a glance: the
    :data:`EVIDENCE_GPUS` worst (lowest ``worst_first`` first) as ``GPU 3 (GPU-1d0b…): text``, the
    others by name only, every key in the data."""
    if not gpus:
        return None
    hosts = _many_hosts(r)
    ranked = sorted(gpus, key=worst_first)
    evidence = "; ".join(f"{g.name(hosts)}: {text(g)}" for g in ranked[:EVIDENCE_GPUS])
    rest = sorted(ranked[EVIDENCE_GPUS:], key=GpuSummary.order)
    if rest:
        names = ", ".join(g.label(hosts) for g in rest[:EVIDENCE_REST])
        more = f" and {len(rest) - EVIDENCE_REST} more" if len(rest) > EVIDENCE_REST else ""
        evidence += f"; also {names}{more} (each in the finding's data)"
    return Hit(evidence, threshold, {"gpus": [g.key for g in gpus], **data})


# -- the rules, in the order their findings are listed -------------------------------------------------
@rule(
    "gpu_errors",
    "A GPU of the run reported errors (XID, ECC, lost)",
    thresholds=(),
    action="Look each XID up in NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors): some come from the "
    "application (e.g. XID 31, a GPU memory fault), others from the GPU or driver (e.g. 48 or 94/95 ECC, 79 fell off "
    "the bus); check the kernel log (dmesg) and nvidia-smi -q on that node, and drain it if the errors repeat.",
)
def gpu_errors(r: RunReport, t: Thresholds) -> Outcome:
    if not r.gpu_events:
        return None
    shown = "; ".join(_event_text(r, e) for e in r.gpu_events[:EVIDENCE_EVENTS])
    rest = len(r.gpu_events) - EVIDENCE_EVENTS
    return Hit(
        shown + (f"; and {rest} more (all in gpu_events)" if rest > 0 else ""),
        "any gpu_event on the run's GPUs during the run",
        {"events": len(r.gpu_events)},
    )


@rule(
    "data_loading",
    "Input pipeline bottleneck: training waits for data",
    thresholds=(
        "data_loading_ratio",
        "loader_busy_ratio",
        "loader_disk_sleep_ratio",
        "loader_iowait_pct",
        "free_core_min",
    ),
    action="With the agent's host figures the finding names the case and its action (gpulse.report.host): "
    "I/O-bound (faster or local storage, fewer larger files, caching), CPU-bound workers or too few workers "
    "(more DataLoader workers only while the host has a free core; else cheaper items: pre-tokenize, cache, "
    "decode on the GPU). Without them: add workers only if the host has idle cores, set persistent_workers=True "
    "and pin_memory=True, and move decoding/tokenization out of __getitem__.",
)
def data_loading(r: RunReport, t: Thresholds) -> Outcome:
    dl = r.data_loading_time_ratio
    if dl is None:
        return NotEvaluated("no data_wait_s in the steps")
    if dl <= t.data_loading_ratio:
        return None
    wait = (
        f"{_pct(dl)} of step time is spent waiting for the next batch "
        f"(mean wait {r.phases_s.get('data_wait', 0):.4f} s per step vs {r.step_time_s.mean or 0:.4f} s of step after it)."
    )
    threshold = f"data_loading_time_ratio > {t.data_loading_ratio}"
    if r.host is None:
        return Hit(
            wait + " No host figures for this run (the agent samples them beside the GPUs).", threshold, {"ratio": dl}
        )
    case = classify(r.host, t)
    data = {"ratio": dl, "case": case.case.value, **case.figures}
    return Hit(f"{wait} {case.evidence}", threshold, data, action=case.action)


@rule(
    "communication",
    "Exposed communication time",
    thresholds=("communication_ratio",),
    action="Overlap gradients with backward (DDP bucket_cap_mb 50-100, gradient_as_bucket_view=True, "
    "static_graph=True); use gradient accumulation with no_sync(); check NCCL picks NVLink/IB "
    "(NCCL_DEBUG=INFO, no NCCL_P2P_DISABLE/NCCL_IB_DISABLE); consider FSDP/ZeRO sharding settings.",
)
def communication(r: RunReport, t: Thresholds) -> Outcome:
    cr = r.communication_time_ratio
    if cr is None:
        hint = next((h for h in r.hints if "gpulse.training.comm" in h), None)
        return NotEvaluated("no comm_s in the steps" + (f" ({hint})" if hint else ""))
    if cr <= t.communication_ratio:
        return None
    flight = r.communication_in_flight_ratio
    in_flight = f"; collectives were in flight {_pct(flight)} of it, overlapped or not" if flight is not None else ""
    partial = " This report lacks ranks: part of the wait may be for a slower rank." if r.partial else ""
    return Hit(
        f"{_pct(cr)} of step time is communication itself: the wait for it after backward's compute "
        f"(communication that does not overlap with compute), less waiting for slower ranks{in_flight}.{partial}",
        f"communication_time_ratio > {t.communication_ratio}",
        {"ratio": cr, "in_flight_ratio": flight},
    )


@rule(
    "gpu_starved",
    "GPUs sit mostly idle",
    thresholds=("starved_util_pct",),
    action="The GPU waits on something else: the input pipeline (see data loading), host-side work "
    "between steps (logging, .item(), checkpointing), or other ranks. Profile one step with "
    "torch.profiler to see the gaps. A GPU whose memory is nearly empty may not be used by the job at all.",
    gpus_only=True,
)
def gpu_starved(r: RunReport | NodeReport, t: Thresholds) -> Outcome:
    idle = [
        g for g in r.per_gpu if g.avg_utilization_percent is not None and g.avg_utilization_percent < t.starved_util_pct
    ]
    return _gpus_hit(
        r,
        idle,
        lambda g: (
            f"busy {g.avg_utilization_percent:.0f}%, memory "
            + ("n/a" if g.avg_memory_used_percent is None else f"{g.avg_memory_used_percent:.0f}% full")
        ),
        lambda g: g.avg_utilization_percent or 0,
        f"util < {t.starved_util_pct:g}%",
    )


@rule(
    "launch_bound",
    "GPU looks busy but its SMs are mostly idle",
    thresholds=("launch_bound_util_pct", "launch_bound_sm_active_pct"),
    action="Kernels are too small to fill the GPU (launch-bound): increase the micro-batch size, use "
    "torch.compile or CUDA graphs to cut launch overhead, use fused attention "
    "(attn_implementation='sdpa' or 'flash_attention_2') and fused optimizers (fused=True).",
    gpus_only=True,
)
def launch_bound(r: RunReport | NodeReport, t: Thresholds) -> Outcome:
    with_sm = [g for g in r.per_gpu if g.avg_sm_active_percent is not None and g.avg_utilization_percent is not None]
    if not with_sm:
        return NotEvaluated("no SM activity (GPM needs Hopper or later)")
    return _gpus_hit(
        r,
        [
            g
            for g in with_sm
            if (g.avg_utilization_percent or 0) >= t.launch_bound_util_pct
            and (g.avg_sm_active_percent or 0) < t.launch_bound_sm_active_pct
        ],
        lambda g: f"NVML util {g.avg_utilization_percent:.0f}% but SM active {g.avg_sm_active_percent:.0f}%",
        lambda g: g.avg_sm_active_percent or 0,
        f"util >= {t.launch_bound_util_pct:g}% and SM active < {t.launch_bound_sm_active_pct:g}%",
    )


@rule(
    "gpu_imbalance",
    "Some GPUs work much less than the others",
    thresholds=("imbalance_factor", "imbalance_min_util_pct"),
    action="Work is unevenly split: with device_map='auto' (naive pipeline) GPUs take turns — use "
    "DDP/FSDP instead, or balance the layer split (max_memory per GPU); otherwise check that "
    "every GPU got a rank and equal batch sizes.",
    gpus_only=True,
)
def gpu_imbalance(r: RunReport | NodeReport, t: Thresholds) -> Outcome:
    busy = [(g, g.avg_utilization_percent) for g in r.per_gpu if g.avg_utilization_percent is not None]
    if len(busy) < 2:
        return None
    med = statistics.median_high([u for _, u in busy])
    if med < t.imbalance_min_util_pct:
        return None
    return _gpus_hit(
        r,
        [g for g, u in busy if u * t.imbalance_factor < med],
        lambda g: f"busy {g.avg_utilization_percent:.0f}% vs median {med:.0f}%",
        lambda g: g.avg_utilization_percent or 0,
        f"GPU busy × {t.imbalance_factor:g} < median GPU busy",
        median_util=med,
    )


@rule(
    "throttling",
    "GPU clocks held back (power or thermal)",
    thresholds=("throttle_ratio",),
    action="Check cooling and airflow (temp_gpu_c, fans), the power limit (nvidia-smi -q -d POWER; "
    "power cap vs TDP), and rack power; hardware slowdown or power brake needs the vendor.",
    gpus_only=True,
)
def throttling(r: RunReport | NodeReport, t: Thresholds) -> Outcome:
    hot = [g for g in r.per_gpu if g.throttle_time_ratio is not None and g.throttle_time_ratio > t.throttle_ratio]

    def text(g: GpuSummary) -> str:
        reasons = ", ".join(f"{k} {_pct(v)}" for k, v in g.throttle_reasons.items())
        return f"throttled {_pct(g.throttle_time_ratio or 0)} of the time" + (f" ({reasons})" if reasons else "")

    return _gpus_hit(
        r, hot, text, lambda g: -(g.throttle_time_ratio or 0), f"throttled > {_pct(t.throttle_ratio)} of samples"
    )


@rule(
    "rank_imbalance",
    "A straggler rank slows every step",
    thresholds=("imbalance_factor",),
    action="Compare that rank's GPU (throttling, a slower model, PCIe link) and host (CPU contention, its "
    "data loader); check uneven sequence lengths (bucket by length) or an uneven device_map split.",
)
def rank_imbalance(r: RunReport, t: Thresholds) -> Outcome:
    timed = [x for x in r.per_rank if x.slowdown_vs_median]
    slow = [x for x in timed if (x.slowdown_vs_median or 0) > t.imbalance_factor] if len(timed) >= 2 else []
    if not slow:
        return None
    others = [x for x in r.per_rank if x not in slow and x.wait_for_slower_ranks_s is not None]
    wait = statistics.fmean([x.wait_for_slower_ranks_s or 0.0 for x in others]) if others else None
    step = statistics.fmean([x.mean_step_time_s or 0.0 for x in others]) if others else None
    caused = (
        f"; the other ranks wait {wait:.4f} s per step for it ({_pct(wait / step)} of their step time), "
        "which is not communication"
        if wait is not None and step
        else ""
    )
    return Hit(
        "; ".join(
            f"rank {x.rank} ({x.host or '?'}{''.join(', ' + _gpu_name(r, u) for u in x.gpus)}): "
            f"{x.median_busy_time_s or 0:.4f} s of its own work per step (data wait + compute) "
            f"= {x.slowdown_vs_median or 0:.2f}× the median rank"
            for x in slow
        )
        + caused,
        f"rank work per step (data wait + compute) > {t.imbalance_factor:g}× median",
        {"ranks": [x.rank for x in slow], "wait_caused_s": wait},
    )


@rule(
    "fragmentation",
    "Memory at capacity: the allocator flushes its cache and retries",
    thresholds=("fragmentation_retries", "fragmentation_memory_pct"),
    action="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; lower the micro-batch or sequence length "
    "and use gradient accumulation; enable activation checkpointing; avoid varying tensor shapes "
    "(pad to buckets).",
)
def fragmentation(r: RunReport, t: Thresholds) -> Outcome:
    retries = int(r.alloc_retries or 0)
    peak = r.gpu_peak_memory_reserved_gb or r.gpu_peak_memory_allocated_gb
    cap = r.gpu_memory_capacity_gb
    if retries < t.fragmentation_retries:
        return None
    if cap is not None and (peak or 0) < cap * t.fragmentation_memory_pct / 100:
        return None
    near = f"peak {peak:.2f} GiB of {cap:.2f} GiB; " if peak and cap else ""
    return Hit(
        f"{near}{retries} caching-allocator retries (each one frees cached blocks and synchronizes).",
        f"alloc_retries >= {t.fragmentation_retries:g} and peak >= {t.fragmentation_memory_pct:g}% of capacity",
        {"retries": retries, "peak_gb": peak, "capacity_gb": cap},
    )


# -- running them -----------------------------------------------------------------------------------
def diagnose(report: RunReport | NodeReport, t: Thresholds) -> tuple[list[Finding], list[str]]:
    """(findings, rules that could not be evaluated for lack of data), in registry order.

    A node report gets the ``gpus_only`` rules; without GPU samples those are named once together."""
    found: list[Finding] = []
    skipped: list[str] = []
    rules = [r for r in RULES.values() if r.gpus_only or isinstance(report, RunReport)]
    if not report.per_gpu:
        gpu_rules = [r.id for r in rules if r.gpus_only]
        skipped.append(f"GPU checks ({', '.join(gpu_rules)}): no GPU samples for this {_subject(report)}")
        rules = [r for r in rules if not r.gpus_only]
    for r in rules:
        outcome = r.check(report, t)
        if isinstance(outcome, NotEvaluated):
            skipped.append(f"{r.id}: {outcome.why}")
        elif isinstance(outcome, Hit):
            action = outcome.action or r.action
            found.append(Finding(r.id, r.title, outcome.evidence, outcome.threshold, action, dict(outcome.data)))
    if isinstance(report, RunReport):
        for f in found:
            _beside(report, f)
    return found, skipped


def _beside(r: RunReport, f: Finding) -> None:
    """Name the GPU events of a finding's GPUs in its evidence: an XID may explain what the rule saw."""
    if f.id == "gpu_errors":
        return
    keys = set(f.data.get("gpus") or [])
    keys |= {u for x in r.per_rank if x.rank in (f.data.get("ranks") or []) for u in x.gpus}
    ours = {g.uuid for g in r.per_gpu if g.uuid and (g.key in keys or g.uuid in keys)}
    events = [e for e in r.gpu_events if e.uuid in ours]
    if events:
        f.evidence += (
            ("" if f.evidence.endswith(".") else ".")
            + " Meanwhile "
            + "; ".join(_event_text(r, e) for e in events[:EVIDENCE_EVENTS])
        )
        f.evidence += f"{'; and more' if len(events) > EVIDENCE_EVENTS else ''}: it may explain this."
        f.data["gpu_events"] = len(events)


def _subject(report: RunReport | NodeReport) -> str:
    return "run" if isinstance(report, RunReport) else "recording"
