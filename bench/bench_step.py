"""3. Training step overhead: what ``gpulse.training`` costs per step (step + 3 phases + wrap_loader +
one ``log``), with a real agent listening on the socket and with the agent absent (the client then
records to its fallback file). Two figures per case, each with its spread over repetitions:

* **training thread**: the CPU time the instrumented loop takes beyond the same bare loop,
  ``(instrumented - bare) / steps``: what gpulse adds to the user's loop itself;
* **background thread**: the CPU time of the run's own thread (turning records into points,
  encoding, sending, reading acks, recording) per step, read from that thread's own clock
  (``pthread_getcpuclockid``) over the repetitions, plus the ``finish()`` that sends or records
  what is left: all the work a step causes besides the training thread's.

One more line puts them in proportion: the **hot** figures (:func:`hot`), with nothing between
the steps, on warm caches: gpulse's step against the same loop on *Python* no-op context managers
and calls of the same shape (:class:`PythonFloor`), what any instrumentation written in Python pays;
their ratio is ``step_hot_ratio_vs_python_floor``.

Noise: the bare and the instrumented loop run in one process, interleaved in blocks of
:data:`BLOCK` steps (a bare block, an instrumented block, their order alternating), so that what
drifts on this kind of machine (a VM: each 1 ms sleep alone costs the thread 17-24 µs of CPU,
varying by a few µs from one second to the next) hits both alike; every figure is a median over
repetitions of 1,500 steps, printed with its range. Each step waits the same stand-in for GPU
work in both loops, a 1 ms sleep that releases the GIL as a wait on the GPU does, so the background
thread works when it would in real training and competes for the GIL as it would; the wall-time
difference shows what that competition costs. ``torch.cuda.synchronize`` is patched to count
calls: the instrumented loop must make none (the CPU build of torch cannot report
synchronisations any other way).

Only ``Run``'s public API is used, so the same file measures an older checkout of gpulse
(run it with that checkout's interpreter).
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from common import Table, agent_beside, scale

from gpulse.training import Run

WORK_S = 0.001  # per-step stand-in for waiting on the GPU (a fast step: real ones take 0.1-10 s)
#: Steps per block of the bare and the instrumented loop (they alternate; see the module's docstring).
BLOCK = 50


class Spread(NamedTuple):
    """A median and the range around it, in µs per step."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, xs: list[float]) -> Spread:
        return cls(statistics.median(xs), min(xs), max(xs))

    def __str__(self) -> str:
        return f"{self.median:.2f} ({self.low:.2f}-{self.high:.2f})"


class Overhead(NamedTuple):
    """One case's figures, µs per step: training thread CPU, wall, background thread CPU."""

    cpu: Spread
    wall: Spread
    background: Spread
    #: the background thread's CPU over the run's whole life (every repetition and ``finish()``)
    background_total: float


def _loop_bare(loader: list[int], wait: Any = time.sleep) -> None:
    acc = 0
    for batch in loader:
        acc += batch
        wait(WORK_S)


def _loop_instrumented(run: Any, loader: list[int], wait: Any = time.sleep) -> None:
    acc = 0
    for batch in run.wrap_loader(loader):
        with run.step(samples=32, tokens=32 * 2048):
            with run.phase("forward"):
                acc += batch
                wait(WORK_S)
            with run.phase("backward"):
                pass
            with run.phase("optimizer"):
                pass
        run.log(loss=0.5)


class _GcClock:
    """CPU time each thread spends in the garbage collector (``gc.callbacks``), and full collections.

    Which thread a collection lands on is chance (whichever allocates the object that crosses a
    threshold), and a full one costs tens of ms with torch's objects in the heap: the thread figures
    leave it out, and it is shown on its own."""

    def __init__(self) -> None:
        self.ns: dict[int, int] = {}
        self.full = 0
        self._start: dict[int, int] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._start[me] = time.thread_time_ns()
        elif me in self._start:
            self.ns[me] = self.ns.get(me, 0) + time.thread_time_ns() - self._start.pop(me)
            self.full += info["generation"] == 2

    def of(self, thread: int | None = None) -> int:
        return self.ns.get(threading.get_ident() if thread is None else thread, 0)

    def total(self) -> int:
        return sum(self.ns.values())

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


GC = _GcClock()


class PythonFloor:
    """The instrumented loop's calls on Python objects that do nothing: ``wrap_loader`` a generator,
    ``step`` and ``phase`` methods returning a context manager whose ``__enter__`` and ``__exit__``
    are empty, ``log`` a method taking keywords. What any instrumentation of this shape written in
    Python costs the training thread, whatever it records."""

    def __enter__(self) -> PythonFloor:
        return self

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        return None

    def wrap_loader(self, loader: list[int]) -> Iterator[int]:
        for batch in loader:  # noqa: UP028  (a Python frame per batch, as any wrapper that sees them has)
            yield batch

    def step(self, samples: int | None = None, tokens: int | None = None, step: int | None = None) -> PythonFloor:
        return self

    def phase(self, name: str) -> PythonFloor:
        return self

    def log(self, **scalars: float) -> None:
        return None


