"""The report as one self-contained HTML file: inline CSS and SVG plots, no scripts, no CDN.

It opens from disk in any browser (or a mail attachment) with no server. Plots: GPU util and SM
activity over time with step markers and events, step time stacked by phase, throughput, memory,
and the per-rank spread; the diagnosis comes first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from gpulse.report.model import GIB, PHASES, gpu_key, group_by, num, rank_key, step_end_ns

Row = Mapping[str, Any]
W, H = 860, 260
ML, MR, MT, MB = 64, 150, 28, 40  # margins: the legend lives on the right
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
PHASE_COLORS = {
    "data_wait": "#d62728",
    "forward": "#1f77b4",
    "backward": "#2ca02c",
    "optimizer": "#ff7f0e",
    "comm": "#9467bd",
    "other": "#bbbbbb",
}
MAX_BARS = 200
MAX_MARKERS = 200


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 0.5 and len(ticks) < 20:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.1e}"
    return f"{v:g}"


class _Frame:
    """Axes for one plot: maps data coordinates to SVG pixels."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], y0: bool = True) -> None:
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1.0
        lo = min(ys) if ys else 0.0
        hi = max(ys) if ys else 1.0
        self.yt = _nice_ticks(0.0 if y0 else lo, hi)
        self.y0, self.y1 = self.yt[0], self.yt[-1]
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1.0
        self.xt = _nice_ticks(self.x0, self.x1)
        self.xt = [t for t in self.xt if self.x0 <= t <= self.x1]

    def px(self, x: float) -> float:
        return ML + (x - self.x0) / (self.x1 - self.x0) * (W - ML - MR)

    def py(self, y: float) -> float:
        return H - MB - (y - self.y0) / (self.y1 - self.y0) * (H - MT - MB)

    def axes(self, title: str, x_label: str, y_label: str) -> list[str]:
        out = [
            f'<text x="{ML}" y="18" class="t">{escape(title)}</text>',
            f'<line x1="{ML}" y1="{H - MB}" x2="{W - MR}" y2="{H - MB}" class="ax"/>',
            f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{H - MB}" class="ax"/>',
            f'<text x="{(ML + W - MR) / 2}" y="{H - 6}" class="l" text-anchor="middle">{escape(x_label)}</text>',
            f'<text x="14" y="{(MT + H - MB) / 2}" class="l" text-anchor="middle" '
            f'transform="rotate(-90 14 {(MT + H - MB) / 2})">{escape(y_label)}</text>',
        ]
        for t in self.yt:
            y = self.py(t)
            out.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{W - MR}" y2="{y:.1f}" class="g"/>')
            out.append(f'<text x="{ML - 4}" y="{y + 3:.1f}" class="k" text-anchor="end">{_fmt_tick(t)}</text>')
        for t in self.xt:
            x = self.px(t)
            out.append(f'<text x="{x:.1f}" y="{H - MB + 14}" class="k" text-anchor="middle">{_fmt_tick(t)}</text>')
        return out


def _svg(body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{escape(label)}">' + "".join(body) + "</svg>"
    )


def _legend(items: Sequence[tuple[str, str, bool]]) -> list[str]:
    out = []
    for i, (label, color, dashed) in enumerate(items[:14]):
        y = MT + 6 + i * 16
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        out.append(
            f'<line x1="{W - MR + 10}" y1="{y}" x2="{W - MR + 28}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{W - MR + 32}" y="{y + 4}" class="k">{escape(label[:22])}</text>')
    return out


def line_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]], str, bool]],
    x_label: str,
    y_label: str,
    markers: Sequence[float] = (),
    events: Sequence[tuple[float, str]] = (),
) -> str:
    """Lines (label, points, color, dashed), optional step markers (ticks on the x axis) and events."""
    xs = [x for _, pts, _, _ in series for x, _ in pts] + list(markers) + [x for x, _ in events]
    ys = [y for _, pts, _, _ in series for _, y in pts]
    f = _Frame(xs, ys)
    body = f.axes(title, x_label, y_label)
    for x in markers:
        body.append(f'<line x1="{f.px(x):.1f}" y1="{H - MB}" x2="{f.px(x):.1f}" y2="{H - MB - 6}" class="m"/>')
    for x, text in events:
        body.append(
            f'<line x1="{f.px(x):.1f}" y1="{MT}" x2="{f.px(x):.1f}" y2="{H - MB}" class="e"><title>{escape(text)}</title></line>'
        )
        body.append(f'<text x="{f.px(x) + 2:.1f}" y="{MT + 8}" class="k">{escape(text[:16])}</text>')
    for label, pts, color, dashed in series:
        if not pts:
            continue
        d = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        body.append(
            f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.5"{dash}><title>{escape(label)}</title></polyline>'
        )
    body += _legend([(label, c, dashed) for label, _, c, dashed in series])
    return _svg(body, title)


