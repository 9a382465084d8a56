"""The diagnosis: a registry of rules, each a function that finds one bottleneck in a report.

Stdlib only (``Run.finish()`` runs it inside training). A rule is registered with ``@rule(...)``:
its id and title, the thresholds it reads (fields of :class:`Thresholds`, the single table of
limits), and the action to take. Its function looks at the report and returns a :class:`Hit`
(the evidence, with numbers, and the threshold crossed), a :class:`NotEvaluated` (the data it needs
is missing) or ``None`` (nothing found). ``docs/report.md`` is rendered from the thresholds and the
rules (``python -m gpulse.report.diagnose``); ``gpulse report --threshold name=value`` and
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
from gpulse.report.records import Finding, GpuSummary, NodeReport, RunReport


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


#: GPUs named one by one in a finding's evidence; the rest are counted (all are in its data).
EVIDENCE_GPUS = 8


def _gpus_hit(
    gpus: Sequence[GpuSummary],
    text: Callable[[GpuSummary], str],
    worst_first: Callable[[GpuSummary], float],
    threshold: str,
    **data: Any,
) -> Outcome:
    """The finding for the GPUs a rule picked (none: nothing found): ``key: text`` for the
    :data:`EVIDENCE_GPUS` worst (lowest ``worst_first`` first), a count of the rest, every key in the data."""
    if not gpus:
        return None
    shown = "; ".join(f"{g.key}: {text(g)}" for g in sorted(gpus, key=worst_first)[:EVIDENCE_GPUS])
    rest = len(gpus) - EVIDENCE_GPUS
    evidence = shown + (f"; and {rest} more GPU(s) (all of them in the finding's data)" if rest > 0 else "")
    return Hit(evidence, threshold, {"gpus": [g.key for g in gpus], **data})


# -- the rules, in the order their findings are listed -------------------------------------------------
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
        f"(mean wait {r.phases_s.get('data_wait', 0):.4f} s per step vs {r.step_time_s.mean or 0:.4f} s of compute)."
    )
    threshold = f"data_loading_time_ratio > {t.data_loading_ratio}"
    if r.host is None:
        return Hit(
            wait + " No host figures for this run (the agent samples them beside the GPUs).", threshold, {"ratio": dl}
        )
    case = classify(r.host, t)
    return Hit(f"{wait} {case.evidence}", threshold, {"ratio": dl, "case": case.case.value}, action=case.action)


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
        return NotEvaluated("no comm_s in the steps" + (f" ({r.hints[0]})" if r.hints else ""))
    if cr <= t.communication_ratio:
        return None
    flight = r.communication_in_flight_ratio
    in_flight = f"; collectives were in flight {_pct(flight)} of it, overlapped or not" if flight is not None else ""
    partial = " This report lacks ranks: part of the wait may be for a slower rank." if r.partial else ""
    return Hit(
        f"{_pct(cr)} of step time is spent waiting for communication after backward's compute "
        f"(communication that does not overlap with compute){in_flight}.{partial}",
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
        hot, text, lambda g: -(g.throttle_time_ratio or 0), f"throttled > {_pct(t.throttle_ratio)} of samples"
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
            f"rank {x.rank} ({x.host or '?'}{', ' + ','.join(x.gpus) if x.gpus else ''}): "
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
    return found, skipped


def _subject(report: RunReport | NodeReport) -> str:
    return "run" if isinstance(report, RunReport) else "recording"


DOC_INTRO = """# Run report and diagnosis

`run.finish()` writes `metrics_report.json` into the run's output directory (in a distributed run,
rank 0 writes it for every rank: each rank hands its points over through the process group's
key-value store at `finish()`; a rank that cannot makes the report `partial`, with the reason), and
`gpulse report --run ID` builds the same report from InfluxDB (or `--from-file` a recording),
prints it (diagnosis first), writes `metrics_report.json` to `--out`, and with `--html` a
self-contained `metrics_report.html` (inline SVG plots; opens without a server).

