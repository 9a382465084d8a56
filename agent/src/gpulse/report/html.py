"""The report as one self-contained HTML file: inline CSS and SVG plots, no scripts, no CDN.

It opens from disk in any browser (or a mail attachment) with no server. The diagnosis comes
first, then the plots: GPU utilisation and SM activity over time with the run's events, step time
stacked by phase, throughput over wall time, CUDA memory per rank, GPU memory, the per-rank spread.
The plots are drawn by :mod:`gpulse.report.svg`; this module chooses what each one shows.

Every plot shows everything it names. Up to :data:`~gpulse.report.svg.MAX_LINES` GPUs or ranks are
drawn one line each, with a legend under the plot (GPU utilisation, from :data:`MULTIPLES_FROM` GPUs
on, as small multiples: one small plot per GPU, since lines near 100 % hide each other); more (a 64-GPU node) become a percentile band
(median, 10th-90th, min-max) plus a heat strip with one row per GPU or rank, so an outlier is still
found by name.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from gpulse.report import units
from gpulse.report.model import GIB, gpu_key, group_by, num, rank_key, step_end_ns, step_start_ns
from gpulse.report.phases import PARTS, custom_phases, partition, step_share
from gpulse.report.records import GpuEvent, GpuSummary, NodeReport, RunReport, gpu_order
from gpulse.report.svg import (
    MAX_LINES,
    MAX_POINTS,
    PALETTE,
    ChartSeries,
    LegendItem,
    TimeAxis,
    W,
    bar_chart,
    bin_edges,
    line_chart,
    many,
    stacked_bars,
    thin,
)

Row = Mapping[str, Any]
#: Bars (steps, or bins of steps) at most in the step-time chart; step markers at most on a time axis.
MAX_BARS = 200
MAX_MARKERS = 200
#: From this many GPUs on (up to MAX_LINES), utilisation is drawn as small multiples, one plot per GPU.
MULTIPLES_FROM = 3
MULTIPLE_PLOT_H = 120
PHASE_COLORS = {
    "data_wait": "#d62728",
    "forward": "#1f77b4",
    "backward": "#2ca02c",
    "optimizer": "#ff7f0e",
    "comm": "#9467bd",
    "other": "#bbbbbb",
}


def gpus_in_order(gpu: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    """The GPUs' rows grouped by GPU, in the order people count them: by host, then by index."""
    groups = group_by(gpu, gpu_key)
    return sorted(groups.items(), key=lambda kv: gpu_order(kv[1][0].get("host"), kv[1][0].get("gpu"), kv[0]))


def gpu_labels(gpu: Sequence[Row]) -> dict[str, str]:
    """``GPU 3`` per GPU key on one host, ``node2 GPU 3`` across hosts (the uuid stays in the tables)."""
    hosts = {r.get("host") for r in gpu}
    out: dict[str, str] = {}
    for r in gpu:
        key = gpu_key(r)
        if key not in out:
            index = r.get("gpu")
            label = f"GPU {index}" if index is not None else key[-12:]
            out[key] = label if len(hosts) <= 1 else f"{r.get('host')} {label}"
    return out


def _by_step(steps: Sequence[Row]) -> dict[int, list[Row]]:
    out: dict[int, list[Row]] = {}
    for r in steps:
        s = num(r, "step")
        if s is not None:
            out.setdefault(int(s), []).append(r)
    return dict(sorted(out.items()))


def _bins(keys: Sequence[int], limit: int) -> list[list[int]]:
    size = max(1, math.ceil(len(keys) / limit))
    return [list(keys[i : i + size]) for i in range(0, len(keys), size)]


@dataclass(frozen=True)
class _Clock:
    """Row times as x values on the report's time axis."""

    t0: int
    axis: TimeAxis

    def x(self, t_ns: float) -> float:
        return (t_ns - self.t0) / 1e9 / self.axis.divisor


def _gpu_series(
    gpu: Sequence[Row], clock: _Clock, field: str, scale: float = 1.0, dashed: bool = False
) -> list[ChartSeries]:
    labels = gpu_labels(gpu)
    out = []
    for i, (key, rows) in enumerate(gpus_in_order(gpu)):
        pts = sorted(
            (clock.x(int(r["time"])), v * scale)
            for r in rows
            if (v := num(r, field)) is not None and r.get("time") is not None
        )
        if pts:
            out.append(ChartSeries(labels[key], thin(pts), PALETTE[i % len(PALETTE)], dashed))
    return out


