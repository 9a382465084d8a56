"""Where the agent's sampling CPU goes: per-thread CPU per cycle, and the cycle's parts alone.

``python bench/profile_sampling.py [INTERVAL]`` (default 0.1 s): runs the real agent on eight
stand-in H100s against a real InfluxDB 1.x for 24 s and prints each thread's CPU per cycle (from
``time.pthread_getcpuclockid``), then times ``NvmlSource.collect`` and ``Encoder.line`` alone
(the NVML stand-in's own time shown separately). Not part of ``make bench``: it explains its figure 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time

from common import scale
from support.fake_pynvml import FakeNvml, fake_h100_node
from support.influxd import InfluxDB1

from gpulse.agent.config import load_config
from gpulse.agent.loop import Agent
from gpulse.cli.commands import agent as cmd
from gpulse.lineprotocol.encode import Encoder
from gpulse.sources.nvml.source import NvmlSource


def thread_cpu_ns() -> dict[str, int]:
    out = {}
    for t in threading.enumerate():
        try:
            out[t.name] = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))  # type: ignore[arg-type]
        except (OSError, TypeError):
            pass
    return out


def per_thread(interval: float, url: str, duration: float = 24.0) -> None:
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args(["--url", url, "--api", "v1", "--no-socket", "--interval", str(interval),
                         "--duration", str(duration), "--spool-dir", tempfile.mkdtemp(), "--host", "bench"])  # fmt: skip
    agent = Agent(load_config(args), stream=open("/dev/null", "w"), tty=False)
    in_cycle = [0]
    cycle = agent._cycle

    def timed_cycle(ts: int) -> None:
        t = time.thread_time_ns()
        cycle(ts)
        in_cycle[0] += time.thread_time_ns() - t

    agent._cycle = timed_cycle  # type: ignore[method-assign]
    marks: list[tuple[dict[str, int], int, int]] = []
    mark = lambda: marks.append((thread_cpu_ns(), agent.samples, in_cycle[0]))  # noqa: E731
    threading.Timer(3, mark).start()
    threading.Timer(duration - 2 * interval - 0.3, mark).start()
    agent.run()
    (a, s0, c0), (b, s1, c1) = marks
    n = s1 - s0
    print(f"interval {interval} s, {n} cycles; CPU per cycle by thread (fake NVML included):")
    print(f"  {'main: _cycle':28s} {(c1 - c0) / n / 1e6:.3f} ms")
    for name, t in b.items():
        print(f"  {name:28s} {(t - a.get(name, 0)) / n / 1e6:.3f} ms")


def parts_alone(cycles: int, fake: FakeNvml) -> None:
    """10 Hz cycles on a virtual clock shared with the stand-in (GPM spacing is judged on it)."""
    t0 = time.time_ns()
    now = [t0]
    fake.clock_ns = lambda: now[0]
    src = NvmlSource(events=False, clock_ns=lambda: now[0])
    gpus = src.open()
    enc = Encoder()
    series = {
        g.index: enc.series("gpu", {"host": "h", "gpu": str(g.index), "uuid": g.uuid, "model": g.model}) for g in gpus
    }
    collect = encode = 0
    inside0 = fake.inside_ns
    for i in range(cycles):
        now[0] = t0 + i * 101_000_000
        a = time.thread_time_ns()
        readings = src.collect(now[0])
        b = time.thread_time_ns()
        for r in readings:
            if r.measurement == "gpu":
                enc.line(series[r.gpu], r.fields, r.ts_ns)
        encode += time.thread_time_ns() - b
        collect += b - a
    src.close()
    fake.check()
    print(f"alone, per 10 Hz cycle: NvmlSource.collect {collect / cycles / 1e6:.3f} ms "
          f"(of which the NVML stand-in {(fake.inside_ns - inside0) / cycles / 1e6:.3f} ms), encoding 8 gpu lines {encode / cycles / 1e6:.3f} ms")  # fmt: skip


def main() -> None:
    interval = float(sys.argv[1]) if len(sys.argv) > 1 else 0.1
    fake = FakeNvml.install(None, gpus=fake_h100_node(8))
    with tempfile.TemporaryDirectory() as tmp:
        server = InfluxDB1(tmp).start()
        server.create_database("gpulse")
        try:
            per_thread(interval, server.url)
        finally:
            server.stop()
    parts_alone(scale(600, 100), fake)


if __name__ == "__main__":
    main()
