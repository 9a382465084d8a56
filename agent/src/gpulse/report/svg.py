"""Charts as inline SVG: lines, percentile bands, heat strips, stacked and plain bars.

A small chart library with no report in it: each function takes labelled series of numbers and
returns one ``<svg>`` element, styled by the classes the page's CSS defines (``t``, ``l``, ``k``,
``ax``, ``g``, ``e``, ``m``, ``band``, ``median``). Every drawn series carries ``class="series"``
and a ``data-series`` label, which the browser test (``agent/tests/report/test_html_browser.py``)
uses to check that each one is drawn inside its plot. Legends list every series and wrap onto as
many rows as they need instead of being cut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from gpulse.report import units

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
#: 20 distinguishable colours (Tableau 20, dark shades first): up to MAX_LINES series, one colour each.
PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#9edae5", "#c7c7c7", "#dbdb8d",
)  # fmt: skip
#: Heat-strip colour scale (viridis stops, low -> high).
VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


@dataclass(frozen=True)
class ChartSeries:
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
@dataclass(frozen=True)
class Ticks:
    """An axis's tick values, a step of 1, 2 or 5 × 10^n apart, and the decimals that step needs:
    every label at the same precision (0.002, 0.004, 0.006, never 0.003, 0.005, 0.008, 0.01)."""

    values: list[float]
    decimals: int

    def label(self, v: float) -> str:
        return f"{0.0 if v == 0 else v:,.{self.decimals}f}"  # never "-0"


def nice_ticks(lo: float, hi: float, n: int = 5) -> Ticks:
    """Round ticks from at most ``lo`` up to at least ``hi`` (so data never leaves the plot), about ``n`` steps."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return Ticks([0.0, 1.0], 0)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    exp = math.floor(math.log10(raw))
    m = next(m for m in (1, 2, 5, 10) if m * 10**exp >= raw * (1 - 1e-9))
    if m == 10:
        m, exp = 1, exp + 1
    step = m * 10.0**exp
    decimals = max(0, -exp)
    first = math.floor(lo / step + 1e-9)
    ticks = [round(first * step, decimals)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round((first + len(ticks)) * step, decimals))
    return Ticks(ticks, decimals)


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

    def __init__(
        self, xs: Sequence[float], ys: Sequence[float], *, top: float, y0: bool = True, width: float = W,
        plot_h: float = PLOT_H,
    ) -> None:  # fmt: skip
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1.0
        lo = min(ys) if ys else 0.0
        hi = max(ys) if ys else 1.0
        self.yt = nice_ticks(min(0.0, lo) if y0 else lo, hi)
        self.y0, self.y1 = self.yt.values[0], self.yt.values[-1]
        xt = nice_ticks(self.x0, self.x1, 6)
        self.xt = Ticks([t for t in xt.values if self.x0 <= t <= self.x1], xt.decimals)
        self.top = top
        self.width, self.plot_h = width, plot_h
        self.bottom = top + plot_h

    def px(self, x: float) -> float:
        return ML + (x - self.x0) / (self.x1 - self.x0) * (self.width - ML - MR)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * self.plot_h

    def axes(self, x_label: str, y_label: str, x_ticks: bool = True) -> list[str]:
        mid = (self.top + self.bottom) / 2
        out = [
            f'<rect class="plotarea" x="{ML}" y="{self.top}" width="{self.width - ML - MR}" height="{self.plot_h}" fill="none"/>',
            f'<line x1="{ML}" y1="{self.bottom}" x2="{self.width - MR}" y2="{self.bottom}" class="ax"/>',
            f'<line x1="{ML}" y1="{self.top}" x2="{ML}" y2="{self.bottom}" class="ax"/>',
            f'<text x="{(ML + self.width - MR) / 2}" y="{self.bottom + 32}" class="l" text-anchor="middle">{escape(x_label)}</text>',
            f'<text x="14" y="{mid}" class="l" text-anchor="middle" transform="rotate(-90 14 {mid})">{escape(y_label)}</text>',
        ]
        for t in self.yt.values:
            y = self.py(t)
            out.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{self.width - MR}" y2="{y:.1f}" class="g"/>')
            out.append(f'<text x="{ML - 4}" y="{y + 3:.1f}" class="k" text-anchor="end">{self.yt.label(t)}</text>')
        if x_ticks:
            for t in self.xt.values:
                out.append(
                    f'<text x="{self.px(t):.1f}" y="{self.bottom + 14}" class="k" text-anchor="middle">{self.xt.label(t)}</text>'
                )
        return out


def _title(title: str) -> str:
    return f'<text x="{ML}" y="16" class="t">{escape(title)}</text>'