def _no_wait(_seconds: float) -> None:
    """The hot figures' GPU wait: none, so that each step runs on the caches the previous one left."""


class Hot(NamedTuple):
    """Training-thread CPU per step beyond the bare loop, hot, µs: gpulse's step and the Python floor;
    and the training thread's minor page faults per step in each (median over the rounds)."""

    gpulse: Spread
    floor: Spread
    gpulse_faults: float
    floor_faults: float

    @property
    def ratio(self) -> float:
        return self.gpulse.median / self.floor.median


def hot(out: Path, blocks: int) -> Hot:
    """gpulse's step and the :class:`PythonFloor`, each beyond the bare loop, with nothing between
    the steps: ``blocks`` rounds of a block of 1,000 steps of each loop in turn (the order rotating),
    medians over the rounds. Warm caches: the loop figures above pay for cold ones after each wait,
    which is most of what they measure on a shared VM. Agent absent (the run records)."""
    loader = list(range(1_000))
    run = Run(name="bench-hot", output_dir=out, socket_path=str(out / "nobody.sock"), write_report=False)
    floor = PythonFloor()
    order = [(_loop_bare, ()), (_loop_instrumented, (run,)), (_loop_instrumented, (floor,))]
    ours, theirs, our_faults, their_faults = [], [], [], []
    try:
        for k in range(blocks + 1):
            cpu, faults = {}, {}
            for loop, args in order[k % 3 :] + order[: k % 3]:
                key = args[0] if args else None
                f0 = _minor_faults()
                cpu[key] = _timed(loop, *args, loader, _no_wait)[1] / len(loader) / 1000
                faults[key] = (_minor_faults() - f0) / len(loader)
            if k:  # the first round warms up
                ours.append(cpu[run] - cpu[None])
                theirs.append(cpu[floor] - cpu[None])
                our_faults.append(faults[run])
                their_faults.append(faults[floor])
    finally:
        run.finish()
    return Hot(Spread.of(ours), Spread.of(theirs), statistics.median(our_faults), statistics.median(their_faults))


