"""2. Sampling cost: the cycle's wall and CPU time per GPU, its NVML calls, and the agent's own CPU.

The NVML figures run on the driver stand-in (``agent/tests/support/fake_pynvml.py``) under the
real ``pynvml``; it models the documented per-call waits (``nvmlDeviceGetPcieThroughput``: 20 ms),
so a cycle that calls it shows it in its wall time. No GPU was available to this project.

* **The cycle alone** (1 and 8 busy H100s): ``NvmlSource.collect`` run for one simulated minute at
  1 Hz (60 cycles on a virtual clock: 6 with the ~10 s tier, 1 with the ~60 s tier, 12 with
  processes), in a child process. Wall and thread-CPU time per cycle (median), the stand-in's C
  calls per GPU per cycle (a fast-only cycle, the minute's average, the first cycle), and which
  threads met a built-in wait. ``python bench/bench_sampling.py --cycle --src DIR`` measures
  another source tree (e.g. the project before a change) against the same stand-in.
* **The agent** (8 GPUs at 1 Hz and 10 Hz): the real agent (NVML source, encoder, delivery to a
  real InfluxDB 1.x on loopback, self-metrics, event thread) runs in a child process; process CPU
  time is taken in steady state and divided by the cycles completed. The CPU time spent inside the
  stand-in's C functions stands for the driver's cost and is subtracted, so the figure is
  "everything but the NVML calls"; the baseline beside it is that NVML time.
* **The agent against bare NVML** (8 GPUs at 1 Hz, ``cycle_cpu_ratio_vs_bare_nvml``): the agent's
  whole process CPU per cycle (stand-in included) over that of a plain loop making the same NVML
  calls through pynvml at the same rate, on the same stand-in. The plain loop's calls are the
  source's own: every ``pynvml.nvml*`` function is wrapped before an ``NvmlSource`` opens, and as
  many cycles as the agent's measured window holds run on a virtual clock (so the ~10 s tier and
  the processes come up as often), one recorded list per cycle (outermost calls only); then the
  wrappers are dropped and the lists are replayed as ``fn(*args)``, one list per interval. A
  replayed call gets the objects the source passed, as they are now: the GPM metrics request holds
  the last cycle's sample pair (in half the cycles the wrong way round, which costs the stand-in
  the same), so the replay is not checked for misuse. Event waits (``nvmlEventSetWait``, a
  blocking wait on the event thread) are not replayed. The two run alternately, one child process
  each, and the ratio is of the medians; both children report their C calls per cycle (event
  waits excluded), printed side by side so the "same calls" can be read off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from common import REPO, Table, scale
from support.influxd import InfluxDB1

_CYCLE_CHILD = r"""
import json, statistics, sys, time
sys.path[:0] = [{tests!r}, {src!r}]
from support.fake_pynvml import FakeNvml, fake_h100_node
try:
    from gpulse.sources.nvml.source import NvmlSource
except ImportError:  # the layout before the restructure (gpulse.sources.nvml was a module)
    from gpulse.sources.nvml import NvmlSource
S = 1_000_000_000
T0 = 1_750_000_000 * S
now = [T0]
fake = FakeNvml.install(None, gpus=fake_h100_node({n}), clock_ns=lambda: now[0])
kw = dict(events=False)
try:
    src = NvmlSource(clock_ns=lambda: now[0], **kw)
except TypeError:  # a source without an injectable clock spaces GPM by the cycle timestamps
    src = NvmlSource(**kw)
src.open()
walls, cpus, calls = [], [], []
for k in range({cycles}):
    now[0] = T0 + k * S
    before = sum(fake.calls.values())
    w, c = time.perf_counter(), time.thread_time()
    src.collect(now[0])
    cpus.append(time.thread_time() - c)
    walls.append(time.perf_counter() - w)
    calls.append(sum(fake.calls.values()) - before)
src.close()
fast = [c for k, c in enumerate(calls) if k % 5 and k % 10]  # no medium, slow or process tier due
print(json.dumps(dict(
    wall_ms=statistics.median(walls) * 1e3, wall_ms_max=max(walls) * 1e3, cpu_ms=statistics.median(cpus) * 1e3,
    calls_fast=statistics.median(fast) / {n}, calls_avg=sum(calls) / len(calls) / {n}, calls_first=calls[0] / {n},
    waits=dict(fake.waits),
)))
"""

_AGENT_CHILD = r"""
import argparse, json, sys, threading, time
sys.path.insert(0, {tests!r})
from support.fake_pynvml import FakeNvml, fake_h100_node
fake = FakeNvml.install(None, gpus=fake_h100_node(8))
from gpulse.cli.commands import agent as cmd
from gpulse.agent.config import load_config
from gpulse.agent.loop import Agent
p = argparse.ArgumentParser(); cmd.add_arguments(p)
args = p.parse_args(["--url", {url!r}, "--api", "v1", "--bucket", "gpulse", "--no-socket", "--interval", "{interval}", "--duration", "{duration}",
                     "--spool-dir", {spool!r}, "--host", "bench"])