def _gpu_charts(
    gpu: Sequence[Row], clock: _Clock, events: Sequence[tuple[float, str]], markers: Sequence[float]
) -> list[str]:
    util = _gpu_series(gpu, clock, "util_gpu_pct")
    sm = _gpu_series(gpu, clock, "sm_active_pct", dashed=True)
    if not util and not sm:
        return []
    x_label = clock.axis.label
    if len(util) > MAX_LINES:  # summaries: one metric per picture
        out = many("GPU utilisation (%)", util, x_label, "%", "%", events=events, y_max=100.0)
        if sm:
            out += many("SM activity (%, GPM)", sm, x_label, "%", "%", events=events, y_max=100.0)
        return out
    if max(len(util), len(sm)) >= MULTIPLES_FROM:
        return [_gpu_multiples(util, sm, x_label, events, markers)]
    legend = [LegendItem(s.label, s.color) for s in util or sm]
    legend += [LegendItem("utilisation", "#555"), LegendItem("SM activity", "#555", dashed=True)] if util and sm else []
    title = "GPU utilisation (solid) and SM activity (dashed), %" if util and sm else "GPU utilisation, %"
    if markers:
        title += "; ticks: step ends"
    return [line_chart(title, [*util, *sm], x_label, "%", legend=legend, markers=markers, events=events, y_max=100.0)]


def _gpu_multiples(
    util: Sequence[ChartSeries],
    sm: Sequence[ChartSeries],
    x_label: str,
    events: Sequence[tuple[float, str]],
    markers: Sequence[float],
) -> str:
    """Small multiples: one small plot per GPU, on the same axes, two to a row; lines of several GPUs
    drawn over each other cannot be told apart (they all sit near 100 % or near each other)."""
    by_gpu: dict[str, list[ChartSeries]] = {}
    for s in [*util, *sm]:
        by_gpu.setdefault(s.label, []).append(s)
    what = "GPU utilisation and SM activity (dashed), %" if util and sm else "GPU utilisation, %"
    plots = [
        line_chart(f"{what}: {label}", series, x_label, "%", legend=[LegendItem(label, series[0].color)],
                   markers=markers, events=events, y_max=100.0, width=W / 2, plot_h=MULTIPLE_PLOT_H)
        for label, series in by_gpu.items()
    ]  # fmt: skip
    note = "one plot per GPU, on the same axes" + ("; ticks on the time axis: step ends" if markers else "")
    return f'<p class="muted">{escape(what)}: {note}</p><div class="multiples">{"".join(plots)}</div>'


def _phase_chart(steps: Sequence[Row]) -> str | None:
    """The parts of each step (:func:`gpulse.report.phases.partition`), mean over ranks, binned."""
    per_step = _by_step(steps)
    if not per_step:
        return None
    custom = custom_phases(steps)
    bins = _bins(list(per_step), MAX_BARS)
    xs = [sum(group) / len(group) for group in bins]
    parts = [partition([r for k in group for r in per_step[k]], custom).parts for group in bins]
    names = [n for n in [*PARTS, *custom, "other"] if any(n in p for p in parts)]
    stacks = {n: [p.get(n, 0.0) for p in parts] for n in names}
    colors = [PHASE_COLORS.get(n, PALETTE[(i + 8) % len(PALETTE)]) for i, n in enumerate(stacks)]
    return stacked_bars(
        "Step time by part, data wait included (mean over ranks; backward is its compute, comm the wait after it)",
        xs,
        [(n, c, v) for (n, v), c in zip(stacks.items(), colors, strict=True) if max(v, default=0.0) > 1e-9],
        "step",
        "seconds",
    )


