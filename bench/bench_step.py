"""3. Training step overhead: µs that ``gpulse.training`` adds per step (step + 3 phases +
wrap_loader + one ``log``) against the same bare loop, with a real agent listening on the socket and
with the agent absent (the client then records to its fallback file).

Both loops run in one process, interleaved, so machine noise hits both alike. Each step does the
same stand-in for GPU work in both loops, a short sleep that releases the GIL as a wait on the GPU
does, so the run's background thread works when it would in real training and any GIL it takes
shows up in the wall figure. The headline figure is the training thread's CPU time,
(instrumented - bare) / steps, median over repetitions: what gpulse adds to the loop itself; the
wall-time difference and the background thread's CPU per step are printed beside it. ``torch.cuda.synchronize`` is patched to
count calls: the instrumented loop must make none (the CPU build of torch cannot report
synchronisations any other way).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Table, scale

from gpulse.training import Run

WORK_S = 0.001  # per-step stand-in for waiting on the GPU (a fast step: real ones take 0.1-10 s)


def _clocks() -> tuple[int, int, int]:
    """(wall, training-thread CPU, whole-process CPU) in ns."""
    return time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()


def _since(c0: tuple[int, int, int]) -> tuple[float, float, float]:
    c1 = _clocks()
    return tuple((b - a) / 1000 for a, b in zip(c0, c1, strict=True))  # type: ignore[return-value]


def bare(loader: list[int]) -> tuple[float, float, float]:
    c0 = _clocks()
    acc = 0
    for batch in loader:
        acc += batch
        time.sleep(WORK_S)
    return _since(c0)


def instrumented(run: Run, loader: list[int]) -> tuple[float, float, float]:
    c0 = _clocks()
    acc = 0
    for batch in run.wrap_loader(loader):
        with run.step(samples=32, tokens=32 * 2048):
            with run.phase("forward"):
                acc += batch
                time.sleep(WORK_S)
            with run.phase("backward"):
                pass
            with run.phase("optimizer"):
                pass
        run.log(loss=0.5)
    return _since(c0)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def overhead_us(socket_path: str, out: Path, steps: int, reps: int) -> dict[str, float]:
    """Median per-step overheads in µs: on the training thread's CPU, in wall time, and the CPU
    the run's background thread spends per step (sending, or recording to the fallback file)."""
    loader = list(range(steps))
    run = Run(name="bench", output_dir=out, socket_path=socket_path, write_report=False)
    cpu, wall, background = [], [], []
    for rep in range(reps + 1):
        bw, bt, bp = bare(loader)
        iw, it, ip = instrumented(run, loader)
        if rep:  # the first round warms up
            cpu.append((it - bt) / steps)
            wall.append((iw - bw) / steps)
            background.append(((ip - it) - (bp - bt)) / steps)
    run.finish()
    return {"cpu": _median(cpu), "wall": _median(wall), "background": _median(background)}


def run(table: Table) -> dict[str, float]:
    steps, reps = scale(2_000, 300), scale(7, 2)
    sync_calls = 0
    try:
        import torch

        def counting_sync(*_a: object, **_k: object) -> None:
            nonlocal sync_calls
            sync_calls += 1

        torch.cuda.synchronize = counting_sync  # type: ignore[assignment]
    except ImportError:
        torch = None  # type: ignore[assignment]

    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "run", "agent.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpulse", "agent", "--simulate", "1", "--interval", "1",
             "--record", os.path.join(tmp, "agent.lp"), "--socket", sock, "--spool-dir", os.path.join(tmp, "spool")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(sock) and time.monotonic() < deadline:
                time.sleep(0.05)
            listening = overhead_us(sock, Path(tmp) / "a", steps, reps)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
        absent = overhead_us(os.path.join(tmp, "nobody", "agent.sock"), Path(tmp) / "b", steps, reps)
        recorded = (Path(tmp) / "b" / "gpulse-records.lp").exists()

    for name, o, note in (("listening", listening, ""), ("absent", absent, f"; fallback file written: {recorded}")):
        table.add(
            f"training step overhead, agent {name} (µs/step, training thread CPU)",
            f"{o['cpu']:.2f}",
            "the same bare loop",
            f"wall {o['wall']:+.2f} µs/step, background thread {o['background']:.2f} µs CPU/step{note}",
            "<= 5 µs",
        )
    table.add("torch.cuda.synchronize calls in the instrumented loops", str(sync_calls), goal="0")
    if sync_calls:
        raise RuntimeError("gpulse.training synchronised CUDA on the hot path")
    return {"step_overhead_us": round(listening["cpu"], 3), "step_overhead_us_agent_absent": round(absent["cpu"], 3)}