def _minor_faults() -> int:
    """Minor page faults of the calling thread so far: memory touched for the first time, which is what
    a step's records cost beyond their CPU while they wait for the background thread's tick."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _paired(loop: Any, arg: Any, loader: list[int], bare_first: bool) -> tuple[int, int, int, int]:
    """(``loop`` wall, ``loop`` CPU, bare wall, bare CPU) in ns over ``loader``, run in alternating
    blocks of :data:`BLOCK` steps."""
    iw = ic = bw = bc = 0
    for k, start in enumerate(range(0, len(loader), BLOCK)):
        block = loader[start : start + BLOCK]
        first_bare = bare_first == (k % 2 == 0)
        if first_bare:
            w, c = _timed(_loop_bare, block)
            bw, bc = bw + w, bc + c
        w, c = _timed(loop, arg, block)
        iw, ic = iw + w, ic + c
        if not first_bare:
            w, c = _timed(_loop_bare, block)
            bw, bc = bw + w, bc + c
    return iw, ic, bw, bc


def _timed(loop: object, *args: object) -> tuple[int, int]:
    """(wall ns, training-thread CPU ns without garbage collection) of one loop."""
    w, c, g = time.perf_counter_ns(), time.thread_time_ns(), GC.of()
    loop(*args)  # type: ignore[operator]
    return time.perf_counter_ns() - w, time.thread_time_ns() - c - (GC.of() - g)


def _others_cpu_ns() -> int:
    """CPU of every thread of this process but the calling one."""
    return time.process_time_ns() - time.thread_time_ns()


class _ThreadClock:
    """CPU time of the threads a ``Run`` started (its background thread), from their own clocks,
    without their garbage collection."""

    def __init__(self, threads: list[threading.Thread]) -> None:
        self.threads = [(t.ident, time.pthread_getcpuclockid(t.ident)) for t in threads if t.ident is not None]

    def ns(self) -> int:
        return sum(time.clock_gettime_ns(clock) - GC.of(ident) for ident, clock in self.threads)


def overhead(socket_path: str, out: Path, steps: int, reps: int) -> Overhead:
    """The figures for one case: a warm-up repetition, then ``reps`` measured ones."""
    loader = list(range(steps))
    before = set(threading.enumerate())
    run = Run(name="bench", output_dir=out, socket_path=socket_path, write_report=False)
    clock = _ThreadClock([t for t in threading.enumerate() if t not in before])
    cpu, wall, background = [], [], []
    total_ns = 0
    for rep in range(reps + 1):
        b0 = clock.ns()
        iw, ic, bw, bc = _paired(_loop_instrumented, run, loader, bare_first=rep % 2 == 0)
        b1 = clock.ns()
        total_ns += b1 - b0
        if rep:  # the first repetition warms up
            cpu.append((ic - bc) / steps / 1000)
            wall.append((iw - bw) / steps / 1000)
            background.append((b1 - b0) / steps / 1000)
    o0, g0 = _others_cpu_ns(), GC.total() - GC.of()
    run.finish()  # the background thread sends (or records) what is left, then ends
    total_ns += _others_cpu_ns() - o0 - (GC.total() - GC.of() - g0)
    return Overhead(Spread.of(cpu), Spread.of(wall), Spread.of(background), total_ns / ((reps + 1) * steps) / 1000)


@contextmanager
def listening_agent(tmp: str) -> Iterator[str]:
    """A real ``gpulse agent`` (one simulated GPU, recording to a file) for the time of the block;
    yields its socket path once the socket exists."""
    sock = Path(tmp, "run", "agent.sock")
    args = ["--simulate", "1", "--interval", "1", "--record", os.path.join(tmp, "agent.lp")]
    with agent_beside(sock, [*args, "--spool-dir", os.path.join(tmp, "spool")], Path(tmp, "agent.log")):
        yield str(sock)


def run(table: Table) -> dict[str, float]:
    steps, reps = scale(1_500, 300), scale(13, 2)
    sync_calls = 0
    try:
        import torch

        def counting_sync(*_a: object, **_k: object) -> None:
            nonlocal sync_calls
            sync_calls += 1

        torch.cuda.synchronize = counting_sync  # type: ignore[assignment]
    except ImportError:
        torch = None  # type: ignore[assignment]

    gc_ns, gc_full = GC.total(), GC.full
    with tempfile.TemporaryDirectory() as tmp:
        with listening_agent(tmp) as sock:
            listening = overhead(sock, Path(tmp) / "a", steps, reps)
        absent = overhead(os.path.join(tmp, "nobody", "agent.sock"), Path(tmp) / "b", steps, reps)
        recorded = any((Path(tmp) / "b").glob("gpulse-records.*"))  # .lp before the rows lines, .rec since
    gc_after = GC.total()
    with tempfile.TemporaryDirectory() as tmp:
        hot_steps = hot(Path(tmp), scale(30, 5))

    for name, o, note in (("listening", listening, ""), ("absent", absent, f"; fallback file written: {recorded}")):
        table.add(
            f"training step overhead, agent {name} (µs/step, training thread CPU, median (range))",
            str(o.cpu),
            "the same bare loop",
            f"wall {o.wall.median:+.2f} µs/step{note}",
        )
        table.add(
            f"background thread CPU per step, agent {name} (µs/step, median (range) over repetitions)",
            str(o.background),
            "",
            f"{o.background_total:.2f} µs/step over the run's life, finish() included",
            "<= 5 µs",
        )
    table.add(
        "hot, nothing between the steps (µs/step, training thread CPU, median (range) of blocks of 1,000): gpulse's step",
        str(hot_steps.gpulse),
        f"{hot_steps.floor} the same loop on Python no-op context managers and calls",
        f"{hot_steps.ratio:.2f}x the Python floor (warm caches: the figures above pay for cold ones after each wait)",
        "<= 3.0x",
    )
    table.add(
        "hot: the training thread's minor page faults per step (memory touched for the first time)",
        f"{hot_steps.gpulse_faults:.3f}",
        f"{hot_steps.floor_faults:.3f} on the Python floor",
        "the steps' records, kept for the background thread until its tick",
    )
    measured = 2 * (reps + 1) * steps
    table.add(
        "garbage collection in this section, left out of the figures above (µs per instrumented step)",
        f"{(gc_after - gc_ns) / measured / 1000:.2f}",
        "",
        f"{GC.full - gc_full} full collections (each tens of ms with torch's objects in the heap; the bare loops make no garbage)",
    )
    table.add("torch.cuda.synchronize calls in the instrumented loops", str(sync_calls), goal="0")
    if sync_calls:
        raise RuntimeError("gpulse.training synchronised CUDA on the hot path")
    return {
        "step_overhead_us": round(listening.cpu.median, 3),
        "step_overhead_us_agent_absent": round(absent.cpu.median, 3),
        "step_background_cpu_us": round(listening.background_total, 3),
        "step_background_cpu_us_agent_absent": round(absent.background_total, 3),
        "step_hot_us": round(hot_steps.gpulse.median, 3),
        "step_hot_ratio_vs_python_floor": round(hot_steps.ratio, 3),
    }


if __name__ == "__main__":  # this section alone: python bench_step.py
    t = Table()
    print(run(t))