def _legend(items: Sequence[LegendItem], y: float, width: float = W) -> tuple[list[str], float]:
    """Every item, in columns that wrap onto as many rows as needed; returns (svg, height used)."""
    if not items:
        return [], 0.0
    col_w = max(7 * max(len(i.label) for i in items) + 34, 90)
    cols = max(1, int((width - ML - MR) // col_w))
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


def _svg(body: list[str], label: str, height: float, kind: str, width: float = W) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
        f'role="img" aria-label="{escape(label)}" data-chart="{kind}">' + "".join(body) + "</svg>"
    )


def _event_marks(f: _Frame, events: Sequence[tuple[float, str]]) -> list[str]:
    """A dotted line per event; its label in the band above the plot, left out where it would
    overlap a label placed before it (the line keeps the text as a tooltip). Labels are placed in the
    order of ``events``: the caller puts first what must not be crowded out (a GPU's XID before a
    checkpoint)."""
    lines, labels = [], []
    taken: list[tuple[float, float]] = []
    for x, text in sorted(events):
        px = f.px(x)
        lines.append(
            f'<line x1="{px:.1f}" y1="{f.top}" x2="{px:.1f}" y2="{f.bottom}" class="e"><title>{escape(text)}</title></line>'
        )
    for x, text in events:
        px, label = f.px(x), text[:24]
        end = px + 6 * len(label) + 4
        if end <= f.width and all(end <= a or px >= b for a, b in taken):
            taken.append((px, end))
            labels.append((px, f'<text x="{px + 2:.1f}" y="{f.top - 4}" class="k ev">{escape(label)}</text>'))
    return lines + [text for _, text in sorted(labels)]


def line_chart(
    title: str,
    series: Sequence[ChartSeries],
    x_label: str,
    y_label: str,
    *,
    legend: Sequence[LegendItem] | None = None,
    markers: Sequence[float] = (),
    events: Sequence[tuple[float, str]] = (),
    y_max: float | None = None,
    width: float = W,
    plot_h: float = PLOT_H,
) -> str:
    """Lines, optional step markers (ticks on the x axis) and events; the legend lists every series.
    ``width`` and ``plot_h`` make it smaller: one of a grid of small multiples."""
    xs = [x for s in series for x, _ in s.points] + list(markers) + [x for x, _ in events]
    ys = [y for s in series for _, y in s.points] + ([y_max] if y_max is not None else [])
    f = _Frame(xs, ys, top=TITLE_H + EVENT_H, width=width, plot_h=plot_h)
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
    leg, leg_h = _legend(items, f.bottom + AXIS_H, width)
    return _svg(body + leg, title, f.bottom + AXIS_H + leg_h, "lines", width)


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    i = q * (len(sorted_xs) - 1)
    lo, hi = math.floor(i), math.ceil(i)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (i - lo)


def band_chart(
    title: str, series: Sequence[ChartSeries], x_label: str, y_label: str, *, events: Sequence[tuple[float, str]] = ()
) -> str:
    """Many series as one picture: the median line, the 10th-90th percentile band and the min-max band."""
    xs = sorted({x for s in series for x, _ in s.points})
    bins = bin_edges(xs[0], xs[-1], MAX_POINTS) if xs else []
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
    title: str, series: Sequence[ChartSeries], x_label: str, unit: str, *, v_max: float | None = None, levels: int = 24
) -> str:
    """One row per series, colour = value over x (viridis, low dark -> high yellow), labelled by name."""
    xs = sorted({x for s in series for x, _ in s.points})
    bins = bin_edges(xs[0], xs[-1], STRIP_CELLS) if xs else []
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
    for t in axis.xt.values:
        x = x_left + (t - axis.x0) / (axis.x1 - axis.x0) * plot_w
        body.append(f'<text x="{x:.1f}" y="{bottom + 14:.1f}" class="k" text-anchor="middle">{axis.xt.label(t)}</text>')
    body.append(
        f'<text x="{x_left + plot_w / 2:.1f}" y="{bottom + 30:.1f}" class="l" text-anchor="middle">{escape(x_label)}</text>'
    )
    scale_y = bottom + 44
    for i in range(11):  # the colour scale
        body.append(f'<rect x="{x_left + i * 30}" y="{scale_y:.1f}" width="30" height="10" fill="{_viridis(i / 10)}"/>')
    body.append(
        f'<text x="{x_left - 4}" y="{scale_y + 9:.1f}" class="k" text-anchor="end">{units.number(lo, 1)}</text>'
    )
    body.append(f'<text x="{x_left + 334}" y="{scale_y + 9:.1f}" class="k">{units.number(hi, 1)} {escape(unit)}</text>')
    return _svg(body, title, scale_y + 20, "strip")


def many(
    title: str,
    series: Sequence[ChartSeries],
    x_label: str,
    y_label: str,
    unit: str,
    *,
    legend: Sequence[LegendItem] | None = None,
    events: Sequence[tuple[float, str]] = (),
    markers: Sequence[float] = (),
    y_max: float | None = None,
) -> list[str]:
    """Up to :data:`MAX_LINES` series as lines; more as a percentile band and a heat strip; none: no chart."""
    if not series:
        return []
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
def bin_edges(x0: float, x1: float, n: int) -> list[float]:
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


def thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most :data:`MAX_POINTS` points: means over equal x bins (order kept)."""
    if len(points) <= MAX_POINTS:
        return list(points)
    xs = [x for x, _ in points]
    edges = bin_edges(min(xs), max(xs), MAX_POINTS)
    return [((edges[i] + edges[i + 1]) / 2, v) for i, v in enumerate(_bin_means(points, edges)) if v is not None]
