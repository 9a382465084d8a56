"""9. Profiler window cost: the steps taken while an automatic profiler window is open
(:mod:`gpulse.training.profiling`) against the steps without one, in the same run.

One ``Run`` trains a small CPU model (a linear layer's forward, backward and optimizer step, and a
matmul); windows are asked for again and again, each followed by as many steps without one, so
that drift on the machine hits both alike. A window's steps are the ones from the profiler's start
to its stop (the warm-up and the recorded steps); the steps after it wait for its trace to be read
back first, so that its reader thread does not weigh on them. The first window is a warm-up (the
profiler's first start loads Kineto) and is not counted. The figure is the median step time with a
window open over the median without: ``profile_step_ratio_open_vs_closed``; beside it, what a window
adds to its steps in all (the profiler's start, its recording, and the trace's export at its stop,
which runs on the training thread inside torch).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from common import Table, scale

from gpulse.training import Run

#: Steps without a window between two windows (a window takes five: the start, a warm-up, three recorded).
CLOSED_STEPS = 5


def run(table: Table) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)  # intra-op threads fighting over two shared cores are noise, not cost
    windows = scale(12, 3)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    big = torch.randn(256, 256)

    def step() -> None:
        with r.step(samples=64):
            loss = model(x).square().mean() + (big @ big).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

    open_s: list[float] = []
    closed_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        r = Run(
            name="bench-profile", output_dir=Path(tmp), socket_path=str(Path(tmp) / "none.sock"), write_report=False
        )
        window = r.profile_window
        assert window is not None and window.enabled, "profiling is off (GPULSE_PROFILE=0?)"
        window.per_rule_s = 0.0  # a window per request: the hourly limit would allow one
        for _ in range(20):  # warm caches and allocator before anything is timed
            step()
        for w in range(windows + 1):
            assert window.request("bench", "asked by the benchmark")
            times = []
            while window.steps.step_end_hooks:  # the window's hook is in until the profiler stops
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
            while window.busy:  # its trace is being read back
                time.sleep(0.01)
            closed = []
            for _ in range(CLOSED_STEPS):
                t = time.perf_counter()
                step()
                closed.append(time.perf_counter() - t)
            if w:  # the first window loads the profiler: a warm-up
                open_s += times
                closed_s += closed
        r.finish()
    opened, closed_med = statistics.median(open_s), statistics.median(closed_s)
    ratio = opened / closed_med
    extra = (sum(open_s) - closed_med * len(open_s)) / windows  # start, export and recording, per window
    table.add(
        "step with a profiler window open (ms)",
        f"{opened * 1e3:.2f}",
        f"{closed_med * 1e3:.2f} without",
        f"{ratio:.2f}x",
        "bounded: a few steps per finding per hour",
    )
    table.add("time a window adds to its steps, in all (ms)", f"{extra * 1e3:.1f}")
    return {"profile_step_ratio_open_vs_closed": ratio}


if __name__ == "__main__":
    import json

    print(json.dumps(run(Table())))
