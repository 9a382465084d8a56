"""2. Sampling cost: the agent's own CPU time per cycle with 8 GPUs on the fake NVML, at 1 Hz and 10 Hz.

The real agent (NVML source, encoder, delivery to a real InfluxDB 1.x on loopback, self-metrics,
event thread) runs
in a child process for a fixed time; process CPU time is taken in steady state, from after
start-up to before shutdown, and divided by the cycles completed in between. Every fake NVML function is wrapped to add up the CPU time
spent inside it; that time stands for the driver's cost and is subtracted, so the figure is
"everything but the NVML calls". The baseline beside it is the same cycle's NVML (fake) time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, Table, scale
from support.influxd import InfluxDB1

_CHILD = r"""
import argparse, json, sys, time
sys.path.insert(0, {tests!r})
import pynvml
from support.fake_pynvml import FakeNvml, fake_h100_node
fake = FakeNvml.install(None, gpus=fake_h100_node(8))
inside = [0]
def wrap(fn):
    tt = time.thread_time_ns
    def timed(*a, **k):
        t = tt()
        try:
            return fn(*a, **k)
        finally:
            inside[0] += tt() - t
    return timed
for name in FakeNvml.FUNCTIONS:
    setattr(pynvml, name, wrap(getattr(pynvml, name)))
from gpulse.cli.commands import agent as cmd
from gpulse.agent.config import load_config
from gpulse.agent.loop import Agent
p = argparse.ArgumentParser(); cmd.add_arguments(p)
args = p.parse_args(["--url", {url!r}, "--api", "v1", "--bucket", "gpulse", "--no-socket", "--interval", "{interval}", "--duration", "{duration}",
                     "--spool-dir", {spool!r}, "--host", "bench"])
agent = Agent(load_config(args), stream=open("/dev/null", "w"), tty=False)
marks = []
def mark():
    marks.append((time.process_time_ns(), inside[0], agent.counters.samples, agent.counters.cycles_skipped))
import threading
# Steady state only: from after start-up (probe, threads) to before shutdown (final flush).
T0 = time.monotonic()
threading.Timer({warmup}, mark).start()
threading.Timer({duration} - 2 * {interval} - 0.3, mark).start()
agent.run()
assert len(marks) == 2, (marks, time.monotonic() - T0)
(c0, n0, s0, k0), (c1, n1, s1, k1) = marks
print(json.dumps({{"cpu_ns": c1 - c0, "nvml_ns": n1 - n0, "samples": s1 - s0, "skipped": k1 - k0}}))
"""


def measure(interval: float, duration: float, tmp: Path, url: str) -> dict[str, float]:
    code = _CHILD.format(
        tests=str(REPO / "agent" / "tests"),
        url=url,
        spool=str(tmp / f"spool-{interval}"),
        interval=interval,
        duration=duration,
        warmup=2.5,
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=duration + 60)
    if out.returncode != 0:
        raise RuntimeError(f"sampling child failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    n = max(r["samples"], 1)
    return {
        "agent_ms": (r["cpu_ns"] - r["nvml_ns"]) / n / 1e6,
        "nvml_ms": r["nvml_ns"] / n / 1e6,
        "samples": r["samples"],
        "skipped": r["skipped"],
    }


def run(table: Table) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = InfluxDB1(Path(tmp) / "influxd").start()
        server.create_database("gpulse")
        try:
            out.update(_both(table, Path(tmp), server.url))
        finally:
            server.stop()
    return out


def _both(table: Table, tmp: Path, url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for hz, duration, key in ((1, scale(33, 9), "cycle_cpu_ms_8gpu_1hz"), (10, scale(15, 6), "cycle_cpu_ms_8gpu_10hz")):
        m = measure(1 / hz, duration, tmp, url)
        table.add(
            f"agent CPU per cycle, 8 GPUs at {hz} Hz ({m['samples']:.0f} cycles, {m['skipped']:.0f} skipped), ms",
            f"{m['agent_ms']:.3f}",
            f"{m['nvml_ms']:.3f} in (fake) NVML calls",
            "",
            "<= 0.3 ms",
        )
        out[key] = round(m["agent_ms"], 4)
    return out
