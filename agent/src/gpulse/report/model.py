"""A run's numbers: ``build_report(steps, gpu, runs, events)`` -> :class:`~gpulse.report.records.RunReport`
(``metrics_report.json``); ``build_node_report(gpu, gpu_events)`` -> a node report for a recording
without a training run.

Stdlib only: ``Run.finish()`` in the training library calls it inside the training process, and
``gpulse report`` calls it with the same rows loaded from InfluxDB or a recording file, so both
give the same report.

Every input is a list of *rows*: flat dicts with ``time`` (Unix ns), the point's tags and its
fields, as InfluxQL's ``SELECT *`` returns them (absent fields may be ``None``):

* ``steps``  — ``train_step`` rows of one run, every rank;
* ``gpu``    — ``gpu`` rows of the run's GPUs over the run's time window (may be empty);
* ``runs``   — ``train_run`` rows (``event`` = start / end);
* ``events`` — ``train_event`` rows;
* ``gpu_events`` — ``gpu_event`` rows of the run's GPUs (XID, ECC, lost) during the run.

Conventions: a step's ``step_time_s`` is the step itself; ``data_wait_s`` is the time before it spent
waiting for the batch. So the data-loading ratio is Σ data wait / Σ (data wait + step time).
``comm_s`` is the time a step waited for communication after backward's compute; on a rank that
reached the collective first it includes waiting for the slower ranks. The rank that waits least
(on average per step) waits for no one: its wait is the communication itself. So the communication
ratio counts that wait for every rank's steps, and the rest is ``wait_for_slower_ranks``; a rank's
own work is its data wait and its step less its wait (the straggler rule compares it). How a step
splits into parts (``phases_s``) is :mod:`gpulse.report.phases`'s one definition. Memory in
GiB (2^30 bytes); energy from the GPU energy counter (or, without it, from power × time).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulse.report.diagnose import diagnose, resolve_thresholds
from gpulse.report.host import summarize as summarize_host
from gpulse.report.phases import excess_hint, partition
from gpulse.report.records import (
    REPORT_VERSION,
    GpuEvent,
    GpuSummary,
    GpuTotals,
    NodeReport,
    ProfileRecord,
    RankSummary,
    RunEvent,
    RunInfo,
    RunReport,
    Sources,
    StepTimeStats,
)
from gpulse.schema import CLOCK_EVENT_FLAGS, THROTTLE_MASK

Row = Mapping[str, Any]
GIB = float(2**30)
_THROTTLE_REASONS = tuple(name for bit, name, _ in CLOCK_EVENT_FLAGS if bit & THROTTLE_MASK)


def num(row: Row, key: str) -> float | None:
    """A finite numeric field of ``row``, or ``None`` (absent, null, bool, string or NaN)."""
    v = row.get(key)
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def values(rows: Iterable[Row], key: str) -> list[float]:
    return [v for v in (num(r, key) for r in rows) if v is not None]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _max(xs: Sequence[float]) -> float | None:
    return max(xs) if xs else None


def _round(v: float | None, digits: int = 6) -> float | None:
    return None if v is None else round(v, digits)


def _quantile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def step_end_ns(row: Row) -> int:
    return int(num(row, "end_time_ns") or row.get("time") or 0)


def step_start_ns(row: Row) -> int:
    """When the step began, including the wait for its batch."""
    start = num(row, "start_time_ns")
    if start is None:
        start = step_end_ns(row) - (num(row, "step_time_s") or 0.0) * 1e9
    return int(start - (num(row, "data_wait_s") or 0.0) * 1e9)


def gpu_key(row: Row) -> str:
    """One GPU's identity across rows: its uuid, else host + index."""
    return str(row.get("uuid") or f"{row.get('host', '?')}:{row.get('gpu', '?')}")


def group_by(rows: Iterable[Row], key) -> dict[Any, list[Row]]:
    out: dict[Any, list[Row]] = defaultdict(list)
    for r in rows:
        out[key(r)].append(r)
    return dict(out)


def rank_key(row: Row) -> int:
    try:
        return int(row.get("rank") or 0)
    except (TypeError, ValueError):
        return 0


# -- pieces -----------------------------------------------------------------------------------------
def _first(runs: Sequence[Row], key: str) -> Any:
    """The first ``train_run`` point's value of ``key`` (in time order), or ``None``."""
    return next((r[key] for r in sorted(runs, key=lambda r: r.get("time") or 0) if r.get(key)), None)