def stacked_bars(
    title: str, xs: Sequence[float], stacks: Sequence[tuple[str, str, Sequence[float]]], x_label: str, y_label: str
) -> str:
    """Stacked bars at positions ``xs``; each stack is (label, color, one value per bar)."""
    totals = [sum(s[2][i] for s in stacks) for i in range(len(xs))]
    f = _Frame(list(xs), totals)
    body = f.axes(title, x_label, y_label)
    width = max(1.0, (W - ML - MR) / max(len(xs), 1) * 0.8)
    for i, x in enumerate(xs):
        base = 0.0
        for label, color, vals in stacks:
            v = vals[i]
            if v <= 0:
                continue
            y_top, y_bot = f.py(base + v), f.py(base)
            body.append(
                f'<rect x="{f.px(x) - width / 2:.1f}" y="{y_top:.1f}" width="{width:.1f}" height="{max(y_bot - y_top, 0.3):.1f}" '
                f'fill="{color}"><title>{escape(label)}: {v:.4g} s</title></rect>'
            )
            base += v
    body += _legend([(label, c, False) for label, c, _ in stacks])
    return _svg(body, title)


def bar_chart(
    title: str, labels: Sequence[str], vals: Sequence[float], refs: Sequence[tuple[float, str]], y_label: str
) -> str:
    """One bar per label, with horizontal reference lines (e.g. the median and the imbalance limit)."""
    f = _Frame([0.0, float(max(len(vals), 1))], [*vals, *(v for v, _ in refs)])
    f.xt = []
    body = f.axes(title, "", y_label)
    width = (W - ML - MR) / max(len(vals), 1)
    for i, (label, v) in enumerate(zip(labels, vals, strict=True)):
        x = f.px(i + 0.5)
        body.append(
            f'<rect x="{x - width * 0.35:.1f}" y="{f.py(v):.1f}" width="{width * 0.7:.1f}" height="{max(f.py(0) - f.py(v), 0.3):.1f}" '
            f'fill="{PALETTE[0]}"><title>{escape(label)}: {v:.4g}</title></rect>'
        )
        body.append(f'<text x="{x:.1f}" y="{H - MB + 14}" class="k" text-anchor="middle">{escape(label[:12])}</text>')
    for i, (v, _text) in enumerate(refs):
        color = PALETTE[1 + i]
        body.append(
            f'<line x1="{ML}" y1="{f.py(v):.1f}" x2="{W - MR}" y2="{f.py(v):.1f}" stroke="{color}" stroke-dasharray="5 3"/>'
        )
    body += _legend([(text, PALETTE[1 + i], True) for i, (_, text) in enumerate(refs)])
    return _svg(body, title)


# -- data preparation -------------------------------------------------------------------------------
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


def _mean_field(rows: Sequence[Row], key: str) -> float:
    xs = [v for v in (num(r, key) for r in rows) if v is not None]
    return sum(xs) / len(xs) if xs else 0.0


def _phase_chart(steps: Sequence[Row], phases: Mapping[str, float]) -> str | None:
    per_step = _by_step(steps)
    if not per_step:
        return None
    names = [p for p in PHASES if p in phases] + [p for p in phases if p not in PHASES and p != "other"]
    keys = list(per_step)
    xs, stacks = [], {n: [] for n in [*names, "other"]}
    for group in _bins(keys, MAX_BARS):
        rows = [r for k in group for r in per_step[k]]
        xs.append(sum(group) / len(group))
        inside = 0.0
        for n in names:
            key = f"{n}_s" if n in PHASES else f"phase_{n}_s"
            v = _mean_field(rows, key)
            stacks[n].append(v)
            if n not in ("data_wait", "comm"):
                inside += v
        stacks["other"].append(
            max(0.0, _mean_field(rows, "step_time_s") - inside - stacks.get("comm", [0.0] * len(xs))[-1])
        )
    colors = [PHASE_COLORS.get(n, PALETTE[(i + 4) % len(PALETTE)]) for i, n in enumerate(stacks)]
    return stacked_bars(
        "Step time by phase (mean over ranks)",
        xs,
        [(n, c, v) for (n, v), c in zip(stacks.items(), colors, strict=True)],
        "step",
        "seconds",
    )


