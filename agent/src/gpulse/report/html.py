"""The report as one self-contained HTML file: inline CSS and SVG plots, no scripts, no CDN.

It opens from disk in any browser (or a mail attachment) with no server. The diagnosis comes
first, then the plots: GPU utilisation and SM activity over time with the run's events, step time
stacked by phase, throughput over wall time, CUDA memory per rank, GPU memory, the per-rank spread.

Every plot shows everything it names. Up to :data:`MAX_LINES` GPUs or ranks are drawn one line
each, with a legend under the plot that wraps instead of being cut; more (a 64-GPU node) become a
percentile band (median, 10th-90th, min-max) plus a heat strip with one row per GPU or rank, so an
outlier is still found by name. Every drawn series carries ``class="series"`` and a
``data-series`` label, which the browser test (``agent/tests/report/test_html_browser.py``) uses
to check that each one is drawn inside its plot.
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
from gpulse.report.model import GIB, PHASES, gpu_key, group_by, num, rank_key, step_end_ns, step_start_ns
from gpulse.report.records import GpuSummary, NodeReport, RunReport, gpu_order

Row = Mapping[str, Any]
#: SVG user units; the page scales plots to its width (max 1000 px).
W = 1000
PLOT_H = 220
ML, MR = 64, 24  # left margin (y ticks and label), right margin
TITLE_H = 24  # the title's band
EVENT_H = 16  # the band above the plot where event labels go (never over the title)
AXIS_H = 40  # x ticks and the x label
LEGEND_ROW = 16
#: More series than this are summarised (percentile band + heat strip) instead of drawn as lines.
MAX_LINES = 16
#: Points per line at most (means over time bins); cells per heat-strip row.
MAX_POINTS = 600
STRIP_CELLS = 240
MAX_BARS = 200
MAX_MARKERS = 200
#: 20 distinguishable colours (Tableau 20, dark shades first): up to MAX_LINES series, one colour each.
PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#9edae5", "#c7c7c7", "#dbdb8d",
)  # fmt: skip
PHASE_COLORS = {
    "data_wait": "#d62728",
    "forward": "#1f77b4",
    "backward": "#2ca02c",
    "optimizer": "#ff7f0e",
    "comm": "#9467bd",
    "other": "#bbbbbb",
}
#: Heat-strip colour scale (viridis stops, low -> high).
VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    color: str = PALETTE[0]
    dashed: bool = False


@dataclass(frozen=True)
class LegendItem:
    label: str
    color: str
    dashed: bool = False
    swatch: str = "line"  # or "box"


# -- axes -------------------------------------------------------------------------------------------
def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round ticks from at most ``lo`` up to at least ``hi`` (so data never leaves the plot)."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    v = math.floor(lo / step) * step
    ticks = [round(v, 10)]
    while ticks[-1] < hi - step * 1e-9:
        v += step
        ticks.append(round(v, 10))
    return ticks


def _fmt_tick(v: float) -> str:
    return units.number(v, 3)


@dataclass(frozen=True)
class TimeAxis:
    """Seconds since the report's start, shown in s, min or h as the span asks."""

    divisor: float
    label: str

    @classmethod
    def for_span(cls, span_s: float) -> TimeAxis:
        if span_s >= 3 * 3600:
            return cls(3600.0, "hours since start")
        if span_s >= 180:
            return cls(60.0, "minutes since start")
        return cls(1.0, "seconds since start")