@dataclass
class _Window:
    """The run's own start/end points and the duration its end point states (not in the report)."""

    start_ns: int | None
    end_ns: int | None
    duration_s: float | None


def _run_info(steps: Sequence[Row], runs: Sequence[Row]) -> tuple[RunInfo, _Window]:
    all_rows = [*runs, *steps]
    run_ids = sorted({str(r["run"]) for r in all_rows if r.get("run")})
    starts = [r for r in runs if r.get("event") == "start"]
    ends = [r for r in runs if r.get("event") == "end"]
    statuses = [str(r["status"]) for r in sorted(ends, key=lambda r: r.get("time") or 0) if r.get("status")]
    status = "running"
    if statuses:
        status = next((s for s in ("failed", "interrupted") if s in statuses), statuses[-1])
    world = [int(v) for v in (num(r, "world_size") or _int_tag(r, "world_size") for r in all_rows) if v]
    info = RunInfo(
        id=run_ids[0] if len(run_ids) == 1 else run_ids,
        name=_first(runs, "name"),
        status=status,
        world_size=max(world) if world else len({rank_key(r) for r in steps}) or None,
        ranks=sorted({rank_key(r) for r in all_rows if r.get("rank") is not None}),
        hosts=sorted({str(r["host"]) for r in all_rows if r.get("host")}),
        gpus=sorted({u for r in runs for u in str(r.get("gpus") or "").split(",") if u}),
        mfu_formula=_first(runs, "mfu_formula"),
        peak_flops=_first(runs, "peak_flops"),
        flops_per_token=_first(runs, "flops_per_token"),
        config=_first(runs, "config"),
    )
    window = _Window(
        start_ns=min((int(r["time"]) for r in starts if r.get("time") is not None), default=None),
        end_ns=max((int(r["time"]) for r in ends if r.get("time") is not None), default=None),
        duration_s=_max(values(ends, "duration_s")),
    )
    return info, window


def _int_tag(row: Row, key: str) -> int | None:
    try:
        return int(row[key]) if row.get(key) not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _runtime(window: _Window, steps: Sequence[Row]) -> tuple[float | None, int | None, int | None]:
    """(runtime s, window start ns, window end ns): the run's own duration when it ended, else the steps' span."""
    start = window.start_ns
    end = window.end_ns
    if steps:
        s0 = min(step_start_ns(r) for r in steps)
        s1 = max(step_end_ns(r) for r in steps)
        start = s0 if start is None else min(start, s0)
        end = s1 if end is None else max(end, s1)
    runtime = window.duration_s
    if runtime is None and start is not None and end is not None and end > start:
        runtime = (end - start) / 1e9
    return runtime, start, end


@dataclass
class _Comm:
    """Communication across ranks: each rank's steps with a measured wait, and the least mean wait."""

    steps: dict[int, int]
    waited: dict[int, float]
    in_flight: dict[int, float]
    #: mean wait per step of the rank that waits least: the communication itself
    floor: float | None

    @classmethod
    def of(cls, by_rank: Mapping[int, Sequence[Row]]) -> _Comm:
        steps = {rank: len(v) for rank, rows in by_rank.items() if (v := values(rows, "comm_s"))}
        waited = {rank: sum(values(rows, "comm_s")) for rank, rows in by_rank.items() if rank in steps}
        in_flight = {rank: sum(v) for rank, rows in by_rank.items() if (v := values(rows, "comm_in_flight_s"))}
        floor = min((waited[r] / n for r, n in steps.items()), default=None)
        return cls(steps, waited, in_flight, floor)

    def exposed(self, ranks: Iterable[int]) -> float | None:
        """Seconds of communication itself over the steps of ``ranks`` (``None``: not measured)."""
        ranks = [r for r in ranks if r in self.steps]
        return sum(self.floor * self.steps[r] for r in ranks) if ranks and self.floor is not None else None

    def for_slower(self, ranks: Iterable[int]) -> float | None:
        """Seconds ``ranks`` waited for slower ranks."""
        ranks = list(ranks)
        exposed = self.exposed(ranks)
        return None if exposed is None else max(0.0, sum(self.waited[r] for r in ranks if r in self.waited) - exposed)

    def flight(self, ranks: Iterable[int]) -> float | None:
        xs = [self.in_flight[r] for r in ranks if r in self.in_flight]
        return sum(xs) if xs else None


