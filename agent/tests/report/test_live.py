"""Rolling findings (``gpulse.report.live``): the finish() rules over a sliding window, with hysteresis.

The rows are ``train_step`` rows as the agent receives them; time is the rows' own clock (one step
per 0.1 s), so the window's steps and seconds are both exercised. The real-process proof (a real
agent beside a real DataLoader loop, a gloo straggler) is in ``agent/tests/agent/test_live_findings.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpulse.report.live import (
    MAX_BESIDE_ROWS,
    MAX_WINDOW_ROWS,
    FindingState,
    LiveFinding,
    LiveWindow,
    RollingFindings,
)

STEP_NS = 100_000_000
WINDOW = LiveWindow(steps=20, seconds=1.0, every_s=0.5)


def step_row(step: int, rank: int = 0, *, wait: float = 0.001, compute: float = 0.05) -> dict:
    return {
        "time": step * STEP_NS,
        "run": "r1",
        "rank": str(rank),
        "host": "n1",
        "step": step,
        "step_time_s": compute,
        "data_wait_s": wait,
    }


def drive(engine: RollingFindings, steps: range, row: Callable[[int], list[dict]]) -> list[tuple[int, LiveFinding]]:
    """Feed the steps and evaluate after each (the engine itself keeps to ``every_s``): (step, change)."""
    out = []
    for s in steps:
        for r in row(s):
            engine.add(r)
        out += [(s, c) for c in engine.evaluate(s * STEP_NS)]
    return out


def data_bound_between(start: int, stop: int) -> Callable[[int], list[dict]]:
    return lambda s: [step_row(s, wait=0.2 if start <= s < stop else 0.001)]


def test_a_healthy_run_raises_nothing() -> None:
    engine = RollingFindings("r1", WINDOW)
    assert drive(engine, range(1, 400), lambda s: [step_row(s, r) for r in (0, 1)]) == []
    assert engine.open == []


def test_a_run_turning_data_bound_raises_data_loading_within_two_windows_and_clears_after() -> None:
    engine = RollingFindings("r1", WINDOW)
    changes = drive(engine, range(1, 400), data_bound_between(100, 200))
    assert [(c.rule, c.state) for _, c in changes] == [
        ("data_loading", FindingState.RAISED),
        ("data_loading", FindingState.CLEARED),
    ]
    (raised_at, raised), (cleared_at, cleared) = changes
    assert 100 < raised_at <= 100 + 2 * WINDOW.steps
    assert 200 < cleared_at <= 200 + 2 * WINDOW.steps
    assert raised.figures["ratio"] > 0.15 and "waiting for the next batch" in raised.evidence
    assert raised.action and raised.threshold.startswith("data_loading_time_ratio >")
    assert 100 <= raised.first_step < raised_at and cleared.last_step < cleared_at
    assert cleared.first_step == raised.first_step and 195 <= cleared.last_step
    assert engine.open == []


def test_the_finding_stays_open_while_the_rule_holds() -> None:
    engine = RollingFindings("r1", WINDOW)
    drive(engine, range(1, 300), data_bound_between(100, 10_000))
    (f,) = engine.open
    assert f.rule == "data_loading" and f.state is FindingState.RAISED and f.last_step >= 295


@pytest.mark.parametrize("burst", [1, 5, WINDOW.steps // 2])
def test_a_burst_of_up_to_half_a_window_never_raises(burst: int) -> None:
    """A burst, however slow, leaves the window's newer half before the rule has held for a window."""
    engine = RollingFindings("r1", WINDOW)
    changes = drive(engine, range(1, 300), lambda s: [step_row(s, wait=5.0 if 100 <= s < 100 + burst else 0.001)])
    assert changes == []


