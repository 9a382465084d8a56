"""The report as text for a terminal: the diagnosis first, then the numbers behind it."""

from __future__ import annotations

from gpulse.report import units
from gpulse.report.phases import step_share
from gpulse.report.records import Finding, GpuEvent, GpuSummary, NodeReport, ProfileRecord, RunReport


def _fmt(v: float | int | None, unit: str = "", digits: int = 3) -> str:
    return "n/a" if v is None else f"{units.number(v, digits)}{unit}"


_pct = units.percent


def _ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _diagnosis(findings: list[Finding], not_evaluated: list[str]) -> list[str]:
    out = [f"DIAGNOSIS: {len(findings)} finding(s)" if findings else "DIAGNOSIS: no bottleneck found"]
    for i, f in enumerate(findings, 1):
        out += [
            f"  {i}. [{f.id}] {f.title}",
            f"     evidence:  {f.evidence}",
            f"     threshold: {f.threshold}",
            f"     action:    {f.action}",
        ]
    out += [f"  (not evaluated: {note})" for note in not_evaluated]
    return out


def _gpu_activity(r: RunReport | NodeReport) -> str:
    return (
        f"  util avg {_fmt(r.gpu_avg_utilization_percent, '%', 1)} / max {_fmt(r.gpu_max_utilization_percent, '%', 1)}, "
        f"SM active {_fmt(r.gpu_avg_sm_active_percent, '%', 1)}, "
        f"tensor active {_fmt(r.gpu_avg_tensor_active_percent, '%', 1)}"
    )


def _per_gpu(gpus: list[GpuSummary]) -> list[str]:
    many_hosts = len({g.host for g in gpus}) > 1
    return [
        f"  {g.label(many_hosts)} ({g.uuid or g.key}): util {_fmt(g.avg_utilization_percent, '%', 0)}, SM {_fmt(g.avg_sm_active_percent, '%', 0)}, "
        f"mem {_fmt(g.avg_memory_used_percent, '%', 0)}, power {_fmt(g.avg_power_w, ' W', 0)}, "
        f"energy {units.energy(g.energy_j)}, throttled {_pct(g.throttle_time_ratio)}"
        for g in sorted(gpus, key=GpuSummary.order)
    ]


def render_text(r: RunReport) -> str:
    run = r.run
    st = r.step_time_s
    out = [f"gpulse report: run {run.id} ({run.name or 'unnamed'}, {run.status})", ""]
    if r.partial:
        ranks = ", ".join(map(str, run.ranks)) or "none"
        out += [f"PARTIAL: this report covers rank(s) {ranks} of world size {run.world_size}: {r.partial_reason}", ""]
    out += _diagnosis(r.diagnosis, r.not_evaluated)
    out += [f"  hint: {h}" for h in r.hints]
    energy_j = r.energy_kwh * 3.6e6 if r.energy_kwh is not None else None
    out += [
        "",
        "RUN",
        f"  runtime {units.duration(r.train_runtime)}, {units.number(r.train_steps)} steps, "
        f"world size {run.world_size}, hosts {', '.join(run.hosts) or 'n/a'}",
        f"  throughput: {_fmt(r.train_samples_per_second, ' samples/s', 2)}, "
        f"{_fmt(r.train_steps_per_second, ' steps/s', 3)}, {_fmt(r.train_tokens_per_second, ' tokens/s', 1)}",
        f"  step time: mean {_fmt(st.mean, ' s', 4)}, median {_fmt(st.median, ' s', 4)}, "
        f"p90 {_fmt(st.p90, ' s', 4)}, max {_fmt(st.max, ' s', 4)}",
        f"  data loading {_pct(r.data_loading_time_ratio)}, communication waited for "
        f"{_pct(step_share(r.phases_s, 'comm'))} of the step (communication itself "
        f"{_pct(r.communication_time_ratio)}, waiting for slower ranks {_pct(r.wait_for_slower_ranks_ratio)}; "
        f"in flight {_pct(r.communication_in_flight_ratio)}), MFU {_pct(r.mfu)}, "
        f"{_fmt(r.tflops_per_gpu, ' TFLOP/s per GPU', 1)}",
        "  parts of a step (mean s, see docs/report.md): "
        + (", ".join(f"{k} {v:.4f}" for k, v in r.phases_s.items()) or "n/a"),
        f"  memory: peak allocated {_fmt(r.gpu_peak_memory_allocated_gb, ' GiB', 2)}, "
        f"reserved {_fmt(r.gpu_peak_memory_reserved_gb, ' GiB', 2)}, "
        f"allocator retries {_fmt(r.alloc_retries)}",
        "",
        "GPUS",
        _gpu_activity(r),
        f"  energy {units.energy(energy_j)} ({_fmt(r.energy_j_per_step, ' J/step', 1)}), "
        f"throttled {_pct(r.throttle_time_ratio)} of the time (worst GPU)",
        *_per_gpu(r.per_gpu),
    ]
    if r.gpu_events:
        out += ["", *_events(r.gpu_events, "GPU EVENTS (XID, ECC, lost)")]
    if r.profiles:
        out += ["", *_profiles(r.profiles)]
    if r.per_rank:
        out += ["", "RANKS"]
        for x in r.per_rank:
            out.append(
                f"  rank {x.rank} ({x.host or '?'}): {x.steps} steps, median step {_fmt(x.median_step_time_s, ' s', 4)}, "
                f"own work {_fmt(x.median_busy_time_s, ' s', 4)}, data loading {_pct(x.data_loading_time_ratio)}, "
                f"communication {_pct(x.communication_time_ratio)}, waits for slower ranks "
                f"{_fmt(x.wait_for_slower_ranks_s, ' s', 4)}/step, ×{_ratio(x.slowdown_vs_median)} vs median"
            )
    return "\n".join(out) + "\n"