def _rank_amount(rows: Sequence[Row], ends: Sequence[Row], key: str) -> float:
    """A rank's samples or tokens: its end points count every step, its rows may be thinned out."""
    return max(sum(values(rows, key)), sum(values(ends, key)))


def _per_rank(
    by_rank: Mapping[int, Sequence[Row]], runs: Sequence[Row], runtime: float | None, comm: _Comm
) -> list[RankSummary]:
    gpus_by_rank: dict[int, list[str]] = {}
    for r in runs:
        if r.get("gpus"):
            gpus_by_rank[rank_key(r)] = [u for u in str(r["gpus"]).split(",") if u]
    ends = group_by((r for r in runs if r.get("event") == "end"), rank_key)
    out = []
    for rank, rows in sorted(by_rank.items()):
        st = values(rows, "step_time_s")
        timed = [(r, t) for r in rows if (t := num(r, "step_time_s")) is not None]
        compute = [t - (num(r, "comm_s") or 0.0) for r, t in timed]
        busy = [c + (num(r, "data_wait_s") or 0.0) for (r, _), c in zip(timed, compute, strict=True)]
        wait = sum(values(rows, "data_wait_s"))
        samples = _rank_amount(rows, ends.get(rank, []), "samples")
        mem = values(rows, "mem_peak_bytes") or values(rows, "mem_allocated_bytes")
        exposed, in_flight = comm.exposed([rank]), comm.flight([rank])
        out.append(
            RankSummary(
                rank=rank,
                host=rows[0].get("host"),
                gpus=gpus_by_rank.get(rank, []),
                steps=len({num(r, "step") for r in rows}),
                mean_step_time_s=_round(_mean(st)),
                median_step_time_s=_round(statistics.median(st)) if st else None,
                median_compute_time_s=_round(statistics.median(compute)) if compute else None,
                data_loading_time_ratio=_round(_ratio(wait, wait + sum(st))),
                communication_time_ratio=_round(_ratio(exposed, sum(st))) if exposed is not None else None,
                samples_per_second=_round(samples / runtime) if runtime else None,
                peak_memory_allocated_gb=_round(max(mem) / GIB) if mem else None,
                alloc_retries=int(_max(values(rows, "alloc_retries")) or 0),
                communication_in_flight_ratio=_round(_ratio(in_flight, sum(st))) if in_flight is not None else None,
                wait_for_slower_ranks_s=_round(comm.waited[rank] / comm.steps[rank] - comm.floor)
                if rank in comm.steps and comm.floor is not None
                else None,
                median_busy_time_s=_round(statistics.median(busy)) if busy else None,
            )
        )
    medians = [r.median_busy_time_s for r in out if r.median_busy_time_s]
    ref = statistics.median_low(medians) if medians else None
    for r in out:
        r.slowdown_vs_median = _round(r.median_busy_time_s / ref, 3) if ref and r.median_busy_time_s else None
    return out


def _energy_j(rows: Sequence[Row]) -> float | None:
    """Energy used over ``rows`` (one GPU, time-sorted): Σ positive energy-counter deltas, else ∫ power dt."""
    counter = [(r["time"], v) for r in rows if (v := num(r, "energy_mj")) is not None]
    if len(counter) >= 2:
        return sum(max(0.0, b - a) for (_, a), (_, b) in itertools.pairwise(counter)) / 1000.0
    power = [(int(r["time"]), v) for r in rows if (v := num(r, "power_w")) is not None and r.get("time") is not None]
    if len(power) >= 2:
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(power)]
        cap = 3 * statistics.median(gaps)  # a sampling gap (agent down) is not filled in
        return sum(p * min(g, cap) / 1e9 for (_, p), g in zip(power, gaps, strict=False))
    return None


