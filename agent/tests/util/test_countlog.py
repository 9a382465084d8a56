"""Counting a recurring problem and logging it once (or once per period)."""

from __future__ import annotations

import logging

from gpulse.util import countlog
from gpulse.util.countlog import CountedLog


def test_every_occurrence_is_counted_and_only_the_first_logged_when_there_is_no_period(caplog):
    once = CountedLog(logging.getLogger("t.once"), period_s=None)
    with caplog.at_level(logging.INFO, logger="t.once"):
        logged = [once.log("k", logging.ERROR, "problem %d", i) for i in range(5)]
        once.log("other", logging.WARNING, "another problem")
    assert logged == [True, False, False, False, False]
    assert [r.getMessage() for r in caplog.records] == ["problem 0", "another problem"]
    assert once.counts == {"k": 5, "other": 1}


def test_with_a_period_it_logs_again_after_it_and_says_how_many_were_not_logged(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(countlog.time, "monotonic", lambda: now[0])
    rl = CountedLog(logging.getLogger("t.period"), period_s=60.0)
    with caplog.at_level(logging.INFO, logger="t.period"):
        assert rl.log("k", logging.WARNING, "down")
        now[0] += 30
        assert not rl.log("k", logging.WARNING, "down")
        assert not rl.log("k", logging.WARNING, "down")
        now[0] += 31
        assert rl.log("k", logging.WARNING, "down")
    assert [r.getMessage() for r in caplog.records] == ["down", "down (2 similar messages suppressed)"]
    assert rl.counts == {"k": 4}
