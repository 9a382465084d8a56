"""The live status: redrawn in place on a terminal, plain periodic log lines otherwise."""

from __future__ import annotations

import io
import logging
import os

import pytest

from gpulse.agent.status_line import StatusLine, format_status, human_age, human_bytes

SNAPSHOT = {
    "gpus": [{"index": i, "uuid": f"GPU-{i}", "lost": i == 3, "run": "run-1" if i < 2 else None} for i in range(4)],
    "runs": {"GPU-0": "run-1", "GPU-1": "run-1"},
    "training": [{"run": "run-1", "rank": "0", "pid": 10}, {"run": "run-1", "rank": "1", "pid": 11}],
    "lines_per_s": 41.6,
    "spool_bytes": 3 * 1024 * 1024,
    "lines_dropped": 0,
    "last_write_age_s": 0.4,
    "cycles_skipped": 2,
}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_line_names_gpus_runs_rate_spool_and_last_write() -> None:
    text = format_status(SNAPSHOT)
    assert text == "4 GPUs (1 lost), 1 run(s) | 42 lines/s | spool 3.0 MiB | last write just now, 2 cycles skipped"
    empty = format_status({"gpus": [{}], "lines_per_s": 0, "spool_bytes": 0, "last_write_age_s": None})
    assert empty == "1 GPU | 0 lines/s | spool empty | last write never"


def test_sizes_and_ages_read_naturally() -> None:
    assert [human_bytes(n) for n in (12, 2048, 5 * 1024**3)] == ["12 B", "2.0 KiB", "5.0 GiB"]
    assert [human_age(s) for s in (0.2, 42, 600, 10800)] == ["just now", "42s ago", "10m ago", "3.0h ago"]


def test_on_a_terminal_the_line_is_redrawn_in_place_at_most_once_a_second() -> None:
    out, clock = io.StringIO(), Clock()
    s = StatusLine(lambda: SNAPSHOT, out, tty=True, clock=clock)
    assert not s.tick()  # not due yet
    clock.t += 1.0
    assert s.tick()
    clock.t += 0.5
    assert not s.tick()
    clock.t += 0.5
    assert s.tick()
    frames = out.getvalue().split("\r\x1b[K")
    assert frames[0] == "" and len(frames) == 3
    assert all(f.startswith("gpulse: 4 GPUs") and "\n" not in f for f in frames[1:])
    s.close()
    assert out.getvalue().endswith("\r\x1b[K")  # the terminal is left clean for the final summary


def test_a_log_record_on_the_same_terminal_first_erases_the_status_line() -> None:
    out, clock = io.StringIO(), Clock()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        s = StatusLine(lambda: SNAPSHOT, out, tty=True, clock=clock)
        clock.t += 1.0
        s.tick()
        logging.getLogger("gpulse.test").warning("database unreachable")
        assert out.getvalue().endswith(
            "lines/s | spool 3.0 MiB | last write just now, 2 cycles skipped\r\x1b[Kdatabase unreachable\n"
        )
        s.close()
        assert not handler.filters
    finally:
        root.removeHandler(handler)


def test_without_a_terminal_the_status_is_a_plain_log_line_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    out, clock = io.StringIO(), Clock()
    s = StatusLine(lambda: SNAPSHOT, out, tty=False, log_every=30, clock=clock)
    with caplog.at_level(logging.INFO, logger="gpulse.agent"):
        clock.t += 29
        assert not s.tick()
        clock.t += 1
        assert s.tick()
    assert out.getvalue() == ""  # nothing drawn: only the log
    assert [r.getMessage() for r in caplog.records] == [f"status: {format_status(SNAPSHOT)}"]


def test_a_real_pseudo_terminal_is_detected_as_a_terminal() -> None:
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty, open(os.devnull, "w") as null:
            assert StatusLine(dict, tty).tty
            assert not StatusLine(dict, null).tty
    finally:
        os.close(master)
        os.close(slave)