def per_gpu(gpu: Sequence[Row]) -> list[GpuSummary]:
    """One summary per GPU (by uuid, else host + index), in key order."""
    out = []
    for key, rows in sorted(group_by(gpu, gpu_key).items()):
        rows = sorted(rows, key=lambda r: r.get("time") or 0)
        util = values(rows, "util_gpu_pct")
        used = values(rows, "mem_used_bytes")
        total = _max(values(rows, "mem_total_bytes"))
        used_pct = [
            100.0 * u / t
            for r in rows
            if (u := num(r, "mem_used_bytes")) is not None and (t := num(r, "mem_total_bytes"))
        ]
        throttled = values(rows, "throttled")
        times = [int(r["time"]) for r in rows if r.get("time") is not None]
        window = (times[-1] - times[0]) / 1e9 if len(times) >= 2 else None
        reasons = {name: _round(_mean(values(rows, name)), 4) for name in _THROTTLE_REASONS if values(rows, name)}
        out.append(
            GpuSummary(
                key=key,
                host=rows[0].get("host"),
                gpu=rows[0].get("gpu"),
                uuid=rows[0].get("uuid"),
                model=rows[0].get("model"),
                samples=len(rows),
                avg_utilization_percent=_round(_mean(util), 2),
                max_utilization_percent=_round(_max(util), 2),
                avg_sm_active_percent=_round(_mean(values(rows, "sm_active_pct")), 2),
                avg_tensor_active_percent=_round(_mean(values(rows, "tensor_active_pct")), 2),
                peak_memory_used_gb=_round(max(used) / GIB, 4) if used else None,
                memory_total_gb=_round(total / GIB, 4) if total else None,
                avg_memory_used_percent=_round(_mean(used_pct), 2),
                avg_power_w=_round(_mean(values(rows, "power_w")), 2),
                energy_j=_round(_energy_j(rows), 3),
                throttle_time_ratio=_round(_mean(throttled), 4),
                throttle_time_s=_round(_mean(throttled) * window, 3) if throttled and window else None,
                throttle_reasons={k: v for k, v in reasons.items() if v},
                avg_sm_clock_mhz=_round(_mean(values(rows, "clock_sm_mhz")), 1),
            )
        )
    return out


def gpu_totals(gpus: Sequence[GpuSummary], gpu: Sequence[Row]) -> GpuTotals:
    """All GPUs together (``gpu`` rows for the sample means, ``gpus`` for energy and the worst throttling)."""
    energy = [g.energy_j for g in gpus if g.energy_j is not None]
    mem_used_pct = [g.avg_memory_used_percent for g in gpus if g.avg_memory_used_percent is not None]
    throttle = [g for g in gpus if g.throttle_time_ratio is not None]
    util = values(gpu, "util_gpu_pct")
    return GpuTotals(
        gpu_avg_utilization_percent=_round(_mean(util), 2),
        gpu_max_utilization_percent=_round(_max(util), 2),
        gpu_avg_sm_active_percent=_round(_mean(values(gpu, "sm_active_pct")), 2),
        gpu_avg_tensor_active_percent=_round(_mean(values(gpu, "tensor_active_pct")), 2),
        gpu_avg_memory_used_percent=_round(_mean(mem_used_pct), 2),
        gpu_avg_power_w=_round(_mean(values(gpu, "power_w")), 2),
        energy_j=sum(energy) if energy else None,
        throttle_time_ratio=_round(max(g.throttle_time_ratio or 0.0 for g in throttle), 4) if throttle else None,
        throttle_time_s=_round(max((g.throttle_time_s or 0.0) for g in throttle), 3) if throttle else None,
    )


def _kwh(joules: float | None) -> float | None:
    return _round(joules / 3.6e6, 9) if joules is not None else None


# -- the reports ------------------------------------------------------------------------------------
def _coverage(info: RunInfo, reason: str | None) -> str | None:
    """Why the report lacks ranks of the run, or ``None`` when it covers every rank."""
    missing = [r for r in range(info.world_size or 1) if r not in info.ranks]
    if reason:
        return reason
    if missing:
        return f"no points from rank(s) {', '.join(map(str, missing))}"
    return None


def _hints(info: RunInfo, steps: Sequence[Row]) -> list[str]:
    """Phases that do not fit in the step; what a distributed run did not measure, and the call that measures it."""
    hint = excess_hint(partition(steps)) if steps else None
    return _comm_hints(info, steps) + ([hint] if hint else [])


