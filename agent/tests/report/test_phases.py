"""The parts of a step (``gpulse.report.phases``): data wait, forward, backward's compute, exposed
communication, optimizer, custom phases and other add up to the step, in the report's JSON, text
and HTML alike, and the demo's generator follows the same definition."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from gpulse.lineprotocol.parse import parse_line
from gpulse.report.html import render_html
from gpulse.report.model import build_report
from gpulse.report.phases import OUTSIDE, partition, step_share
from gpulse.report.text import render_text
from gpulse.sources import scenario

NS = 1_000_000_000


def step_row(step: int, rank: int = 0, **fields: float) -> dict:
    return {"time": step * NS, "run": "r", "rank": str(rank), "step": step, **fields}


def in_step(parts: dict[str, float]) -> float:
    return sum(v for k, v in parts.items() if k not in OUTSIDE)


def test_backward_is_its_compute_and_the_communication_wait_is_shown_once() -> None:
    """The recorded backward phase holds the wait for the all-reduce (DDP waits before backward()
    returns): the parts take it out of backward and show it as comm, and other is what is left."""
    rows = [step_row(1, data_wait_s=0.1, step_time_s=1.0, forward_s=0.2, backward_s=0.6, comm_s=0.25, optimizer_s=0.1)]
    p = partition(rows)
    assert p.parts == pytest.approx(
        {"data_wait": 0.1, "forward": 0.2, "backward": 0.35, "comm": 0.25, "optimizer": 0.1, "other": 0.1}
    )
    assert p.consistent


def test_without_a_backward_phase_the_communication_wait_is_a_part_of_its_own() -> None:
    p = partition([step_row(1, step_time_s=1.0, comm_s=0.3, phase_loss_s=0.2)])
    assert p.parts == pytest.approx({"comm": 0.3, "loss": 0.2, "other": 0.5})


def test_phases_that_exceed_the_step_are_reported_not_clipped_silently() -> None:
    """Overlapping phases are a measurement error: other is 0 and the report's hints say by how much."""
    rows = [step_row(s, step_time_s=1.0, forward_s=0.5, backward_s=0.4, phase_inner_s=0.3) for s in range(1, 4)]
    p = partition(rows)
    assert p.parts["other"] == 0.0 and p.excess_s == pytest.approx(0.2) and not p.consistent
    report = build_report(rows, [], [], [])
    assert any("exceed the step by 0.2000 s" in h for h in report.hints)
    assert "exceed the step" in render_text(report)


def test_consistent_phases_give_no_hint() -> None:
    rows = [step_row(1, step_time_s=1.0, forward_s=0.3, backward_s=0.6)]
    assert build_report(rows, [], [], []).hints == []


@pytest.fixture(scope="module")
def demo_rows() -> list[dict]:
    """The demo's training run, as a recording would be read back (2 hours, 8 ranks)."""
    tl = scenario.Timeline.build(end_ns=1_800_000_000 * NS, hours=2.0)
    run = scenario.training_lines(tl, "demo", [f"GPU-{i}" for i in range(tl.gpus)])
    return [p.row() for p in map(parse_line, run.lines) if p.measurement == "train_step"]


def test_the_demo_report_parts_add_up_to_the_mean_step(demo_rows: list[dict]) -> None:
    report = build_report(demo_rows, [], [], [])
    parts = report.phases_s
    assert set(parts) == {"data_wait", "forward", "backward", "comm", "optimizer", "other"}
    assert in_step(parts) == pytest.approx(report.step_time_s.mean, rel=0.01)
    assert parts["other"] == pytest.approx(scenario.OTHER_S, rel=0.15)  # the loop's own work, generated
    assert not [h for h in report.hints if "exceed the step" in h]
    # the summary's communication share is the mean of what the bars show, split into the
    # communication itself and the wait for the straggler
    share = step_share(parts, "comm")
    assert share == pytest.approx(report.communication_time_ratio + report.wait_for_slower_ranks_ratio, rel=0.01)
    text = render_text(report)
    assert f"communication waited for {share * 100:.1f}% of the step" in text


def test_every_demo_step_adds_up_and_shows_backward(demo_rows: list[dict]) -> None:
    """Per step, mean over ranks, as the HTML chart stacks it."""
    by_step: dict[int, list[dict]] = defaultdict(list)
    for r in demo_rows:
        by_step[int(r["step"])].append(r)
    assert len(by_step) > 300
    for step, rows in by_step.items():
        p = partition(rows)
        assert in_step(p.parts) == pytest.approx(p.step_s, rel=0.01), step
        assert p.parts["backward"] > 0.3 * p.step_s, step
        assert p.parts["comm"] > 0 and p.parts["other"] > 0, step
        assert p.parts["other"] != pytest.approx(p.parts["comm"], rel=0.05), step


def test_the_html_chart_stacks_the_same_parts(demo_rows: list[dict]) -> None:
    report = build_report(demo_rows, [], [], [])
    html = render_html(report, demo_rows, [], [])
    chart = html[html.index("Step time by part") :]
    chart = chart[: chart.index("</svg>")]
    for name in ("data_wait", "forward", "backward", "comm", "optimizer"):
        assert re.search(rf">{name}<", chart), name
    share = step_share(report.phases_s, "comm")
    assert f"{share * 100:.1f}" in html
