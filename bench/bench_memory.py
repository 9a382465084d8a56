"""6. Memory: the agent's RSS after 10 simulated minutes with 8 GPUs at 10 Hz and a training run
sending steps; RSS at start and at the end (goal: <= 60 MiB and flat).

Time is compressed ten times: a child process builds the real agent (simulated 8 x H100 source,
the training receiver on its socket, delivery to a real InfluxDB 1.x) and drives its sampling
cycle every 10 ms of real time with timestamps 100 ms apart, 6,000 cycles, with the flush
interval compressed alike (0.1 s for the default 1 s, so each request carries what it would in
production), while a training process sends one step per cycle through ``gpulse.training.Run``. RSS is read from /proc at start (after
the first simulated 10 s, when every lazy import and first-use cache is in) and at the end, with
samples in between to show the curve. The baseline is a
bare Python interpreter that imported the same modules (what the agent costs before holding data).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, Table, scale
from support.influxd import InfluxDB1

_CHILD = r"""
import argparse, json, os, sys, time, threading
sys.path.insert(0, {tests!r})
from gpulse.cli.commands import agent as cmd
from gpulse.agent.config import load_config
from gpulse.agent.loop import Agent
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS:"))
p = argparse.ArgumentParser(); cmd.add_arguments(p)
args = p.parse_args(["--url", {url!r}, "--api", "v1", "--bucket", "gpulse", "--simulate", "8", "--interval", "0.1",
                     "--flush-interval", "0.1", "--socket", {sock!r}, "--spool-dir", {spool!r}, "--host", "bench"])
agent = Agent(load_config(args), stream=open("/dev/null", "w"), tty=False)
agent.source.open()
agent._start_pipeline()
print("READY", flush=True)
sys.stdin.readline()  # the training process is connected
curve = []
ts = time.time_ns() - {cycles} * 100_000_000
due = time.monotonic()
for i in range({cycles}):
    if i == 100:
        start = rss()  # after the first simulated 10 s: every lazy import and first-use cache is in
    agent._cycle(ts)
    if i % 100 == 0:
        agent._submit_self_metrics(ts)
    if i % 1000 == 0:
        curve.append(round(rss(), 1))
    ts += 100_000_000
    due += 0.01  # ten times faster than real time
    time.sleep(max(0.0, due - time.monotonic()))
agent.delivery.flush(60)
end = rss()
curve.append(round(end, 1))
stats = agent.delivery.stats()
rec = agent.receiver.stats() if agent.receiver else dict()
agent.receiver.close(); agent.delivery.close(30); agent.source.close()
print(json.dumps(dict(start=start, end=end, curve=curve, written=stats["lines_written"],
                      received=rec.get("records_received", 0))), flush=True)
"""

_TRAINER = r"""
import sys, time
from gpulse.training import Run
run = Run(name="membench", output_dir={out!r}, socket_path={sock!r}, write_report=False)
print("UP", flush=True)
for i in range({steps}):
    with run.step(samples=32, tokens=65536):
        with run.phase("forward"): pass
        with run.phase("backward"): pass
        with run.phase("optimizer"): pass
    run.log(loss=1.0 / (i + 1))
    time.sleep(0.01)
run.finish()
"""

_BARE = (
    "import gpulse.agent.loop, gpulse.delivery.pipeline, gpulse.sources.simulated, gpulse.channel.server; "
    "print(next(int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')))"
)


def run(table: Table) -> dict[str, float]:
    cycles = scale(6000, 600)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        server = InfluxDB1(t / "influxd").start()
        server.create_database("gpulse")
        sock = str(t / "run" / "agent.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD.format(tests=str(REPO / "agent" / "tests"), url=server.url, sock=sock,
                                                     spool=str(t / "spool"), cycles=cycles)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "READY"
            trainer = subprocess.Popen(
                [sys.executable, "-c", _TRAINER.format(out=str(t / "out"), sock=sock, steps=cycles)],
                stdout=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip
            assert trainer.stdout is not None and trainer.stdout.readline().strip() == "UP"
            child.stdin.write("go\n")
            child.stdin.flush()
            result = json.loads(child.stdout.readline())
            child.wait(timeout=120)
            trainer.wait(timeout=120)
        finally:
            server.stop()
    bare = float(subprocess.run([sys.executable, "-c", _BARE], capture_output=True, text=True, check=True).stdout)
    table.add(
        f"agent RSS over {cycles / 600:.0f} simulated min, 8 GPUs at 10 Hz + training steps (MiB)",
        f"start {result['start']:.1f}, end {result['end']:.1f}",
        f"{bare:.1f} (interpreter with the agent's modules imported)",
        f"curve {result['curve']}; {result['written']:,} lines written, {result['received']:,} records",
        "<= 60 MiB, flat",
    )
    return {"agent_rss_mib_start": round(result["start"], 1), "agent_rss_mib_end": round(result["end"], 1)}
