"""The disk spool alone: append + fsync per batch, and replay (peek + ack), wall and CPU time.

Run alone: ``.venv/bin/python bench/bench_spool.py [strategy ...]`` (default: every strategy the
delivery package has). Each figure is the median of 5 runs after a warm-up, on a fresh directory
under ``$TMPDIR`` (the disk the agent's spool would be on matters: fsync dominates appends).
Batches are agent-like: ``gpu`` lines of about 300 bytes, 100 lines (a 1 Hz flush of a busy node)
and 2,000 lines (a backlog cut by the 4 MiB/5,000-line limits).
"""

from __future__ import annotations

import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

#: name -> (module, class); the SQLite WAL prototype measured against it: BENCHMARKS.md, "Spool: segments or SQLite"
STRATEGIES = {"segments": ("gpulse.delivery.spool", "Spool")}
REPEATS = 5
LINE = (
    "gpu,gpu=3,host=node-017,model=NVIDIA\\ H100\\ 80GB\\ HBM3,uuid=GPU-8f0e1c2a-5b7d-4e3f-9a61-0c2d4e6f8a1b "
    "util_gpu_pct=87.0,util_mem_pct=41.0,mem_used_mib=61234i,mem_total_mib=81559i,power_w=612.5,"
    "temp_gpu_c=71i,temp_mem_c=78i,sm_clock_mhz=1980i,mem_clock_mhz=2619i,energy_j=123456789.0 {ts}\n"
)


def lines(n: int, start: int) -> list[str]:
    return [LINE.format(ts=1_700_000_000_000_000_000 + start + i) for i in range(n)]


def available() -> dict[str, type]:
    out = {}
    for name, (module, cls) in STRATEGIES.items():
        try:
            out[name] = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            pass
    return out


def one_run(cls: type, batch_lines: int, batches: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="gpulse-bench-spool-"))
    try:
        spool = cls(root / "sp", max_bytes=1 << 30)
        data = [lines(batch_lines, k * batch_lines) for k in range(batches)]
        w0, c0 = time.perf_counter(), time.process_time()
        for k, b in enumerate(data):
            spool.append(b, epoch=1, end_ticket=(k + 1) * batch_lines)
        w1, c1 = time.perf_counter(), time.process_time()
        spool.close()
        spool = cls(root / "sp", max_bytes=1 << 30)  # replay after a restart, as the agent does
        w2, c2 = time.perf_counter(), time.process_time()
        n = 0
        while (rec := spool.peek()) is not None:
            n += len(rec.lines)
            spool.ack(rec.segment, rec.offset)
        w3, c3 = time.perf_counter(), time.process_time()
        spool.close()
        assert n == batch_lines * batches, n
        return {
            "append_ms": (w1 - w0) / batches * 1000,
            "append_cpu_ms": (c1 - c0) / batches * 1000,
            "replay_lines_per_s": n / (w3 - w2),
            "replay_cpu_us_per_line": (c3 - c2) / n * 1e6,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(names: list[str]) -> None:
    classes = available()
    names = names or list(classes)
    print(
        f"spool benchmark: median of {REPEATS} runs (strategies interleaved), directory under {tempfile.gettempdir()}"
    )
    print(
        f"{'strategy':<10} {'batch':>6} {'append ms':>10} {'append CPU ms':>14} {'replay lines/s':>15} {'replay CPU us/line':>19}"
    )
    for batch_lines, batches in ((100, 200), (2000, 20)):
        for name in names:
            one_run(classes[name], batch_lines, batches)  # warm-up
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for _ in range(REPEATS):  # interleaved: a loaded machine's slow moments hit every strategy alike
            for name in names:
                runs[name].append(one_run(classes[name], batch_lines, batches))
        for name in names:
            r = {k: statistics.median(run[k] for run in runs[name]) for k in runs[name][0]}
            print(
                f"{name:<10} {batch_lines:>6} {r['append_ms']:>10.2f} {r['append_cpu_ms']:>14.3f} "
                f"{r['replay_lines_per_s']:>15,.0f} {r['replay_cpu_us_per_line']:>19.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
