"""8. Host sampling cost: the agent's CPU per cycle with the host beside the GPUs sampled, against the
same agent with ``--no-host-metrics``, in the same run.

The real agent (8 simulated GPUs, 10 Hz, recording to a file, training channel open) runs beside a
real training process (``gpulse.training.Run``, which names its pid in its start point) with four
forked workers, so a host cycle reads the node and five processes. The two agents alternate, each
run for the same time; the figure is the sampling thread's CPU per cycle from the agent's own final
summary (``cycle_cpu_ms``), the whole process's (``cpu_ms_per_cycle``) beside it.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import Table, agent_beside, alternate, scale

WORKERS = 4
_TRAINER = r"""
import os, sys, time
from gpulse.training import Run
run = Run(name="bench-host", output_dir=sys.argv[2], socket_path=sys.argv[1], write_report=False)
for _ in range({workers}):
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
print("ready", flush=True)
time.sleep(3600)
"""


def _agent(tmp: Path, host: bool, seconds: float) -> dict[str, float]:
    """One agent run beside one trainer; its final summary."""
    sock = tmp / f"agent-{host}.sock"
    args = ["--simulate", "8", "--interval", "0.1", "--record", str(tmp / "rec.lp")]
    args += ["--spool-dir", str(tmp / "spool"), *([] if host else ["--no-host-metrics"])]
    summary = tmp / f"summary-{host}.json"
    args += ["--summary-file", str(summary)]
    with agent_beside(sock, args, tmp / f"agent-{host}.log") as env:
        trainer = subprocess.Popen(
            [sys.executable, "-c", _TRAINER.format(workers=WORKERS), str(sock), str(tmp / "out")],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: the workers end with it
        )
        try:
            assert trainer.stdout is not None and trainer.stdout.readline().strip() == "ready"
            time.sleep(seconds)
        finally:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    final = json.loads(summary.read_text())
    points = final["points"]
    if host:
        assert points.get("host_process", 0) > 0, points  # the trainer and its workers were sampled
    return {"cycle_cpu_ms": final["cycle_cpu_ms"], "cpu_ms_per_cycle": final["cpu_ms_per_cycle"]}


def run(table: Table) -> dict[str, float]:
    reps, seconds = scale(3, 1), scale(6, 2)
    with_host, without = alternate(reps, lambda tmp, host: _agent(tmp, host, seconds))
    cyc, cyc0, proc, proc0 = (
        statistics.median(r[key] for r in runs)
        for key in ("cycle_cpu_ms", "cpu_ms_per_cycle")
        for runs in (with_host, without)
    )
    ratio = table.pair(
        f"sampling thread CPU per cycle, 8 GPUs + host and {1 + WORKERS} processes",
        cyc,
        cyc0,
        "{:.2f} ms",
        "--no-host-metrics",
    )
    table.pair("agent process CPU per cycle, same runs", proc, proc0, "{:.2f} ms", "--no-host-metrics")
    return {"cycle_cpu_ratio_host_vs_without": round(ratio, 3)}


if __name__ == "__main__":
    print(json.dumps(run(Table())))
