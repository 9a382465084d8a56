"""The agent's rolling findings per run (``gpulse.agent.findings``): what the channel and the host sampler
hand it, what the loop gets back. The real-process proof is ``test_live_findings.py``."""

from __future__ import annotations

from gpulse.agent.findings import MAX_RUNS, LiveFindings
from gpulse.channel import protocol
from gpulse.report.live import FindingState, LiveWindow

STEP_NS = 100_000_000


def feed(live: LiveFindings, run: str, steps: range, wait: float) -> None:
    for s in steps:
        tags = {"run": run, "rank": "0", "host": "n1"}
        live.observe("train_step", tags, {"step": s, "step_time_s": 0.05, "data_wait_s": wait}, s * STEP_NS)
        live.observe("host", {"host": "n1"}, {"cpus": 2, "cpu_idle_pct": 50.0}, s * STEP_NS)


def test_each_run_is_judged_on_its_own_and_its_end_closes_what_is_open() -> None:
    live = LiveFindings(LiveWindow(steps=10, seconds=0.5, every_s=0.2))
    changes = []
    for s in range(1, 120):
        feed(live, "slow", range(s, s + 1), 0.2)
        feed(live, "fast", range(s, s + 1), 0.001)
        changes += live.evaluate(s * STEP_NS)
    assert [(c.run, c.rule, c.state) for c in changes] == [("slow", "data_loading", FindingState.RAISED)]
    (open_,) = live.open()["slow"]
    assert open_["rule"] == "data_loading" and "fast" not in live.open()
    live.observe("train_run", {"run": "slow", "rank": "0"}, {"event": "end"}, 120 * STEP_NS)
    (ended,) = live.evaluate(121 * STEP_NS)
    assert (ended.run, ended.state) == ("slow", FindingState.ENDED) and live.open() == {}


def test_a_finding_note_survives_the_wire() -> None:
    note = protocol.FindingNote({"run": "r", "rule": "data_loading", "state": "raised", "first_step": 3})
    back = protocol.decode_reply(protocol.encode(note))
    assert type(back) is protocol.FindingNote and back.finding == note.finding
    assert protocol.decode_reply(b'{"v":1,"kind":"finding","finding":"not a dict"}') is None


def test_a_run_beyond_max_runs_evicts_the_least_recently_stepped_one_and_its_open_findings_end(caplog) -> None:
    """Unique run names cannot grow the agent: MAX_RUNS + 1 runs keep MAX_RUNS windows; the eviction is
    counted (the agent's live_runs_evicted) and logged once."""
    live = LiveFindings(LiveWindow(steps=10, seconds=0.5, every_s=0.2))
    raised = []
    for s in range(1, 60):
        feed(live, "slow", range(s, s + 1), 0.2)
        raised += live.evaluate(s * STEP_NS)
    assert [(c.run, c.state) for c in raised] == [("slow", FindingState.RAISED)]
    for k in range(MAX_RUNS - 1):  # the node is full: "slow" and MAX_RUNS - 1 others
        feed(live, f"other-{k}", range(60, 61), 0.001)
    feed(live, "slow", range(60, 61), 0.2)  # "slow" stepped last: "other-0" is now the oldest
    assert len(live.judged()) == MAX_RUNS and live.runs_evicted == 0
    feed(live, "new-1", range(61, 62), 0.001)
    feed(live, "new-2", range(61, 62), 0.001)
    assert live.judged()[:2] == ["other-2", "other-3"] and live.judged()[-3:] == ["slow", "new-1", "new-2"]
    assert len(live.judged()) == MAX_RUNS and live.runs_evicted == 2
    for k in range(MAX_RUNS - 1):  # a further MAX_RUNS - 1 new runs: "slow" is evicted too
        feed(live, f"later-{k}", range(62, 63), 0.001)
    assert "slow" not in live.judged() and live.runs_evicted == 2 + MAX_RUNS - 1
    (ended,) = [c for c in live.evaluate(63 * STEP_NS) if c.run == "slow"]
    assert ended.state is FindingState.ENDED and live.open() == {}
    assert len([r for r in caplog.records if "no longer judged" in r.getMessage()]) == 1