class _Frame:
    """Axes for one plot: maps data coordinates to SVG pixels in the plot area."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], *, top: float, y0: bool = True) -> None:
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1.0
        lo = min(ys) if ys else 0.0
        hi = max(ys) if ys else 1.0
        self.yt = _nice_ticks(min(0.0, lo) if y0 else lo, hi)
        self.y0, self.y1 = self.yt[0], self.yt[-1]
        self.xt = [t for t in _nice_ticks(self.x0, self.x1, 6) if self.x0 <= t <= self.x1]
        self.top = top
        self.bottom = top + PLOT_H

    def px(self, x: float) -> float:
        return ML + (x - self.x0) / (self.x1 - self.x0) * (W - ML - MR)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * PLOT_H

    def axes(self, x_label: str, y_label: str, x_ticks: bool = True) -> list[str]:
        mid = (self.top + self.bottom) / 2
        out = [
            f'<rect class="plotarea" x="{ML}" y="{self.top}" width="{W - ML - MR}" height="{PLOT_H}" fill="none"/>',
            f'<line x1="{ML}" y1="{self.bottom}" x2="{W - MR}" y2="{self.bottom}" class="ax"/>',
            f'<line x1="{ML}" y1="{self.top}" x2="{ML}" y2="{self.bottom}" class="ax"/>',
            f'<text x="{(ML + W - MR) / 2}" y="{self.bottom + 32}" class="l" text-anchor="middle">{escape(x_label)}</text>',
            f'<text x="14" y="{mid}" class="l" text-anchor="middle" transform="rotate(-90 14 {mid})">{escape(y_label)}</text>',
        ]
        for t in self.yt:
            y = self.py(t)
            out.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{W - MR}" y2="{y:.1f}" class="g"/>')
            out.append(f'<text x="{ML - 4}" y="{y + 3:.1f}" class="k" text-anchor="end">{_fmt_tick(t)}</text>')
        if x_ticks:
            for t in self.xt:
                out.append(
                    f'<text x="{self.px(t):.1f}" y="{self.bottom + 14}" class="k" text-anchor="middle">{_fmt_tick(t)}</text>'
                )
        return out


def _title(title: str) -> str:
    return f'<text x="{ML}" y="16" class="t">{escape(title)}</text>'


def _legend(items: Sequence[LegendItem], y: float) -> tuple[list[str], float]:
    """Every item, in columns that wrap onto as many rows as needed; returns (svg, height used)."""
    if not items:
        return [], 0.0
    col_w = max(7 * max(len(i.label) for i in items) + 34, 90)
    cols = max(1, int((W - ML - MR) // col_w))
    out = ['<g class="legend">']
    for n, item in enumerate(items):
        row, col = divmod(n, cols)
        x, yy = ML + col * col_w, y + row * LEGEND_ROW + 8
        if item.swatch == "box":
            out.append(f'<rect x="{x}" y="{yy - 5}" width="18" height="10" fill="{item.color}"/>')
        else:
            dash = ' stroke-dasharray="4 3"' if item.dashed else ""
            out.append(
                f'<line x1="{x}" y1="{yy}" x2="{x + 18}" y2="{yy}" stroke="{item.color}" stroke-width="2"{dash}/>'
            )
        out.append(f'<text x="{x + 22}" y="{yy + 4}" class="k">{escape(item.label)}</text>')
    out.append("</g>")
    rows = math.ceil(len(items) / cols)
    return out, rows * LEGEND_ROW + 6


def _svg(body: list[str], label: str, height: float, kind: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height:.0f}" width="{W}" height="{height:.0f}" '
        f'role="img" aria-label="{escape(label)}" data-chart="{kind}">' + "".join(body) + "</svg>"
    )


def _event_marks(f: _Frame, events: Sequence[tuple[float, str]]) -> list[str]:
    """A dotted line per event; its label in the band above the plot, left out where it would
    overlap the previous label (the line keeps the text as a tooltip)."""
    out = []
    free_from = -1e9
    for x, text in sorted(events):
        px = f.px(x)
        label = text[:24]
        out.append(
            f'<line x1="{px:.1f}" y1="{f.top}" x2="{px:.1f}" y2="{f.bottom}" class="e"><title>{escape(text)}</title></line>'
        )
        width = 6 * len(label) + 4
        if px >= free_from and px + width <= W:
            out.append(f'<text x="{px + 2:.1f}" y="{f.top - 4}" class="k ev">{escape(label)}</text>')
            free_from = px + width
    return out


def line_chart(
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    *,
    legend: Sequence[LegendItem] | None = None,
    markers: Sequence[float] = (),
    events: Sequence[tuple[float, str]] = (),
    y_max: float | None = None,
) -> str:
    """Lines, optional step markers (ticks on the x axis) and events; the legend lists every series."""
    xs = [x for s in series for x, _ in s.points] + list(markers) + [x for x, _ in events]
    ys = [y for s in series for _, y in s.points] + ([y_max] if y_max is not None else [])
    f = _Frame(xs, ys, top=TITLE_H + EVENT_H)
    body = [_title(title), *f.axes(x_label, y_label)]
    for x in markers:
        body.append(f'<line x1="{f.px(x):.1f}" y1="{f.bottom}" x2="{f.px(x):.1f}" y2="{f.bottom - 6}" class="m"/>')
    body += _event_marks(f, events)
    for s in series:
        if not s.points:
            continue
        d = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="4 3"' if s.dashed else ""
        body.append(
            f'<polyline class="series" data-series="{escape(s.label)}" points="{d}" fill="none" stroke="{s.color}" '
            f'stroke-width="1.5"{dash}><title>{escape(s.label)}</title></polyline>'
        )
    items = legend if legend is not None else [LegendItem(s.label, s.color, s.dashed) for s in series]
    leg, leg_h = _legend(items, f.bottom + AXIS_H)
    return _svg(body + leg, title, f.bottom + AXIS_H + leg_h, "lines")


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    i = q * (len(sorted_xs) - 1)
    lo, hi = math.floor(i), math.ceil(i)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (i - lo)


def band_chart(
    title: str, series: Sequence[Series], x_label: str, y_label: str, *, events: Sequence[tuple[float, str]] = ()
) -> str:
    """Many series as one picture: the median line, the 10th-90th percentile band and the min-max band."""
    xs = sorted({x for s in series for x, _ in s.points})
    bins = _bin_edges(xs[0], xs[-1], MAX_POINTS) if xs else []
    per_bin = [_bin_means(s.points, bins) for s in series]
    stats = []
    for i in range(len(bins) - 1):
        col = sorted(v for b in per_bin if (v := b[i]) is not None)
        if col:
            mid = (bins[i] + bins[i + 1]) / 2
            stats.append((mid, col[0], _percentile(col, 0.1), _percentile(col, 0.5), _percentile(col, 0.9), col[-1]))
    f = _Frame(xs, [v for s in stats for v in s[1:]], top=TITLE_H + EVENT_H)
    body = [_title(title), *f.axes(x_label, y_label), *_event_marks(f, events)]

    def band(lo: int, hi: int, cls: str, color: str) -> str:
        upper = " ".join(f"{f.px(s[0]):.1f},{f.py(s[hi]):.1f}" for s in stats)
        lower = " ".join(f"{f.px(s[0]):.1f},{f.py(s[lo]):.1f}" for s in reversed(stats))
        return f'<polygon class="{cls}" points="{upper} {lower}" fill="{color}" stroke="none"/>'

    if stats:
        body.append(band(1, 5, "band", "#c6dbef"))
        body.append(band(2, 4, "band", "#6baed6"))
        med = " ".join(f"{f.px(s[0]):.1f},{f.py(s[3]):.1f}" for s in stats)
        body.append(f'<polyline class="median" points="{med}" fill="none" stroke="#08306b" stroke-width="1.5"/>')
    leg, leg_h = _legend(
        [
            LegendItem(f"median of {len(series)}", "#08306b"),
            LegendItem("10th-90th percentile", "#6baed6", swatch="box"),
            LegendItem("min-max", "#c6dbef", swatch="box"),
        ],
        f.bottom + AXIS_H,
    )
    return _svg(body + leg, title, f.bottom + AXIS_H + leg_h, "band")


def _viridis(v: float) -> str:
    v = min(1.0, max(0.0, v)) * (len(VIRIDIS) - 1)
    i = min(int(v), len(VIRIDIS) - 2)
    a, b = VIRIDIS[i], VIRIDIS[i + 1]
    t = v - i
    return "#" + "".join(f"{round(a[k] + (b[k] - a[k]) * t):02x}" for k in range(3))


def heat_strip(
    title: str, series: Sequence[Series], x_label: str, unit: str, *, v_max: float | None = None, levels: int = 24
) -> str:
    """One row per series, colour = value over x (viridis, low dark -> high yellow), labelled by name."""
    xs = sorted({x for s in series for x, _ in s.points})
    bins = _bin_edges(xs[0], xs[-1], STRIP_CELLS) if xs else []
    rows = [_bin_means(s.points, bins) for s in series]
    vals = [v for r in rows for v in r if v is not None]
    hi = v_max if v_max is not None else (max(vals) if vals else 1.0)
    lo = 0.0
    row_h = max(6.0, min(14.0, 640 / max(len(series), 1)))
    label_w = max(7 * max((len(s.label) for s in series), default=4), 40)
    x_left = label_w + 8
    top = TITLE_H + 4
    plot_w = W - x_left - MR
    body = [_title(title)]
    for n, (s, cells) in enumerate(zip(series, rows, strict=True)):
        y = top + n * row_h
        body.append(f'<g class="series" data-series="{escape(s.label)}">')
        if row_h >= 8 or n % max(1, round(10 / row_h)) == 0:
            body.append(
                f'<text x="{x_left - 4}" y="{y + row_h / 2 + 3:.1f}" class="k" text-anchor="end">{escape(s.label)}</text>'
            )
        start = 0
        while start < len(cells):  # runs of equal colour become one rect
            v = cells[start]
            level = None if v is None else round((v - lo) / ((hi - lo) or 1) * levels)
            end = start + 1
            while end < len(cells) and (
                (None if cells[end] is None else round((cells[end] - lo) / ((hi - lo) or 1) * levels)) == level
            ):
                end += 1
            if level is not None:
                x = x_left + start / len(cells) * plot_w
                w = (end - start) / len(cells) * plot_w
                body.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{w + 0.4:.1f}" height="{row_h - 1:.1f}" '
                    f'fill="{_viridis(level / levels)}"><title>{escape(s.label)}: {units.number(v, 1)} {escape(unit)}</title></rect>'
                )
            start = end
        body.append("</g>")
    bottom = top + len(series) * row_h
    axis = _Frame(xs, [0.0], top=0)
    for t in axis.xt:
        x = x_left + (t - axis.x0) / (axis.x1 - axis.x0) * plot_w
        body.append(f'<text x="{x:.1f}" y="{bottom + 14:.1f}" class="k" text-anchor="middle">{_fmt_tick(t)}</text>')
    body.append(
        f'<text x="{x_left + plot_w / 2:.1f}" y="{bottom + 30:.1f}" class="l" text-anchor="middle">{escape(x_label)}</text>'
    )
    scale_y = bottom + 44
    for i in range(11):  # the colour scale
        body.append(f'<rect x="{x_left + i * 30}" y="{scale_y:.1f}" width="30" height="10" fill="{_viridis(i / 10)}"/>')
    body.append(f'<text x="{x_left - 4}" y="{scale_y + 9:.1f}" class="k" text-anchor="end">{_fmt_tick(lo)}</text>')
    body.append(f'<text x="{x_left + 334}" y="{scale_y + 9:.1f}" class="k">{units.number(hi, 1)} {escape(unit)}</text>')
    return _svg(body, title, scale_y + 20, "strip")


def many(
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    unit: str,
    *,
    legend: Sequence[LegendItem] | None = None,
    events: Sequence[tuple[float, str]] = (),
    markers: Sequence[float] = (),
    y_max: float | None = None,
) -> list[str]:
    """Up to :data:`MAX_LINES` series as lines; more as a percentile band and a heat strip."""
    if len(series) <= MAX_LINES:
        return [line_chart(title, series, x_label, y_label, legend=legend, events=events, markers=markers, y_max=y_max)]
    return [
        band_chart(f"{title}: spread over {len(series)}", series, x_label, y_label, events=events),
        heat_strip(f"{title}: each one", series, x_label, unit, v_max=y_max),
    ]


def stacked_bars(
    title: str, xs: Sequence[float], stacks: Sequence[tuple[str, str, Sequence[float]]], x_label: str, y_label: str
) -> str:
    """Stacked bars at positions ``xs``; each stack is (label, color, one value per bar)."""
    totals = [sum(s[2][i] for s in stacks) for i in range(len(xs))]
    f = _Frame(list(xs), totals, top=TITLE_H + 8)
    body = [_title(title), *f.axes(x_label, y_label)]
    width = max(1.0, (W - ML - MR) / max(len(xs), 1) * 0.8)
    base = [0.0] * len(xs)
    for label, color, vals in stacks:
        body.append(f'<g class="series" data-series="{escape(label)}">')
        for i, x in enumerate(xs):
            v = vals[i]
            if v <= 1e-9:  # nothing to stack (float residue of a difference)
                continue
            y_top, y_bot = f.py(base[i] + v), f.py(base[i])
            base[i] += v
            body.append(
                f'<rect x="{f.px(x) - width / 2:.1f}" y="{y_top:.1f}" width="{width:.1f}" height="{max(y_bot - y_top, 0.3):.1f}" '
                f'fill="{color}"><title>{escape(label)}: {units.number(v, 4)} s</title></rect>'
            )
        body.append("</g>")
    leg, leg_h = _legend([LegendItem(label, c, swatch="box") for label, c, _ in stacks], f.bottom + AXIS_H)
    return _svg(body + leg, title, f.bottom + AXIS_H + leg_h, "bars")


def bar_chart(
    title: str, labels: Sequence[str], vals: Sequence[float], refs: Sequence[tuple[float, str]], y_label: str
) -> str:
    """One bar per label, with horizontal reference lines (e.g. the median and the imbalance limit)."""
    f = _Frame([0.0, float(max(len(vals), 1))], [*vals, *(v for v, _ in refs)], top=TITLE_H + 8)
    body = [_title(title), *f.axes("", y_label, x_ticks=False)]
    width = (W - ML - MR) / max(len(vals), 1)
    every = max(1, math.ceil(len(vals) * 48 / (W - ML - MR)))  # labels 48 px apart at least
    for i, (label, v) in enumerate(zip(labels, vals, strict=True)):
        x = f.px(i + 0.5)
        body.append(
            f'<rect class="series" data-series="{escape(label)}" x="{x - width * 0.35:.1f}" y="{f.py(v):.1f}" '
            f'width="{width * 0.7:.1f}" height="{max(f.py(0) - f.py(v), 0.3):.1f}" '
            f'fill="{PALETTE[0]}"><title>{escape(label)}: {units.number(v, 4)}</title></rect>'
        )
        if i % every == 0:
            body.append(f'<text x="{x:.1f}" y="{f.bottom + 14}" class="k" text-anchor="middle">{escape(label)}</text>')
    for i, (v, _text) in enumerate(refs):
        color = PALETTE[1 + i]
        body.append(
            f'<line x1="{ML}" y1="{f.py(v):.1f}" x2="{W - MR}" y2="{f.py(v):.1f}" stroke="{color}" stroke-dasharray="5 3"/>'
        )
    leg, leg_h = _legend([LegendItem(text, PALETTE[1 + i], True) for i, (_, text) in enumerate(refs)], f.bottom + 24)
    return _svg(body + leg, title, f.bottom + 24 + leg_h, "bars")


# -- data preparation -------------------------------------------------------------------------------
def _bin_edges(x0: float, x1: float, n: int) -> list[float]:
    if x1 <= x0:
        x1 = x0 + 1.0
    return [x0 + (x1 - x0) * i / n for i in range(n + 1)]


def _bin_means(points: Sequence[tuple[float, float]], edges: Sequence[float]) -> list[float | None]:
    """The mean of the points in each bin (``None`` where a bin has none)."""
    n = len(edges) - 1
    sums, counts = [0.0] * n, [0] * n
    if n <= 0:
        return []
    x0, span = edges[0], edges[-1] - edges[0]
    for x, y in points:
        i = min(n - 1, max(0, int((x - x0) / span * n)))
        sums[i] += y
        counts[i] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def _thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most :data:`MAX_POINTS` points: means over equal x bins (order kept)."""
    if len(points) <= MAX_POINTS:
        return list(points)
    xs = [x for x, _ in points]
    edges = _bin_edges(min(xs), max(xs), MAX_POINTS)
    return [((edges[i] + edges[i + 1]) / 2, v) for i, v in enumerate(_bin_means(points, edges)) if v is not None]


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


