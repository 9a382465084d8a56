"""Where the run's background thread spends its CPU per step, part by part (not part of ``make bench``).

``python step_background_split.py [REPS]`` from ``bench/`` with the project's venv runs the step
bench's loop (:func:`bench_step.overhead`, 1,500 steps of 1 ms per repetition; 200 under
``BENCH_QUICK=1``) with the agent
listening and then absent, with a thread-CPU timer (``time.thread_time_ns``) around each part of the
worker and the client. The timers cost ~0.2 µs a call, so the parts called once per step (making
the point, the report buffer) read a little high; the totals are the step bench's own figures.
"""

from __future__ import annotations

import os
import subprocess
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
    (worker.Worker, "_drain"),  # taking records off the queue: the point, the report buffer, handing over
    (points.PointMaker, "step_point"),
    (report.ReportBuffer, "add"),
    (client.Client, "submit_points"),  # JSON encoding while the agent answers, a size bound while not
    (client.Client, "pump"),  # reading acks, sending, recording what expired
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
        setattr(cls, name, _timed(cls, name, spent))
    steps = scale(1_500, 200)
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "run", "agent.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpulse", "agent", "--simulate", "1", "--interval", "1",
             "--record", os.path.join(tmp, "agent.lp"), "--socket", sock, "--spool-dir", os.path.join(tmp, "spool")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while not os.path.exists(sock):
                time.sleep(0.05)
            cases = [("listening", sock)]
            for case, path in [*cases, ("absent", os.path.join(tmp, "nobody", "agent.sock"))]:
                spent.clear()
                o = bench_step.overhead(path, Path(tmp) / case, steps, reps)
                n = steps * (reps + 1)
                print(f"agent {case}: background {o.background_total:.2f} µs/step (finish() included); by part:")
                for label, ns in spent.items():
                    print(f"  {label:28} {ns / n / 1000:6.2f} µs/step")
                if case == "listening":
                    agent.terminate()
        finally:
            agent.terminate()
            agent.wait(timeout=30)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