def _comm_hints(info: RunInfo, steps: Sequence[Row]) -> list[str]:
    if (info.world_size or 1) <= 1:
        return []
    if not values(steps, "comm_s"):
        return [
            "Distributed run, but no communication was timed (gpulse takes the parameters from the first "
            "torch.optim optimizer step): call gpulse.training.comm.attach_ddp(run, ddp_model) after wrapping the model."
        ]
    if not values(steps, "comm_in_flight_s"):
        return [
            "Communication in flight was not timed, only the wait for it: with DDP, call "
            "gpulse.training.comm.attach_ddp(run, ddp_model) after wrapping the model."
        ]
    return []


def build_report(
    steps: Sequence[Row],
    gpu: Sequence[Row],
    runs: Sequence[Row],
    events: Sequence[Row],
    thresholds: Mapping[str, float] | None = None,
    partial_reason: str | None = None,
    gpu_events: Sequence[Row] = (),
    *,
    host: Sequence[Row] = (),
    host_process: Sequence[Row] = (),
) -> RunReport:
    """The run report with its diagnosis; ``thresholds`` overrides diagnosis thresholds by name.
    ``partial_reason`` says why the caller could not get every rank's points. ``host`` and
    ``host_process`` are the agent's points of the run's hosts and processes (``report.load``)."""
    limits = resolve_thresholds(thresholds)
    steps = sorted(steps, key=lambda r: (step_end_ns(r), rank_key(r)))
    info, own = _run_info(steps, runs)
    runtime, t0, t1 = _runtime(own, steps)
    by_rank = group_by(steps, rank_key)
    ends = [r for r in runs if r.get("event") == "end"]
    step_count = max((len({num(r, "step") for r in rows}) for rows in by_rank.values()), default=0)
    # a run's end point counts every step it sent, also when the caller kept only every n-th step
    step_count = max(step_count, int(_max(values(ends, "steps")) or 0))
    ends_by_rank = group_by(ends, rank_key)
    samples = sum(
        _rank_amount(by_rank.get(r, []), ends_by_rank.get(r, []), "samples") for r in {*by_rank, *ends_by_rank}
    )
    tokens = sum(_rank_amount(by_rank.get(r, []), ends_by_rank.get(r, []), "tokens") for r in {*by_rank, *ends_by_rank})
    # no step and no end point carries tokens: not counted, unknown (null), not zero
    tokens_counted = bool(values(steps, "tokens") or values(ends, "tokens"))
    step_times = values(steps, "step_time_s")
    wait = sum(values(steps, "data_wait_s"))
    comm = _Comm.of(by_rank)
    exposed, in_flight, for_slower = comm.exposed(by_rank), comm.flight(by_rank), comm.for_slower(by_rank)
    weighted = [(m, t) for r in steps if (m := num(r, "mfu")) is not None and (t := num(r, "step_time_s"))]
    tfl = [(m, t) for r in steps if (m := num(r, "tflops")) is not None and (t := num(r, "step_time_s"))]
    peak_alloc = _max(values(steps, "mem_peak_bytes") or values(steps, "mem_allocated_bytes"))
    peak_reserved = _max(values(steps, "mem_reserved_bytes"))
    gpus = per_gpu(gpu)
    totals = gpu_totals(gpus, gpu)
    capacity = [g.memory_total_gb for g in gpus if g.memory_total_gb]
    ranks = _per_rank(by_rank, runs, runtime, comm)
    partial = _coverage(info, partial_reason)
    report = RunReport(
        gpulse_report_version=REPORT_VERSION,
        run=info,
        partial=partial is not None,
        partial_reason=partial,
        start_time_ns=t0,
        end_time_ns=t1,
        train_runtime=_round(runtime, 3),
        train_steps=step_count,
        train_samples=int(samples),
        train_tokens=int(tokens) if tokens_counted else None,
        train_samples_per_second=_round(samples / runtime, 3) if runtime and samples else None,
        train_steps_per_second=_round(step_count / runtime, 4) if runtime and step_count else None,
        train_tokens_per_second=_round(tokens / runtime, 3) if runtime and tokens else None,
        step_time_s=StepTimeStats(
            mean=_round(_mean(step_times)),
            median=_round(statistics.median(step_times)) if step_times else None,
            p90=_round(_quantile(step_times, 0.9)),
            max=_round(_max(step_times)),
        ),
        phases_s={k: round(v, 6) for k, v in partition(steps).parts.items()} if steps else {},
        data_loading_time_ratio=_round(_ratio(wait, wait + sum(step_times)), 4) if step_times else None,
        communication_time_ratio=_round(_ratio(exposed, sum(step_times)), 4) if exposed is not None else None,
        communication_in_flight_ratio=_round(_ratio(in_flight, sum(step_times)), 4) if in_flight is not None else None,
        wait_for_slower_ranks_ratio=_round(_ratio(for_slower, sum(step_times)), 4) if for_slower is not None else None,
        tflops_per_gpu=_round(sum(m * t for m, t in tfl) / sum(t for _, t in tfl), 3) if tfl else None,
        mfu=_round(sum(m * t for m, t in weighted) / sum(t for _, t in weighted), 4) if weighted else None,
        gpu_peak_memory_allocated_gb=_round(peak_alloc / GIB, 4) if peak_alloc is not None else None,
        gpu_peak_memory_reserved_gb=_round(peak_reserved / GIB, 4) if peak_reserved is not None else None,
        gpu_memory_capacity_gb=_round(min(capacity), 4) if capacity else None,
        alloc_retries=sum(r.alloc_retries for r in ranks) if values(steps, "alloc_retries") else None,
        **totals.report_fields(),
        energy_kwh=_kwh(totals.energy_j),
        energy_j_per_step=_round(totals.energy_j / step_count, 3)
        if totals.energy_j is not None and step_count
        else None,
        per_gpu=gpus,
        per_rank=ranks,
        events=[
            RunEvent(
                time_ns=r.get("time"), kind=r.get("kind"), text=r.get("text"), step=r.get("step"), rank=r.get("rank")
            )
            for r in sorted(events, key=lambda r: r.get("time") or 0)
        ],
        gpu_events=_gpu_events(gpu_events),
        sources=Sources(
            train_step=len(steps),
            gpu=len(gpu),
            train_run=len(runs),
            train_event=len(events),
            gpu_event=len(gpu_events),
        ),
        thresholds=limits.as_dict(),
        hints=_hints(info, steps),
        host=summarize_host(host, host_process),
        profiles=_profiles(events),
    )
    report.diagnosis, report.not_evaluated = diagnose(report, limits)
    return report