agent = Agent(load_config(args), stream=open("/dev/null", "w"), tty=False)
marks = []
def c_calls():
    return sum(v for k, v in dict(fake.calls).items() if "EventSet" not in k)
def threads():  # each live thread's own CPU clock, by name
    out = {{}}
    for t in threading.enumerate():
        if t.name.startswith("Thread-"):  # this bench's own timers
            continue
        try:
            out[t.name] = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError):  # ended meanwhile
            pass
    return out
def mark():
    marks.append((time.process_time_ns(), fake.inside_ns, agent.counters.samples, agent.counters.cycles_skipped, c_calls(), threads()))
# Steady state only: from after start-up (probe, threads) to before shutdown (final flush).
T0 = time.monotonic()
threading.Timer({warmup}, mark).start()
threading.Timer({duration} - 2 * {interval} - 0.3, mark).start()
agent.run()
assert len(marks) == 2, (marks, time.monotonic() - T0)
(c0, n0, s0, k0, q0, t0), (c1, n1, s1, k1, q1, t1) = marks
by_thread = {{name: ns - t0[name] for name, ns in t1.items() if name in t0}}
print(json.dumps({{"cpu_ns": c1 - c0, "nvml_ns": n1 - n0, "samples": s1 - s0, "skipped": k1 - k0, "c_calls": q1 - q0,
                  "threads_ns": by_thread}}))
"""

_BARE_CHILD = r"""
import json, sys, time
sys.path.insert(0, {tests!r})
import pynvml as nv
from support.fake_pynvml import FakeNvml, fake_h100_node
S = 1_000_000_000
now = [1_750_000_000 * S]  # the stand-in's and the source's clock: virtual while recording
fake = FakeNvml.install(None, gpus=fake_h100_node(8), clock_ns=lambda: now[0])
interval_ns = round({interval} * S)
# Record: every pynvml function wrapped (outermost calls only) while the source runs its cycles.
originals, recorded, depth = {{}}, [], [0]
def recorder(fn):
    def call(*a, **kw):
        if depth[0] == 0 and recorded:
            recorded[-1].append((fn, a, kw))
        depth[0] += 1
        try:
            return fn(*a, **kw)
        finally:
            depth[0] -= 1
    return call
for name in dir(nv):
    obj = getattr(nv, name)
    if name.startswith("nvml") and callable(obj) and not isinstance(obj, type):
        originals[name] = obj
        setattr(nv, name, recorder(obj))
from gpulse.sources.nvml.source import NvmlSource
src = NvmlSource(clock_ns=lambda: now[0], events=False)
src.open()
src.collect(now[0])  # the first cycle (every tier, the probe's first reads) is start-up, not steady state
for k in range({cycles}):
    now[0] += interval_ns
    recorded.append([])
    src.collect(now[0])
for name, fn in originals.items():
    setattr(nv, name, fn)
# Replay: the same calls in a plain loop, one cycle per interval, process CPU time.
NVMLError = nv.NVMLError
def c_calls():
    return sum(v for k, v in dict(fake.calls).items() if "EventSet" not in k)
q0, c0 = c_calls(), time.process_time_ns()
t = time.time_ns()
for k, calls in enumerate(recorded):
    time.sleep(max(0.0, (t + k * interval_ns - time.time_ns()) / S))
    now[0] += interval_ns
    for fn, a, kw in calls:
        try:
            fn(*a, **kw)
        except NVMLError:
            pass
c1, q1 = time.process_time_ns(), c_calls()
src.close()
print(json.dumps({{"cpu_ns": c1 - c0, "samples": len(recorded), "c_calls": q1 - q0}}))
"""


def cycle_figures(n_gpus: int, src: Path, cycles: int = 60) -> dict[str, float]:
    """The cycle alone, on ``n_gpus`` busy H100s, with the source tree at ``src``."""
    code = _CYCLE_CHILD.format(tests=str(REPO / "agent" / "tests"), src=str(src), n=n_gpus, cycles=cycles)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"cycle child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class AgentRun(NamedTuple):
    """One agent child's figures per cycle (ms and counts), and its CPU per cycle by thread name (ms)."""

    figures: dict[str, float]
    threads_ms: dict[str, float]