def _mean_field(rows: Sequence[Row], key: str) -> float:
    xs = [v for v in (num(r, key) for r in rows) if v is not None]
    return sum(xs) / len(xs) if xs else 0.0


@dataclass(frozen=True)
class _Clock:
    """Row times as x values on the report's time axis."""

    t0: int
    axis: TimeAxis

    def x(self, t_ns: float) -> float:
        return (t_ns - self.t0) / 1e9 / self.axis.divisor


def _gpu_series(
    gpu: Sequence[Row], clock: _Clock, field: str, scale: float = 1.0, dashed: bool = False
) -> list[Series]:
    labels = gpu_labels(gpu)
    out = []
    for i, (key, rows) in enumerate(gpus_in_order(gpu)):
        pts = sorted(
            (clock.x(int(r["time"])), v * scale)
            for r in rows
            if (v := num(r, field)) is not None and r.get("time") is not None
        )
        if pts:
            out.append(Series(labels[key], _thin(pts), PALETTE[i % len(PALETTE)], dashed))
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
    legend = [LegendItem(s.label, s.color) for s in util or sm]
    legend += [LegendItem("utilisation", "#555"), LegendItem("SM activity", "#555", dashed=True)] if util and sm else []
    title = "GPU utilisation (solid) and SM activity (dashed), %" if util and sm else "GPU utilisation, %"
    if markers:
        title += "; ticks: step ends"
    return [line_chart(title, [*util, *sm], x_label, "%", legend=legend, markers=markers, events=events, y_max=100.0)]