def _throughput_chart(steps: Sequence[Row]) -> str | None:
    per_step = _by_step(steps)
    key, unit = (
        ("tokens_per_s", "tokens/s") if any(num(r, "tokens_per_s") for r in steps) else ("samples_per_s", "samples/s")
    )
    pts = []
    for group in _bins(list(per_step), MAX_BARS * 2):
        totals = [sum(num(r, key) or 0.0 for r in per_step[k]) for k in group]
        pts.append((sum(group) / len(group), sum(totals) / len(totals)))
    if not any(y for _, y in pts):
        return None
    return line_chart(f"Throughput, all ranks ({unit})", [(unit, pts, PALETTE[0], False)], "step", unit)


def _memory_chart(steps: Sequence[Row]) -> str | None:
    series = []
    for i, (rank, rows) in enumerate(sorted(group_by(steps, rank_key).items())):
        color = PALETTE[i % len(PALETTE)]
        for key, label, dashed in (("mem_peak_bytes", "peak", False), ("mem_reserved_bytes", "reserved", True)):
            pts = [(num(r, "step") or 0.0, (num(r, key) or 0.0) / GIB) for r in rows if num(r, key) is not None]
            if pts:
                series.append((f"rank {rank} {label}", pts[:: max(1, len(pts) // (MAX_BARS * 2))], color, dashed))
    if not series:
        return None
    return line_chart("CUDA memory per step (GiB)", series[:12], "step", "GiB")


def _gpu_memory_chart(gpu: Sequence[Row], t0: int) -> str | None:
    series = []
    for i, (key, rows) in enumerate(sorted(group_by(gpu, gpu_key).items())):
        pts = [
            ((int(r["time"]) - t0) / 1e9, (num(r, "mem_used_bytes") or 0.0) / GIB)
            for r in rows
            if num(r, "mem_used_bytes") is not None
        ]
        if pts:
            series.append((key, sorted(pts), PALETTE[i % len(PALETTE)], False))
    if not series:
        return None
    return line_chart("GPU memory used (GiB, NVML)", series[:12], "seconds since start", "GiB")


def _gpu_chart(gpu: Sequence[Row], steps: Sequence[Row], events: Sequence[Row], t0: int) -> str | None:
    series = []
    for i, (key, rows) in enumerate(sorted(group_by(gpu, gpu_key).items())):
        rows = sorted(rows, key=lambda r: r.get("time") or 0)
        color = PALETTE[i % len(PALETTE)]
        for field, label, dashed in (("util_gpu_pct", "util", False), ("sm_active_pct", "SM active", True)):
            pts = [((int(r["time"]) - t0) / 1e9, v) for r in rows if (v := num(r, field)) is not None]
            if pts:
                series.append((f"{key[-10:]} {label}", pts, color, dashed))
    if not series:
        return None
    first_rank = min((rank_key(r) for r in steps), default=0)
    ends = [(step_end_ns(r) - t0) / 1e9 for r in steps if rank_key(r) == first_rank]
    markers = ends[:: max(1, math.ceil(len(ends) / MAX_MARKERS))]
    marks = [((int(e["time"]) - t0) / 1e9, str(e.get("kind") or "event")) for e in events if e.get("time") is not None]
    return line_chart(
        "GPU utilisation (solid) and SM activity (dashed), % — ticks: step ends",
        series[:14],
        "seconds since start",
        "%",
        markers=markers,
        events=marks[:50],
    )


def _rank_chart(report: Mapping[str, Any]) -> str | None:
    ranks = [x for x in report.get("per_rank") or [] if x.get("median_step_time_s") is not None]
    if not ranks:
        return None
    vals = [x["median_compute_time_s"] or x["median_step_time_s"] for x in ranks]
    import statistics

    med = statistics.median_low(vals)
    factor = (report.get("thresholds") or {}).get("imbalance_factor", 1.5)
    return bar_chart(
        "Per-rank spread: median compute time per step (s)",
        [f"rank {x['rank']}" for x in ranks],
        vals,
        [(med, "median rank"), (med * factor, f"{factor:g}× median")],
        "seconds",
    )


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.finding{border-left:4px solid #d62728;background:#fff5f5;padding:8px 12px;margin:10px 0}
.ok{border-left:4px solid #2ca02c;background:#f4fff4;padding:8px 12px}
.muted{color:#777;font-size:13px} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f5f5f5} td:first-child,th:first-child{text-align:left}
svg{display:block;margin:12px 0} .t{font-size:13px;font-weight:600} .l{font-size:11px;fill:#444}
.k{font-size:10px;fill:#555} .ax{stroke:#333} .g{stroke:#eee} .m{stroke:#999} .e{stroke:#9467bd;stroke-dasharray:2 2}
"""


def _cell(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {x:.0%}" if isinstance(x, float) else f"{k} {x}" for k, x in v.items()) or "-"
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "-"
    return str(v)


def _table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(report: Mapping[str, Any], steps: Sequence[Row], gpu: Sequence[Row], events: Sequence[Row]) -> str:
    run = report.get("run") or {}
    t0 = int(report.get("start_time_ns") or min((int(r["time"]) for r in [*steps, *gpu] if r.get("time")), default=0))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gpulse report: {escape(str(run.get('id')))}</title><style>{CSS}</style></head><body>",
        f"<h1>Run {escape(str(run.get('id')))}</h1>",
        f'<p class="muted">{escape(str(run.get("name") or ""))} — status {escape(str(run.get("status")))}, '
        f"world size {escape(str(run.get('world_size')))}, hosts {escape(', '.join(run.get('hosts') or []))}</p>",
        '<h2 id="diagnosis">Diagnosis</h2>',
    ]
    findings = report.get("diagnosis") or []
    if not findings:
        parts.append('<div class="ok">No bottleneck found by the checks below.</div>')
    for f in findings:
        parts.append(
            f'<div class="finding"><b>{escape(f["title"])}</b> <span class="muted">[{escape(f["id"])}]</span><br>'
            f"<b>Evidence:</b> {escape(f['evidence'])}<br><b>Threshold:</b> {escape(f['threshold'])}<br>"
            f"<b>Action:</b> {escape(f['action'])}</div>"
        )
    for note in report.get("not_evaluated") or []:
        parts.append(f'<p class="muted">Not evaluated: {escape(note)}</p>')
    keys = [
        "train_runtime", "train_steps", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second",
        "data_loading_time_ratio", "communication_time_ratio", "mfu", "tflops_per_gpu", "gpu_peak_memory_allocated_gb",
        "gpu_avg_utilization_percent", "gpu_max_utilization_percent", "gpu_avg_sm_active_percent",
        "gpu_avg_tensor_active_percent", "energy_kwh", "energy_j_per_step", "throttle_time_ratio", "alloc_retries",
    ]  # fmt: skip
    parts.append(
        "<h2>Summary</h2>" + _table([{"metric": k, "value": report.get(k)} for k in keys], ["metric", "value"])
    )
    parts.append("<h2>Plots</h2>")
    charts = [
        _gpu_chart(gpu, steps, events, t0),
        _phase_chart(steps, report.get("phases_s") or {}),
        _throughput_chart(steps),
        _memory_chart(steps),
        _gpu_memory_chart(gpu, t0),
        _rank_chart(report),
    ]
    parts += [c for c in charts if c]
    if not all(charts):
        parts.append('<p class="muted">Plots without data are left out (e.g. no GPU samples for this run).</p>')
    if report.get("per_gpu"):
        parts.append("<h2>Per GPU</h2>")
        cols = [
            "key",
            "host",
            "model",
            "samples",
            "avg_utilization_percent",
            "avg_sm_active_percent",
            "avg_memory_used_percent",
        ]
        cols += ["avg_power_w", "energy_j", "throttle_time_ratio", "throttle_reasons"]
        parts.append(_table(report["per_gpu"], cols))
    if report.get("per_rank"):
        parts.append("<h2>Per rank</h2>")
        cols = ["rank", "host", "steps", "median_step_time_s", "median_compute_time_s", "data_loading_time_ratio"]
        cols += ["communication_time_ratio", "samples_per_second", "peak_memory_allocated_gb", "slowdown_vs_median"]
        parts.append(_table(report["per_rank"], cols))
    parts.append("<h2>Full report (JSON)</h2>")
    parts.append(
        f"<details><summary>metrics_report.json</summary><pre>{escape(json.dumps(report, indent=1, default=str))}</pre></details>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
