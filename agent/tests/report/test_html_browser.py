"""The HTML report in a real browser (headless Chromium): it shows everything it claims.

What a user saw before: the utilisation plot dropped the 8th GPU (legend capped at 14 series), the
CUDA-memory plot showed ranks 0-5 of 8, legends were cut at the right edge, a chart title overlapped
a checkpoint label, the per-GPU table ran off the page, and 64 GPUs were 64 tangled lines. Here the
demo's report for a node of 8 GPUs and one of 64 is laid out, photographed and measured: the page
fits its width, every GPU and rank is a drawn series inside its plot (its colour is in the
screenshot's pixels, unless an identical series is drawn over it), every legend entry and label is
inside the page and clear of the title, and 64 GPUs come as a percentile band plus one heat-strip
row each. ``GPULSE_KEEP_SCREENSHOTS=DIR`` keeps the screenshots for a person to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from support.chromium import SCALE, WIDTH, count_colors, layout, png_size, rgb, screenshot
from support.fixtures import gpulse_cmd
from support.waiting import wait_until

from gpulse.report.svg import MAX_LINES


def _overlaps(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]
    )


def _inside(inner: dict[str, float], outer: dict[str, float], slack: float = 2.0) -> bool:
    return (
        inner["x"] >= outer["x"] - slack
        and inner["y"] >= outer["y"] - slack
        and inner["x"] + inner["w"] <= outer["x"] + outer["w"] + slack
        and inner["y"] + inner["h"] <= outer["y"] + outer["h"] + slack
    )


def _points(series: dict[str, Any]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in series["points"].split())]


def _hidden_under(below: dict[str, Any], later: list[dict[str, Any]], width_px: float = 2.0) -> bool:
    """Lines drawn after ``below`` run through every one of its points within a line width (1.5 px
    plus anti-aliasing): together they paint over it."""
    pts = _points(below)
    others = [p for p in map(_points, later) if len(p) == len(pts)]
    return bool(others) and all(
        any(abs(o[i][0] - x) <= 0.1 and abs(o[i][1] - y) <= width_px for o in others) for i, (x, y) in enumerate(pts)
    )


def _measure(html: Path, work: Path, name: str) -> dict[str, Any]:
    """Lay out ``html``, photograph it whole, count each chart's pixels (see support.chromium)."""
    measured = layout(html, work)
    png = screenshot(html, work / f"{name}.png", height=int(measured["page"]["h"]))
    keep = os.environ.get("GPULSE_KEEP_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)
    jobs = []
    for chart in measured["charts"]:
        area = chart["plot"] or chart["box"]
        colors = [rgb(s["color"]) for s in chart["series"] if s["tag"] == "polyline"]
        # 3 px around the plot area: a line at 0 % or 100 % is drawn half outside it
        grown = {"x": area["x"] - 3, "y": area["y"] - 3, "w": area["w"] + 6, "h": area["h"] + 6}
        jobs.append({**grown, "colors": colors})
        for s in chart["series"]:
            if chart["kind"] == "strip":  # a heat-strip row: its own rectangle
                jobs.append({**s["box"], "colors": []})
    pixels = iter(count_colors(png, jobs, work))
    for chart in measured["charts"]:
        chart["pixels"] = next(pixels)
        for s in chart["series"]:
            if chart["kind"] == "strip":
                s["pixels"] = next(pixels)
    return {"layout": measured, "png": png, "html": html.read_text(encoding="utf-8")}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}


