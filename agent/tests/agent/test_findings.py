"""The agent's rolling findings per run (``gpulse.agent.findings``): what the channel and the host sampler
hand it, what the loop gets back. The real-process proof is ``test_live_findings.py``."""

from __future__ import annotations

from gpulse.agent.findings import LiveFindings
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