def _profiles(events: Sequence[Row]) -> list[ProfileRecord]:
    """The profiler windows, from the ``train_event`` points of kind ``profile`` that carry one."""
    out = []
    for r in sorted(events, key=lambda r: r.get("time") or 0):
        if r.get("kind") != "profile" or not isinstance(r.get("profile"), str):
            continue
        try:
            record = ProfileRecord.from_json(json.loads(r["profile"]))
        except ValueError:
            record = None
        if record is not None:
            out.append(record)
    return out


def _gpu_events(rows: Sequence[Row]) -> list[GpuEvent]:
    return [
        GpuEvent(
            time_ns=r.get("time"),
            host=r.get("host"),
            gpu=r.get("gpu"),
            kind=r.get("kind"),
            xid=int(x) if (x := num(r, "xid")) is not None else None,
            text=r.get("text"),
            uuid=r.get("uuid"),
        )
        for r in sorted(rows, key=lambda r: r.get("time") or 0)
    ]


def build_node_report(
    gpu: Sequence[Row], gpu_events: Sequence[Row], thresholds: Mapping[str, float] | None = None
) -> NodeReport:
    """What the GPUs of a recording did when it holds no training run, with the GPU-only rules."""
    limits = resolve_thresholds(thresholds)
    gpus = per_gpu(gpu)
    totals = gpu_totals(gpus, gpu)
    times = [int(r["time"]) for r in [*gpu, *gpu_events] if r.get("time") is not None]
    start, end = (min(times), max(times)) if times else (None, None)
    report = NodeReport(
        gpulse_report_version=REPORT_VERSION,
        hosts=sorted({str(r["host"]) for r in gpu if r.get("host")}),
        start_time_ns=start,
        end_time_ns=end,
        duration_s=_round((end - start) / 1e9, 3) if start is not None and end is not None else None,
        gpus=len(gpus),
        **totals.report_fields(),
        energy_kwh=_kwh(totals.energy_j),
        per_gpu=gpus,
        events=_gpu_events(gpu_events),
        sources={"gpu": len(gpu), "gpu_event": len(gpu_events)},
        thresholds=limits.as_dict(),
    )
    report.diagnosis, report.not_evaluated = diagnose(report, limits)
    return report