def measure(interval: float, duration: float, tmp: Path, url: str) -> AgentRun:
    code = _AGENT_CHILD.format(
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
    figures = {
        "agent_ms": (r["cpu_ns"] - r["nvml_ns"]) / n / 1e6,
        "nvml_ms": r["nvml_ns"] / n / 1e6,
        "total_ms": r["cpu_ns"] / n / 1e6,
        "c_calls": r["c_calls"] / n,
        "samples": r["samples"],
        "skipped": r["skipped"],
    }
    return AgentRun(figures, {name: ns / n / 1e6 for name, ns in r["threads_ns"].items()})


def measure_bare(interval: float, cycles: int) -> dict[str, float]:
    """The same NVML calls as the source's, replayed through pynvml in a plain loop (8 GPUs)."""
    code = _BARE_CHILD.format(tests=str(REPO / "agent" / "tests"), interval=interval, cycles=cycles)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=2 * cycles * interval + 60
    )
    if out.returncode != 0:
        raise RuntimeError(f"bare NVML child failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    n = max(r["samples"], 1)
    return {"total_ms": r["cpu_ns"] / n / 1e6, "c_calls": r["c_calls"] / n}


def run(table: Table) -> dict[str, float]:
    out: dict[str, float] = {}
    src = REPO / "agent" / "src"
    for n in (1, 8):
        c = cycle_figures(n, src, cycles=scale(60, 30))
        table.add(
            f"NVML cycle, {n} busy H100(s): wall per GPU, ms (stand-in with the documented waits)",
            f"{c['wall_ms'] / n:.3f}",
            f"cycle wall {c['wall_ms']:.3f} ms (max {c['wall_ms_max']:.3f}), CPU {c['cpu_ms']:.3f} ms",
            f"waits on {sorted(c['waits']) or 'no thread'}",
            "no built-in wait in the cycle",
        )
        out[f"cycle_wall_ms_per_gpu_{n}gpu"] = round(c["wall_ms"] / n, 4)
        if n == 8:
            table.add(
                "NVML C calls per GPU per cycle (8 H100s, one simulated minute at 1 Hz)",
                f"{c['calls_avg']:.2f}",
                f"fast-only cycle {c['calls_fast']:.0f}, first cycle {c['calls_first']:.0f}",
            )
            out["nvml_calls_per_gpu_cycle"] = round(c["calls_avg"], 2)
    with tempfile.TemporaryDirectory() as tmp:
        server = InfluxDB1(Path(tmp) / "influxd").start()
        server.create_database("gpulse")
        try:
            out.update(_both(table, Path(tmp), server.url))
        finally:
            server.stop()
    return out


def against_bare(tmp: Path, url: str) -> tuple[AgentRun, dict[str, float]]:
    """One round of ``cycle_cpu_ratio_vs_bare_nvml``: the agent at 1 Hz, then the plain loop over as many
    cycles as the agent's steady-state window holds."""
    return measure(1.0, scale(33, 9), tmp, url), measure_bare(1.0, scale(28, 4))


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _span(runs: list[dict[str, float]], key: str) -> str:
    return f"{min(r[key] for r in runs):.3f}-{max(r[key] for r in runs):.3f}"


def _both(table: Table, tmp: Path, url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    runs = [against_bare(tmp, url) for _ in range(scale(3, 1))]  # alternately, the agent then the plain loop
    agents, bares = [a.figures for a, _ in runs], [b for _, b in runs]
    agent, bare = _medians(agents), _medians(bares)
    ratio = agent["total_ms"] / bare["total_ms"]
    table.add(
        f"agent process CPU per cycle, 8 GPUs at 1 Hz, stand-in included (median of {len(agents)} runs), ms",
        f"{agent['total_ms']:.3f} ({_span(agents, 'total_ms')})",
        f"{bare['total_ms']:.3f} ({_span(bares, 'total_ms')}): the same NVML calls through pynvml in a plain loop "
        f"(C calls per cycle: agent {agent['c_calls']:.1f}, loop {bare['c_calls']:.1f})",
        f"{ratio:.2f}",
        "<= 2.0",
    )
    out["cycle_cpu_ratio_vs_bare_nvml"] = round(ratio, 3)
    names = {name for a, _ in runs for name in a.threads_ms}  # a thread missing from a run spent nothing there
    threads = {name: statistics.median(a.threads_ms.get(name, 0.0) for a, _ in runs) for name in names}
    table.add(
        "the agent's CPU per cycle above by thread (median, ms): each wake-up of a thread costs it cold caches",
        ", ".join(f"{name} {ms:.3f}" for name, ms in sorted(threads.items(), key=lambda kv: -kv[1])),
        "the sampling thread (MainThread) makes the NVML calls the plain loop replays, and samples the host",
    )
    for hz, key in ((1, "cycle_cpu_ms_8gpu_1hz"), (10, "cycle_cpu_ms_8gpu_10hz")):
        m = agent if hz == 1 else measure(1 / hz, scale(15, 6), tmp, url).figures
        table.add(
            f"agent CPU per cycle, 8 GPUs at {hz} Hz ({m['samples']:.0f} cycles, {m['skipped']:.0f} skipped), ms",
            f"{m['agent_ms']:.3f}",
            f"{m['nvml_ms']:.3f} in (stand-in) NVML calls",
        )
        out[key] = round(m["agent_ms"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="the NVML cycle alone, for one source tree (JSON per GPU count)")
    ap.add_argument("--cycle", action="store_true", help="only the cycle figures")
    ap.add_argument("--src", type=Path, default=REPO / "agent" / "src", help="the source tree to measure")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--cycles", type=int, default=60)
    args = ap.parse_args()
    if not args.cycle:
        table = Table()
        print(json.dumps(run(table)))
        print(table.render())
        return
    for n in args.gpus:
        print(json.dumps({"gpus": n, **cycle_figures(n, args.src.resolve(), args.cycles)}))


if __name__ == "__main__":
    main()
