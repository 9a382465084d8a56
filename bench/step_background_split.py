"""Where the run's background thread spends its CPU per step, part by part (not part of ``make bench``).

``python step_background_split.py [REPS]`` from ``bench/`` with the project's venv (or an older
checkout's interpreter: the parts it lacks are left out) runs the step
bench's loop (:func:`bench_step.overhead`, 1,500 steps of 1 ms per repetition; 200 under
``BENCH_QUICK=1``) with the agent
listening and then absent, with a thread-CPU timer (``time.thread_time_ns``) around each part of the
worker and the client. The timers cost ~0.2 µs a call, so the parts called once per step (making
the point, the report buffer) read a little high; the totals are the step bench's own figures.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_step
from common import scale

from gpulse.training import client, points, report, worker

PARTS: list[tuple[type, str]] = [
    (worker.Worker, "_drain"),  # taking records off the queue: the rows, the report buffer, handing over
    (points.PointMaker, "queued_row"),  # a step's row (the first of a layout made by step_row, inside it)
    (report.ReportBuffer, "add_rows"),
    (client.Client, "submit_rows"),
    (client.Client, "pump"),  # reading acks, sending (packing rows), recording what expired
    (client.Client, "read_acks"),
    (client.Client, "_send_unsent"),
    (client.Client, "_record"),  # the fallback file
]


def _timed(cls: type, name: str, spent: dict[str, int]) -> Callable[..., Any]:
    original = getattr(cls, name)
    label = f"{cls.__name__}.{name}"

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.thread_time_ns() - t

    return timed


def main(reps: int) -> None:
    spent: dict[str, int] = defaultdict(int)
    for cls, name in PARTS:
        if hasattr(cls, name):  # an older checkout lacks some (PointMaker.queued_row before issue 26's cache)
            setattr(cls, name, _timed(cls, name, spent))
    steps = scale(1_500, 200)
    with tempfile.TemporaryDirectory() as tmp:
        with bench_step.listening_agent(tmp) as sock:
            _report("listening", bench_step.overhead(sock, Path(tmp) / "listening", steps, reps), spent, steps, reps)
            spent.clear()
        absent = os.path.join(tmp, "nobody", "agent.sock")
        _report("absent", bench_step.overhead(absent, Path(tmp) / "absent", steps, reps), spent, steps, reps)


def _report(case: str, o: bench_step.Overhead, spent: dict[str, int], steps: int, reps: int) -> None:
    n = steps * (reps + 1)
    print(f"agent {case}: background {o.background_total:.2f} µs/step (finish() included); by part:")
    for label, ns in spent.items():
        print(f"  {label:28} {ns / n / 1000:6.2f} µs/step")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