def _throughput_chart(steps: Sequence[Row], clock: _Clock, events: Sequence[tuple[float, str]]) -> str | None:
    """What the user got: tokens (else samples) per second of wall time, all ranks. Each step's
    amount is spread over its wall time, from the start of its wait for data to its end, so a data
    stall lowers the curve (a per-step rate would leave the wait out and read as normal)."""

    def amount(r: Row, count: str, rate: str) -> float | None:
        v = num(r, count)
        if v is None and (per_s := num(r, rate)) is not None:
            v = per_s * (num(r, "step_time_s") or 0.0)
        return v

    unit, count, rate = ("tokens", "tokens", "tokens_per_s")
    if not any(amount(r, count, rate) for r in steps):
        unit, count, rate = ("samples", "samples", "samples_per_s")
    spans = [(step_start_ns(r), step_end_ns(r), v) for r in steps if (v := amount(r, count, rate))]
    if len(spans) < 2:
        return None
    edges = bin_edges(min(s for s, _, _ in spans), max(e for _, e, _ in spans), MAX_POINTS // 2)
    n, width_ns = len(edges) - 1, edges[1] - edges[0]
    sums = [0.0] * n
    for s, e, v in spans:
        first = min(n - 1, max(0, int((s - edges[0]) / width_ns)))
        last = min(n - 1, max(0, int((e - edges[0]) / width_ns)))
        if e <= s or first == last:
            sums[last] += v
            continue
        for i in range(first, last + 1):
            sums[i] += v * (min(e, edges[i + 1]) - max(s, edges[i])) / (e - s)
    pts = [(clock.x((edges[i] + edges[i + 1]) / 2), total / (width_ns / 1e9)) for i, total in enumerate(sums)]
    return line_chart(
        f"Throughput: {unit} per second of wall time, all ranks (waits for data included)",
        [ChartSeries(f"{unit}/s", pts)],
        clock.axis.label,
        f"{unit}/s",
        events=events,
    )


def _memory_charts(steps: Sequence[Row]) -> list[str]:
    by_rank = sorted(group_by(steps, rank_key).items())

    def series(key: str, dashed: bool) -> list[ChartSeries]:
        out = []
        for i, (rank, rows) in enumerate(by_rank):
            pts = sorted(
                (s, v / GIB) for r in rows if (v := num(r, key)) is not None and (s := num(r, "step")) is not None
            )
            if pts:
                out.append(ChartSeries(f"rank {rank}", thin(pts), PALETTE[i % len(PALETTE)], dashed))
        return out

    peak, reserved = series("mem_peak_bytes", False), series("mem_reserved_bytes", True)
    if not peak and not reserved:
        return []
    if len(peak) + len(reserved) <= MAX_LINES:
        legend = [LegendItem(s.label, s.color) for s in peak or reserved]
        if peak and reserved:
            legend += [LegendItem("peak allocated", "#555"), LegendItem("reserved", "#555", dashed=True)]
        return [
            line_chart(
                "CUDA memory per step: peak allocated (solid), reserved (dashed), GiB",
                [*peak, *reserved],
                "step",
                "GiB",
                legend=legend,
            )
        ]
    out = many("CUDA memory, peak allocated per step (GiB)", peak, "step", "GiB", "GiB") if peak else []
    return out + (many("CUDA memory reserved per step (GiB)", reserved, "step", "GiB", "GiB") if reserved else [])


def _rank_chart(report: RunReport) -> str | None:
    ranks = [x for x in report.per_rank if x.median_step_time_s is not None]
    if not ranks:
        return None
    vals = [x.median_compute_time_s or x.median_step_time_s or 0.0 for x in ranks]
    med = statistics.median_low(vals)
    factor = report.thresholds.get("imbalance_factor", 1.5)
    return bar_chart(
        "Per-rank spread: median compute time per step (s)",
        [str(x.rank) if len(ranks) > 16 else f"rank {x.rank}" for x in ranks],
        vals,
        [(med, "median rank"), (med * factor, f"{factor:g}× median")],
        "seconds",
    )


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;padding:0 24px;color:#222;max-width:1000px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.finding{border-left:4px solid #d62728;background:#fff5f5;padding:8px 12px;margin:10px 0;overflow-wrap:anywhere}
.ok{border-left:4px solid #2ca02c;background:#f4fff4;padding:8px 12px}
.muted{color:#777;font-size:13px} .small{font-size:11px}
table{border-collapse:collapse;font-size:13px;max-width:100%} .wide{width:100%}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap} th{background:#f5f5f5;white-space:normal}
td:first-child,th:first-child{text-align:left} td.wrap{white-space:normal;overflow-wrap:anywhere;text-align:left;min-width:8em}
svg{display:block;margin:14px 0;max-width:100%;height:auto}
.multiples{display:grid;grid-template-columns:1fr 1fr;column-gap:12px} .multiples svg{margin:4px 0} .t{font-size:14px;font-weight:600} .l{font-size:11px;fill:#444}
.k{font-size:11px;fill:#555} .ax{stroke:#333} .g{stroke:#eee} .m{stroke:#999} .e{stroke:#9467bd;stroke-dasharray:2 2}
pre{white-space:pre-wrap;overflow-wrap:anywhere;font-size:11px}
"""


def _table(rows: Sequence[Sequence[str]], head: Sequence[str], cls: str = "", wrap: Sequence[int] = ()) -> str:
    """Cells are HTML already (escaped by the caller); columns in ``wrap`` may break lines (long
    names), the others keep each value on one line."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="wrap">{c}</td>' if i in wrap else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f'<table class="{cls}"><tr>{th}</tr>{body}</table>'


def _e(v: Any, fmt: Callable[[Any], str] = lambda v: units.number(v, 3)) -> str:
    return escape(fmt(v)) if v is not None else "n/a"


def _reasons(reasons: Mapping[str, float]) -> str:
    return ", ".join(f"{k.removeprefix('clk_')} {units.percent(v, 0)}" for k, v in reasons.items()) or "-"


def _gpu_table(gpus: Sequence[GpuSummary]) -> str:
    many_hosts = len({g.host for g in gpus}) > 1
    gpus = sorted(gpus, key=GpuSummary.order)
    rows = [
        [
            f"{escape(g.label(many_hosts))}<br><span class='muted small'>{escape(g.uuid or g.key)}</span>",
            escape((g.model or "?").removeprefix("NVIDIA ")),
            _e(g.samples),
            _e(g.avg_utilization_percent, lambda v: units.number(v, 1)),
            _e(g.avg_sm_active_percent, lambda v: units.number(v, 1)),
            _e(g.avg_memory_used_percent, lambda v: units.number(v, 1)),
            _e(g.peak_memory_used_gb, lambda v: units.number(v, 1)),
            _e(g.avg_power_w, lambda v: units.number(v, 0)),
            _e(g.energy_j, units.energy),
            _e(g.throttle_time_ratio, units.percent),
            escape(_reasons(g.throttle_reasons)),
        ]
        for g in gpus
    ]
    head = [
        "GPU",
        "model",
        "samples",
        "util %",
        "SM %",
        "memory %",
        "peak GiB",
        "power W",
        "energy",
        "throttled",
        "why",
    ]
    return _table(rows, head, "wide", wrap=(0, len(head) - 1))


def _findings(findings: Sequence[Any], not_evaluated: Sequence[str]) -> list[str]:
    parts = ['<h2 id="diagnosis">Diagnosis</h2>']
    if not findings:
        parts.append('<div class="ok">No bottleneck found by the checks below.</div>')
    for f in findings:
        parts.append(
            f'<div class="finding"><b>{escape(f.title)}</b> <span class="muted">[{escape(f.id)}]</span><br>'
            f"<b>Evidence:</b> {escape(f.evidence)}<br><b>Threshold:</b> {escape(f.threshold)}<br>"
            f"<b>Action:</b> {escape(f.action)}</div>"
        )
    parts += [f'<p class="muted">Not evaluated: {escape(note)}</p>' for note in not_evaluated]
    return parts


def _event_marks(events: Sequence[GpuEvent], clock: _Clock) -> list[tuple[float, str]]:
    """GPU events as labels on the time axis: ``XID 31 GPU 6``."""
    return [(clock.x(int(e.time_ns)), f"{e.what()} GPU {e.gpu}") for e in events if e.time_ns is not None]


def _gpu_events(events: Sequence[GpuEvent], t0: int, none: str) -> list[str]:
    """The GPU events section: a table, or ``none`` said when there is no event."""
    out = [f'<h2 id="gpu-events">GPU events ({len(events)})</h2>']
    if not events:
        return [*out, f'<p class="muted">{escape(none)}</p>']
    rows = [
        [
            escape(units.duration((e.time_ns - t0) / 1e9) if e.time_ns is not None else "?"),
            escape(e.host or "?"),
            escape(f"GPU {e.gpu}") + (f"<br><span class='muted small'>{escape(e.uuid)}</span>" if e.uuid else ""),
            escape(e.what()),
            escape(e.text or ""),
        ]
        for e in events
    ]
    return [*out, _table(rows, ["after", "host", "GPU", "event", "text"], "wide", wrap=(4,))]


def _page(title: str, heading: str, subtitle: str, body: list[str], report_json: dict[str, Any], name: str) -> str:
    return (
        "\n".join(
            [
                "<!DOCTYPE html>",
                '<html lang="en"><head><meta charset="utf-8">',
                f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
                f"<h1>{escape(heading)}</h1>",
                f'<p class="muted">{escape(subtitle)}</p>',
                *body,
                "<h2>Full report (JSON)</h2>",
                f"<details><summary>{escape(name)}</summary><pre>{escape(json.dumps(report_json, indent=1, default=str))}</pre></details>",
                "</body></html>",
            ]
        )
        + "\n"
    )


def _clock(t0: int, t1: int | None) -> _Clock:
    return _Clock(t0, TimeAxis.for_span(((t1 or t0) - t0) / 1e9))


def render_html(report: RunReport, steps: Sequence[Row], gpu: Sequence[Row], events: Sequence[Row]) -> str:
    run = report.run
    times = [int(r["time"]) for r in [*steps, *gpu] if r.get("time")]
    t0 = int(report.start_time_ns or min(times, default=0))
    clock = _clock(t0, report.end_time_ns or max(times, default=t0))
    marks = [(clock.x(int(e["time"])), str(e.get("kind") or "event")) for e in events if e.get("time") is not None]
    first_rank = min((rank_key(r) for r in steps), default=0)
    ends = [clock.x(step_end_ns(r)) for r in steps if rank_key(r) == first_rank]
    markers = ends[:: max(1, math.ceil(len(ends) / MAX_MARKERS))]
    energy_j = report.energy_kwh * 3.6e6 if report.energy_kwh is not None else None
    summary = [
        ("runtime", units.duration(report.train_runtime)),
        ("steps", units.number(report.train_steps)),
        ("samples per second", units.number(report.train_samples_per_second)),
        ("steps per second", units.number(report.train_steps_per_second, 3)),
        ("tokens per second", units.number(report.train_tokens_per_second, 1)),
        ("data loading (share of step time)", units.percent(report.data_loading_time_ratio)),
        ("communication waited for (share of step time)", units.percent(step_share(report.phases_s, "comm"))),
        ("of it communication itself", units.percent(report.communication_time_ratio)),
        ("communication in flight (share of step time)", units.percent(report.communication_in_flight_ratio)),
        ("waiting for slower ranks (share of step time)", units.percent(report.wait_for_slower_ranks_ratio)),
        ("MFU", units.percent(report.mfu)),
        ("TFLOP/s per GPU", units.number(report.tflops_per_gpu, 1)),
        ("peak CUDA memory allocated", _e(report.gpu_peak_memory_allocated_gb, lambda v: f"{units.number(v, 2)} GiB")),
        ("GPU utilisation, average / max", f"{_e(report.gpu_avg_utilization_percent)} / {_e(report.gpu_max_utilization_percent)} %"),
        ("SM activity / tensor activity", f"{_e(report.gpu_avg_sm_active_percent)} / {_e(report.gpu_avg_tensor_active_percent)} %"),
        ("energy", units.energy(energy_j)),
        ("energy per step", units.si(report.energy_j_per_step, "J")),
        ("throttled (worst GPU)", units.percent(report.throttle_time_ratio)),
        ("allocator retries", units.number(report.alloc_retries)),
    ]  # fmt: skip
    charts = [
        *_gpu_charts(gpu, clock, [*_event_marks(report.gpu_events, clock), *marks], markers),
        _phase_chart(steps),
        _throughput_chart(steps, clock, marks),
        *_memory_charts(steps),
        *many(
            "GPU memory used (GiB, NVML)",
            _gpu_series(gpu, clock, "mem_used_bytes", 1 / GIB),
            clock.axis.label,
            "GiB",
            "GiB",
        ),
        _rank_chart(report),
    ]
    body = _findings(report.diagnosis, report.not_evaluated)
    body += [f'<p class="muted">Hint: {escape(h)}</p>' for h in report.hints]
    if report.partial:
        ranks = ", ".join(map(str, run.ranks)) or "none"
        body.insert(0, f'<div class="finding"><b>Partial report</b>: it covers rank(s) {escape(ranks)} of world '
                    f"size {escape(str(run.world_size))}: {escape(report.partial_reason or '')}</div>")  # fmt: skip
    body.append("<h2>Summary</h2>" + _table([(escape(k), escape(v)) for k, v in summary], ["metric", "value"]))
    body.append("<h2>Plots</h2>")
    body += [c for c in charts if c]
    if not gpu:
        body.append('<p class="muted">No GPU samples for this run: the GPU plots are left out.</p>')
    if report.per_gpu:
        body += ["<h2>Per GPU</h2>", _gpu_table(report.per_gpu)]
    if report.gpu_events:
        body += _gpu_events(report.gpu_events, t0, "")
    if report.profiles:
        body.append("<h2>Profiler windows</h2>")
        body.append('<p class="muted">Asked for by findings raised while the run was going.</p>')
        for p in report.profiles:
            body.append(f"<h3>{escape(p.rule)}, rank {p.rank}</h3>")
            body.append(
                _table([(escape(k), escape(v)) for k, v in p.parts()], ["", "what the window showed"], wrap=(1,))
            )
    if report.per_rank:
        rows = [
            [
                _e(x.rank),
                escape(x.host or "?"),
                _e(x.steps),
                _e(x.median_step_time_s, lambda v: f"{v:.4f}"),
                _e(x.median_compute_time_s, lambda v: f"{v:.4f}"),
                _e(x.data_loading_time_ratio, units.percent),
                f"{_e(x.communication_time_ratio, units.percent)} / {_e(x.communication_in_flight_ratio, units.percent)}",
                _e(x.wait_for_slower_ranks_s, lambda v: f"{v:.4f}"),
                _e(x.samples_per_second),
                _e(x.peak_memory_allocated_gb, lambda v: units.number(v, 2)),
                _e(x.slowdown_vs_median, lambda v: f"×{v:.2f}"),
            ]
            for x in report.per_rank
        ]
        head = ["rank", "host", "steps", "median step s", "median compute s", "data loading"]
        head += ["comm waited / in flight", "waits for others s", "samples/s"]
        body += ["<h2>Per rank</h2>", _table(rows, [*head, "peak GiB", "vs median"], "wide")]
    subtitle = (
        f"{run.name or ''} — status {run.status}, world size {run.world_size}, hosts {', '.join(run.hosts)}, "
        f"runtime {units.duration(report.train_runtime)}"
    )
    return _page(f"gpulse report: {run.id}", f"Run {run.id}", subtitle, body, report.to_json(), "metrics_report.json")


def render_node_html(report: NodeReport, gpu: Sequence[Row]) -> str:
    """A recording without a training run: the node's GPUs over time, their table and events."""
    t0 = int(report.start_time_ns or 0)
    clock = _clock(t0, report.end_time_ns)
    marks = _event_marks(report.events, clock)
    x_label = clock.axis.label
    charts = [
        *_gpu_charts(gpu, clock, marks, ()),
        *many("GPU memory used (GiB)", _gpu_series(gpu, clock, "mem_used_bytes", 1 / GIB), x_label, "GiB", "GiB"),
        *many("Power (W)", _gpu_series(gpu, clock, "power_w"), x_label, "W", "W"),
        *many("Temperature (°C)", _gpu_series(gpu, clock, "temp_gpu_c"), x_label, "°C", "°C"),
    ]
    energy_j = report.energy_kwh * 3.6e6 if report.energy_kwh is not None else None
    summary = [
        ("recorded", units.duration(report.duration_s)),
        ("GPUs", units.number(report.gpus)),
        ("GPU utilisation, average / max", f"{_e(report.gpu_avg_utilization_percent)} / {_e(report.gpu_max_utilization_percent)} %"),
        ("SM activity", f"{_e(report.gpu_avg_sm_active_percent)} %"),
        ("memory used, average", f"{_e(report.gpu_avg_memory_used_percent)} %"),
        ("power per GPU, average", f"{_e(report.gpu_avg_power_w, lambda v: units.number(v, 0))} W"),
        ("energy", units.energy(energy_j)),
        ("throttled (worst GPU)", units.percent(report.throttle_time_ratio)),
        ("events (XID, ECC, lost)", units.number(len(report.events))),
    ]  # fmt: skip
    body = _findings(report.diagnosis, report.not_evaluated)
    body.append("<h2>Summary</h2>" + _table([(escape(k), escape(v)) for k, v in summary], ["metric", "value"]))
    body += ["<h2>Plots</h2>", *charts]
    if report.per_gpu:
        body += ["<h2>Per GPU</h2>", _gpu_table(report.per_gpu)]
    body += _gpu_events(report.events, t0, "No XID, ECC or GPU-lost event in the recording.")
    hosts = ", ".join(report.hosts) or "?"
    subtitle = f"{report.gpus} GPU(s) over {units.duration(report.duration_s)}; no training run in the recording"
    return _page(f"gpulse node report: {hosts}", f"Node {hosts}", subtitle, body, report.to_json(), "node_report.json")
