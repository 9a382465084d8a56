"""Measurement helpers shared by the benchmark sections.

Machines here are noisy, so every figure is the median of several repetitions after a warm-up,
and each gpulse figure is printed beside a baseline measured in the same run.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import gpulse

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "agent" / "tests"))  # test support: fake NVML, real influxd

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")


def scale(full: int, quick: int) -> int:
    """A repetition count: ``full`` normally, ``quick`` under BENCH_QUICK=1."""
    return quick if QUICK else full


def median_of(fn: Callable[[], float], repeats: int, warmup: int = 1) -> float:
    """Median of ``repeats`` calls of ``fn`` (each returns one measurement) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(fn() for _ in range(repeats))


def alternate(reps: int, measure: Callable[[Path, bool], T]) -> tuple[list[T], list[T]]:
    """``measure(directory, on)`` with ``on`` true, then false, ``reps`` times, each in a fresh
    directory: (the results with it on, with it off). The two settings alternate, so that drift on
    the machine hits both alike."""
    on: list[T] = []
    off: list[T] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(reps):
            for flag in (True, False):
                tmp = Path(d) / f"{i}-{flag}"
                tmp.mkdir()
                (on if flag else off).append(measure(tmp, flag))
    return on, off


@contextmanager
def agent_beside(sock: Path, args: list[str], log: Path) -> Iterator[dict[str, str]]:
    """A real ``gpulse agent --socket SOCK ARGS`` for the time of the block, of the gpulse this bench imports
    (so that ``bench/ratios.py`` measures one tree throughout), its log in ``log``.

    Yields the environment for what runs beside it once its socket exists; fails with the log's end if
    the agent ends first or the socket takes over 30 s. On leaving, SIGTERM, and it must exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(gpulse.__file__).parents[1]), env.get("PYTHONPATH", "")])
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpulse", "agent", "--socket", str(sock), *args],
            env=env, stdout=subprocess.DEVNULL, stderr=out,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not sock.exists():
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the agent did not open {sock}: {log.read_text()[-2000:]}")
                time.sleep(0.05)
            yield env
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=60)
    if agent.returncode != 0:
        raise RuntimeError(f"the agent exited {agent.returncode}: {log.read_text()[-2000:]}")


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def rss_mib(pid: int | None = None) -> float:
    """Resident set size of a process in MiB, from /proc."""
    with open(f"/proc/{pid or 'self'}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Table:
    """Rows of (figure, gpulse, baseline, ratio, goal) printed as a readable table."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []

    def add(self, name: str, value: str, baseline: str = "", ratio: str = "", goal: str = "") -> None:
        self.rows.append((name, value, baseline, ratio, goal))
        print(f"  {name}: {value}" + (f"  (baseline {baseline}, {ratio})" if baseline else ""), flush=True)

    def pair(self, name: str, value: float, baseline: float, fmt: str, against: str, goal: str = "") -> float:
        """A figure beside its baseline (``fmt`` formats both, ``against`` names the baseline); the ratio."""
        ratio = value / baseline
        self.add(name, fmt.format(value), f"{fmt.format(baseline)} {against}", f"{ratio:.2f}x", goal)
        return ratio

    def render(self) -> str:
        head = ("figure", "gpulse", "baseline (same run)", "ratio", "goal")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(5)]
        line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([line(head), sep, *(line(r) for r in self.rows)])