def _phase_chart(steps: Sequence[Row], phases: Mapping[str, float]) -> str | None:
    per_step = _by_step(steps)
    if not per_step:
        return None
    names = [p for p in PHASES if p in phases] + [p for p in phases if p not in PHASES and p != "other"]
    keys = list(per_step)
    xs: list[float] = []
    stacks: dict[str, list[float]] = {n: [] for n in [*names, "other"]}
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
        comm = stacks["comm"][-1] if "comm" in stacks else 0.0
        if "backward" in stacks:  # the wait for communication is part of backward: shown apart
            stacks["backward"][-1] = max(0.0, stacks["backward"][-1] - comm)
            inside -= min(inside, comm)
        stacks["other"].append(max(0.0, _mean_field(rows, "step_time_s") - inside - comm))
    colors = [PHASE_COLORS.get(n, PALETTE[(i + 8) % len(PALETTE)]) for i, n in enumerate(stacks)]
    return stacked_bars(
        "Step time by phase, data wait included (mean over ranks)",
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
    edges = _bin_edges(min(s for s, _, _ in spans), max(e for _, e, _ in spans), MAX_POINTS // 2)
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
        [Series(f"{unit}/s", pts)],
        clock.axis.label,
        f"{unit}/s",
        events=events,
    )


def _memory_charts(steps: Sequence[Row]) -> list[str]:
    by_rank = sorted(group_by(steps, rank_key).items())

    def series(key: str, dashed: bool) -> list[Series]:
        out = []
        for i, (rank, rows) in enumerate(by_rank):
            pts = sorted(
                (s, v / GIB) for r in rows if (v := num(r, key)) is not None and (s := num(r, "step")) is not None
            )
            if pts:
                out.append(Series(f"rank {rank}", _thin(pts), PALETTE[i % len(PALETTE)], dashed))
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
svg{display:block;margin:14px 0;max-width:100%;height:auto} .t{font-size:14px;font-weight:600} .l{font-size:11px;fill:#444}
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
        ("communication waited for (share of step time)", units.percent(report.communication_time_ratio)),
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
        *_gpu_charts(gpu, clock, marks, markers),
        _phase_chart(steps, report.phases_s),
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
    marks = [
        (clock.x(int(e.time_ns)), f"XID {e.xid}" if e.xid else str(e.kind or "event"))
        for e in report.events
        if e.time_ns is not None
    ]
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
    body.append(f"<h2>Events ({len(report.events)})</h2>")
    if report.events:
        rows = [
            [
                escape(units.duration((e.time_ns - t0) / 1e9) if e.time_ns is not None else "?"),
                escape(e.host or "?"),
                escape(str(e.gpu)),
                escape(f"XID {e.xid}" if e.xid else str(e.kind)),
                escape(e.text or ""),
            ]
            for e in report.events
        ]
        body.append(_table(rows, ["after", "host", "GPU", "event", "text"], "wide", wrap=(4,)))
    else:
        body.append('<p class="muted">No XID, ECC or GPU-lost event in the recording.</p>')
    hosts = ", ".join(report.hosts) or "?"
    subtitle = f"{report.gpus} GPU(s) over {units.duration(report.duration_s)}; no training run in the recording"
    return _page(f"gpulse node report: {hosts}", f"Node {hosts}", subtitle, body, report.to_json(), "node_report.json")