def _profiles(profiles: list[ProfileRecord]) -> list[str]:
    """Each profiler window a rolling finding asked for, with what its trace showed."""
    out = [f"PROFILER WINDOWS: {len(profiles)} (asked for by findings raised while the run was going)"]
    for p in profiles:
        out.append(f"  [{p.rule}] rank {p.rank}")
        out += [f"    {label}: {text}" for label, text in p.parts()]
    return out


def _event(e: GpuEvent) -> str:
    return f"  {e.host or '?'} GPU {e.gpu}: {e.describe()}"


def _events(events: list[GpuEvent], heading: str = "EVENTS") -> list[str]:
    """The GPU events, at most 50 (all in the JSON)."""
    out = [f"{heading}: {len(events)}", *[_event(e) for e in events[:50]]]
    if len(events) > 50:
        out.append(f"  ... and {len(events) - 50} more (all in the JSON)")
    return out


def render_node_text(r: NodeReport) -> str:
    """A recording without a training run: what each GPU did, its events, the GPU-only rules."""
    energy_j = r.energy_kwh * 3.6e6 if r.energy_kwh is not None else None
    out = [
        f"gpulse report: node {', '.join(r.hosts) or '?'}: {r.gpus} GPU(s) over {units.duration(r.duration_s)} "
        "(no training run in the recording: a node report)",
        "",
        *_diagnosis(r.diagnosis, r.not_evaluated),
        "",
        "GPUS",
        _gpu_activity(r),
        f"  memory used {_fmt(r.gpu_avg_memory_used_percent, '%', 1)} on average, power {_fmt(r.gpu_avg_power_w, ' W', 0)} "
        f"per GPU, energy {units.energy(energy_j)}, throttled {_pct(r.throttle_time_ratio)} of the time (worst GPU)",
        *_per_gpu(r.per_gpu),
        "",
        *_events(r.events),
    ]
    return "\n".join(out) + "\n"


#: Findings the end-of-run summary names, at most (all of them are in the report it points to).
SUMMARY_FINDINGS = 4


def render_summary(r: RunReport, paths: list[str]) -> str:
    """What a run prints on stderr as it ends (``Run.finish``): a few lines from the same report as
    ``metrics_report.json``, so the diagnosis is seen without opening a file."""
    rates = [
        _fmt(r.train_steps_per_second, " steps/s", 3),
        _fmt(r.train_samples_per_second, " samples/s", 2),
    ] + ([_fmt(r.train_tokens_per_second, " tokens/s", 1)] if r.train_tokens_per_second is not None else [])
    step_total = sum(r.phases_s.values())
    went = ", ".join(f"{k} {_pct(v / step_total, 0)}" for k, v in r.phases_s.items() if v >= step_total / 200)
    out = [
        f"gpulse: run {r.run.id} {r.run.status}: {units.number(r.train_steps)} steps in "
        f"{units.duration(r.train_runtime)} ({', '.join(rates)})",
        f"  time per step {_fmt(step_total, ' s', 4)} (data wait included): {went or 'n/a'}",
    ]
    if r.partial:
        out.append(f"  partial: {r.partial_reason}")
    if not r.diagnosis:
        out.append("  no bottleneck found")
    for i, f in enumerate(r.diagnosis[:SUMMARY_FINDINGS], 1):
        out += [f"  {i}. {f.title}", f"     action: {f.action}"]
    if len(r.diagnosis) > SUMMARY_FINDINGS:
        out.append(f"  ... and {len(r.diagnosis) - SUMMARY_FINDINGS} more finding(s) in the report")
    out += [f"  report: {p}" for p in paths]
    return "\n".join(out) + "\n"