def _run_report(n: int, work: Path) -> dict[str, Any]:
    """The demo run's report for ``n`` GPUs (one rank each)."""
    out = subprocess.run(
        gpulse_cmd("demo", "--record", str(work / "demo.lp"), "--gpus", str(n), "--hours", "1", "--interval", "30",
                   "--out", str(work / "report")),
        env=_env(), cwd=work, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {"n": n, **_measure(work / "report" / "metrics_report.html", work, f"report-{n}-gpus")}


def _node_report(work: Path) -> dict[str, Any]:
    """A node report: 8 simulated GPUs recorded for a few seconds, no training run."""
    env = _env()
    agent = gpulse_cmd("agent", "--simulate", "8", "--record", "node.lp", "--duration", "4", "--no-socket",
                       "--spool-dir", str(work / "spool"))  # fmt: skip
    subprocess.run(agent, env=env, cwd=work, capture_output=True, text=True, timeout=120, check=True)
    return {"n": 8, **_report_of(work, env, "node.lp", "node_report.html", "node-report-8-gpus")}


def _report_of(work: Path, env: dict[str, str], recording: str, page: str, name: str) -> dict[str, Any]:
    """``gpulse report --from-file recording --html``, its page measured."""
    out = subprocess.run(
        gpulse_cmd("report", "--from-file", recording, "--html", "--out", name),
        env=env, cwd=work, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return _measure(work / name / page, work, name)


def _cpu_only_report(work: Path) -> dict[str, Any]:
    """A CPU-only training run beside an agent with 8 simulated GPUs: its report from the agent's recording."""
    from test_diagnose import SlowDataset, train

    env = {**_env(), "XDG_RUNTIME_DIR": str(work)}
    sock = work / "agent.sock"
    agent = gpulse_cmd("agent", "--simulate", "8", "--interval", "0.2", "--record", "cpu.lp", "--socket", str(sock),
                       "--spool-dir", str(work / "spool"), "--self-metrics-interval", "60")  # fmt: skip
    proc = subprocess.Popen(agent, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, 30, "the agent's socket")
        train(work / "run", torch.utils.data.DataLoader(SlowDataset(240, 0.002), batch_size=8), 30, 64, sock)
        os.environ.pop("GPULSE_RUN_ID", None)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    return {"n": 1, **_report_of(work, env, "cpu.lp", "metrics_report.html", "report-cpu-only-run")}


_PAGES: dict[str, dict[str, Any]] = {}


def _page(name: str, factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each page is built and measured once per session, whichever test asks first."""
    if name not in _PAGES:
        work = factory.mktemp(f"html-{name}")
        if name == "node":
            _PAGES[name] = _node_report(work)
        elif name == "cpu-only":
            _PAGES[name] = _cpu_only_report(work)
        else:
            _PAGES[name] = _run_report(int(name.split("-")[0]), work)
    return _PAGES[name]


@pytest.fixture(params=["8-gpus", "64-gpus", "node", "cpu-only"])
def page(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every page: the run reports for 8 and 64 GPUs, a node report, a CPU-only run's report."""
    return _page(request.param, tmp_path_factory)


@pytest.fixture(params=["8-gpus", "64-gpus"])
def run_page(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _page(request.param, tmp_path_factory)


@pytest.fixture
def node_page(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _page("node", tmp_path_factory)


def _chart(page: dict[str, Any], starts: str) -> list[dict[str, Any]]:
    return [c for c in page["layout"]["charts"] if c["label"].startswith(starts)]


def test_the_node_report_draws_each_gpu_in_each_plot(node_page: dict[str, Any]) -> None:
    charts = node_page["layout"]["charts"]
    util = [c for c in charts if c["label"].startswith("GPU utilisation")]
    others = [c for c in charts if c not in util]
    assert [c["label"].split(" (")[0].split(",")[0] for c in others] == ["GPU memory used", "Power", "Temperature"]
    for chart in others:
        assert {s["label"] for s in chart["series"]} == {f"GPU {i}" for i in range(8)}, chart["label"]
    # utilisation: a small plot per GPU (lines near 100 % hide each other)
    assert [{s["label"] for s in c["series"]} for c in util] == [{f"GPU {i}"} for i in range(8)]


def test_no_plot_is_empty_and_a_cpu_only_run_has_no_gpu_plot(page: dict[str, Any], tmp_path_factory) -> None:
    """The user's case: an empty "GPU memory used" chart above "No GPU samples for this run"."""
    for chart in page["layout"]["charts"]:
        if chart["kind"] != "band":  # a band is drawn as areas, not series
            assert chart["series"], f"{chart['label']}: an empty plot"
    if page["n"] == 1:
        cpu = page["layout"]["charts"]
        assert cpu and not [c["label"] for c in cpu if "GPU" in c["label"]]
        assert "No GPU samples for this run" in page["html"] and "<h2>Per GPU</h2>" not in page["html"]


def test_the_demo_run_report_shows_the_xid_of_its_gpu(run_page: dict[str, Any]) -> None:
    """``make demo`` announces "XID 31 on GPU 6": its run report says so, in the diagnosis, on the plot, in a table."""
    html = run_page["html"]
    assert "[gpu_errors]" in html and "GPU 6 (GPU-" in html and "GPU memory page fault (XID 31)" in html
    assert ">XID 31 GPU 6</text>" in html and "GPU events (1)</h2>" in html
    util = _chart(run_page, "GPU utilisation")
    assert util and util[0]["events"]  # its label is laid out on the utilisation plot


def test_the_screenshot_is_the_whole_page_and_nothing_is_wider_than_it(page: dict[str, Any]) -> None:
    lay = page["layout"]
    assert png_size(page["png"]) == (WIDTH * SCALE, int(lay["page"]["h"]) * SCALE)
    assert lay["page"]["w"] <= WIDTH  # no horizontal scrolling: the tables and plots fit
    right = lay["body"]["x"] + lay["body"]["w"]
    for table in lay["tables"]:
        assert table["x"] + table["w"] <= right + 1, table
    for chart in lay["charts"]:
        assert chart["box"]["x"] + chart["box"]["w"] <= right + 1, chart["label"]


def test_every_gpu_and_rank_is_a_series_inside_its_plot(run_page: dict[str, Any]) -> None:
    page = run_page
    n = page["n"]
    gpus = {f"GPU {i}" for i in range(n)}
    ranks = {f"rank {i}" for i in range(n)}
    util = _chart(page, "GPU utilisation")
    memory = _chart(page, "CUDA memory" if n <= MAX_LINES else "CUDA memory, peak")
    gpu_memory = _chart(page, "GPU memory used")
    if n <= MAX_LINES:
        assert len(memory) == 1 and len(gpu_memory) == 1
        # utilisation as small multiples: one plot per GPU, its utilisation and SM activity, in order
        assert [[s["label"] for s in c["series"]] for c in util] == [[f"GPU {i}"] * 2 for i in range(n)]
        assert len({(c["box"]["w"], c["box"]["h"]) for c in util}) == 1  # same size, same axes
        assert len({c["box"]["x"] for c in util}) == 2  # two to a row
        assert {s["label"] for s in memory[0]["series"]} == ranks and len(memory[0]["series"]) == 2 * n
        assert {s["label"] for s in gpu_memory[0]["series"]} == gpus
        for chart in (*util, *memory, *gpu_memory):
            legend = {e["text"] for e in chart["legend"]}
            assert {s["label"] for s in chart["series"]} <= legend, chart["label"]  # each one named
            for s in chart["series"]:
                assert s["box"]["w"] > 0 and _inside(s["box"], chart["plot"]), (chart["label"], s["label"])
    else:
        # a percentile band (the spread) and a heat strip (each one, by name) per metric
        assert [c["kind"] for c in util] == ["band", "strip"] and [c["kind"] for c in gpu_memory] == ["band", "strip"]
        assert [c["kind"] for c in memory] == ["band", "strip"]
        for strip, names in ((util[1], gpus), (gpu_memory[1], gpus), (memory[1], ranks)):
            assert [s["label"] for s in strip["series"]] == sorted(names, key=lambda s: int(s.split()[-1]))
            for s in strip["series"]:
                assert s["cells"] > 0 and _inside(s["box"], strip["box"]), s["label"]
    (spread,) = _chart(page, "Per-rank spread")
    assert len(spread["series"]) == n


def test_every_drawn_line_shows_in_the_screenshot_unless_an_identical_one_covers_it(page: dict[str, Any]) -> None:
    for chart in page["layout"]["charts"]:
        lines = [s for s in chart["series"] if s["tag"] == "polyline"]
        for k, s in enumerate(lines):
            if chart["pixels"]["counts"][k] >= 3:
                continue
            # pixels are counted per colour (a GPU's utilisation and SM lines share one): none of this
            # colour is seen only where later series of other colours are drawn over each of its
            # points (ranks with the same memory use, GPUs equally busy)
            later = [o for o in lines[k + 1 :] if o["color"] != s["color"]]
            assert _hidden_under(s, later), f"{chart['label']}: {s['label']} ({s['color']}) is not in the screenshot"
        for s in chart["series"]:
            if chart["kind"] == "strip":  # a heat-strip row is painted, not background
                px = s["pixels"]
                assert px["background"] < 0.5 * px["total"], (chart["label"], s["label"], px)


def test_legends_labels_and_titles_stay_inside_the_page_and_clear_of_each_other(page: dict[str, Any]) -> None:
    right = page["layout"]["body"]["x"] + page["layout"]["body"]["w"]
    for chart in page["layout"]["charts"]:
        for entry in chart["legend"]:
            assert entry["box"]["x"] + entry["box"]["w"] <= min(right, chart["box"]["x"] + chart["box"]["w"]) + 1, (
                chart["label"],
                entry["text"],
            )
        for title in chart["titles"]:
            assert title["x"] + title["w"] <= chart["box"]["x"] + chart["box"]["w"], chart["label"]
            for label in chart["events"]:
                assert not _overlaps(title, label), chart["label"]
        for a, b in zip(chart["events"], chart["events"][1:], strict=False):
            assert not _overlaps(a, b), chart["label"]


def test_numbers_read_as_people_write_them(run_page: dict[str, Any]) -> None:
    page = run_page
    visible = re.sub(r"<[^>]+>", " ", page["html"].split("<h2>Full report (JSON)</h2>")[0])
    assert not re.findall(r"(?<![\w.-])\d+(?:\.\d+)?e[+-]\d+", visible)  # no 1.026e+04
    assert re.search(r"runtime\s+(\d+ h \d+ min|\d+ min \d+ s)\s", visible)  # "2 h 51 min", "59 min 50 s"
    assert re.search(r"energy\s+[\d.,]+ [kMG]J", visible)  # "5.6 MJ"