```
gpulse report --run exp1 --url http://127.0.0.1:8086 --api v1 --bucket gpulse --html --out reports/
gpulse report --from-file out/gpulse-records.rec --threshold data_loading_ratio=0.25
```

A recording without a training run (`gpulse agent --record node.lp`) gives a **node report**
instead: `node_report.json` (and `node_report.html`) with each GPU's utilisation, memory, power,
energy and throttling, the GPU events (XID, ECC, lost), and the rules that need only GPU samples.

## Main fields

| field | meaning |
| --- | --- |
| `train_runtime` | run duration, s (from the run's start/end points, else the steps' span) |
| `train_samples_per_second`, `train_steps_per_second`, `train_tokens_per_second` | totals over all ranks / runtime |
| `data_loading_time_ratio` | Σ data wait / Σ (data wait + step time), all ranks |
| `communication_time_ratio` | exposed communication: time steps wait for it after backward's compute, less waiting for slower ranks, / Σ step time (only where it is measured) |
| `communication_in_flight_ratio` | time any collective was in flight or waited for / Σ step time (DDP comm hook: `attach_ddp`) |
| `wait_for_slower_ranks_ratio` | time ranks waited at the collective for slower ranks (a straggler) / Σ step time |
| `partial`, `partial_reason` | the report lacks ranks of the run, and why (rank 0 gathers every rank's points at `finish()`) |
| `mfu`, `tflops_per_gpu` | step-time-weighted means of the per-step values (formula in `run.mfu_formula`) |
| `gpu_peak_memory_allocated_gb` | peak CUDA memory allocated by any rank, GiB (2^30 B) |
| `gpu_avg_utilization_percent`, `gpu_max_utilization_percent` | NVML util over the run's GPU samples |
| `gpu_avg_sm_active_percent`, `gpu_avg_tensor_active_percent` | GPM activity (Hopper+), where known |
| `energy_kwh`, `energy_j_per_step` | from the GPU energy counters (else power × time) |
| `throttle_time_ratio`, `throttle_time_s` | worst GPU: share / seconds of samples with clocks held back |
| `per_gpu`, `per_rank` | the spread: one entry per GPU and per rank (`slowdown_vs_median` per rank) |
| `hints` | what a distributed run did not measure, and the call that measures it |
| `host` | the host beside the run's GPUs, from the agent's `host` and `host_process` points: cores free, the training processes' and DataLoader workers' CPU and their shares on a CPU and blocked on disk (null without them); the `data_loading` finding names its case from it |
| `diagnosis` | findings: `id`, `title`, `evidence` (numbers), `threshold`, `action` |
| `not_evaluated` | checks skipped for lack of data (e.g. no GPU samples) |

GPU samples of a run are the `gpu` points tagged `run=<id>` (the agent tags the GPUs a run
registered), else the GPUs of the run's hosts during the run's time window.

The HTML report plots every GPU and every rank: up to 16 as one line each, more as a heat strip
(one row per GPU or rank, colour = value) with the median and the 10th-90th percentile band.
Throughput is what the user got: tokens (or samples) per second of wall time, data waits included.

## Diagnosis thresholds

Override any of them with `--threshold name=value` (repeatable) or `build_report(..., thresholds={...})`.

| name | default | unit | meaning |
| --- | --- | --- | --- |
"""


def render_markdown() -> str:
    """``docs/report.md``, from :class:`Thresholds` and :data:`RULES` (a test keeps the file equal to this)."""
    rows = [f"| `{t.name}` | {t.default:g} | {t.unit} | {t.doc} |" for t in THRESHOLDS.values()]
    rules = [
        f"| `{r.id}` | {r.title} | {', '.join(f'`{t}`' for t in r.thresholds)} | "
        f"{'run and node' if r.gpus_only else 'run'} | {r.action} |"
        for r in RULES.values()
    ]
    head = [
        "",
        "## Rules",
        "",
        "Each finding comes from one rule (`gpulse.report.diagnose`), listed in this order.",
        "",
        "| id | finding | thresholds | reports | action |",
        "| --- | --- | --- | --- | --- |",
    ]
    return DOC_INTRO + "\n".join(rows + head + rules) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