def test_noise_around_the_threshold_does_not_flap() -> None:
    """Alternating windows of just above and just below never hold or fail for a whole window."""
    engine = RollingFindings("r1", WINDOW)
    half = WINDOW.steps // 2
    changes = drive(engine, range(1, 600), lambda s: [step_row(s, wait=0.02 if (s // half) % 2 else 0.005)])
    assert len(changes) <= 1


def test_a_straggling_rank_raises_rank_imbalance() -> None:
    engine = RollingFindings("r1", WINDOW)

    def rows(s: int) -> list[dict]:
        return [step_row(s, r, compute=0.2 if r == 2 and s >= 50 else 0.05) for r in (0, 1, 2, 3)]

    changes = drive(engine, range(1, 200), rows)
    assert [(c.rule, c.state) for _, c in changes] == [("rank_imbalance", FindingState.RAISED)]
    assert "rank 2" in changes[0][1].evidence and changes[0][0] <= 50 + 2 * WINDOW.steps


def test_evaluations_are_spaced_by_every_s() -> None:
    engine = RollingFindings("r1", LiveWindow(steps=2, seconds=0.1, every_s=10.0))
    for s in range(1, 50):
        engine.add(step_row(s, wait=1.0))
    assert engine.evaluate(1 * STEP_NS) == []  # first evaluation: the rule starts holding
    assert engine.evaluate(50 * STEP_NS) == []  # under every_s later: not evaluated
    assert [c.rule for c in engine.evaluate(20 * 10**9)] == []  # a whole window with no new step
    for s in range(50, 60):
        engine.add(step_row(s, wait=1.0))
    assert [c.rule for c in engine.evaluate(40 * 10**9)] == ["data_loading"]


def test_the_point_fields_follow_the_schema() -> None:
    from gpulse.lineprotocol.encode import Encoder

    engine = RollingFindings("r1", WINDOW)
    (_, f), _ = drive(engine, range(1, 400), data_bound_between(100, 200))
    enc = Encoder()
    line = enc.line(enc.series("train_finding", {"host": "n1", "run": "r1", "rule": f.rule}), f.fields(), f.time_ns)
    assert line is not None and line.startswith("train_finding,host=n1,rule=data_loading,run=r1 ")
    assert 'state="raised"' in line and "figure_ratio=" in line and "first_step=" in line
    assert enc.unknown_fields_dropped == 0


def test_a_window_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="live window"):
        LiveWindow(steps=1)


def test_a_lull_shorter_than_half_a_window_does_not_clear_an_open_finding() -> None:
    engine = RollingFindings("r1", WINDOW)
    lull = range(200, 200 + WINDOW.steps // 2)
    changes = drive(engine, range(1, 400), lambda s: [step_row(s, wait=0.001 if s in lull or s < 100 else 0.2)])
    assert [(c.rule, c.state) for _, c in changes] == [("data_loading", FindingState.RAISED)]


def test_a_run_that_ends_closes_its_open_findings_as_ended() -> None:
    engine = RollingFindings("r1", WINDOW)
    drive(engine, range(1, 300), data_bound_between(100, 10_000))
    (ended,) = engine.end(301 * STEP_NS)
    assert ended.state is FindingState.ENDED and ended.fields()["open"] == 0 and ended.rule == "data_loading"
    assert engine.open == []


def test_the_gpu_rules_read_the_run_s_gpu_rows_beside_its_steps() -> None:
    """A GPU the run registered sits idle from step 100: ``gpu_starved`` is raised live."""
    engine = RollingFindings("r1", WINDOW)

    def rows(s: int) -> list[dict]:
        gpu = {"time": s * STEP_NS, "host": "n1", "gpu": "0", "uuid": "GPU-a", "model": "H100"}
        engine.add_beside("gpu", {**gpu, "util_gpu_pct": 5.0 if s >= 100 else 95.0})
        return [step_row(s)]

    changes = drive(engine, range(1, 200), rows)
    assert [(c.rule, c.state) for _, c in changes] == [("gpu_starved", FindingState.RAISED)]
    assert 100 < changes[0][0] <= 100 + 2 * WINDOW.steps and "busy 5%" in changes[0][1].evidence


def test_a_window_keeps_at_most_max_window_rows_steps_and_max_beside_rows_of_each_host_measurement() -> None:
    """Many ranks, or a long window, cannot grow one run's window without bound: the oldest rows go first."""
    engine = RollingFindings("r1", LiveWindow(steps=20, seconds=3600.0, every_s=0.5))  # every row is in the window
    for s in range(1, MAX_WINDOW_ROWS + 2):
        engine.add(step_row(1 + s // 64, rank=s % 64))
    for m in ("host", "host_process", "gpu"):
        for s in range(1, MAX_BESIDE_ROWS + 2):
            engine.add_beside(m, {"time": s * STEP_NS, "host": "n1", "cpus": 2})
    assert engine.held() == {"train_step": MAX_WINDOW_ROWS, "host": MAX_BESIDE_ROWS, "host_process": MAX_BESIDE_ROWS, "gpu": MAX_BESIDE_ROWS}  # fmt: skip
    assert engine.last_step == 1 + (MAX_WINDOW_ROWS + 1) // 64
    assert engine.evaluate(10**12) == []  # the capped window is still judged
