"""The demo's host beside the GPUs: the node's ``host`` points and the run's ``host_process`` points
(each rank's training process and its DataLoader workers), over the demo's timeline.

They tell the same story as the GPUs and the steps (:mod:`gpulse.cli.demo`): while the data-loading
bottleneck lasts, the workers are CPU-bound (on a CPU all the time, near a full core each) on a node
with cores to spare, which is what the report's data-loading finding then says. The points are built
from the agent's own typed readings (:mod:`gpulse.sources.host`), so they carry what the agent writes.
"""

from __future__ import annotations

import random

from gpulse.lineprotocol.encode import Encoder
from gpulse.sources.host import DISK_SLEEP, RUNNING, NodeReading, ProcessReading
from gpulse.sources.scenario import DEMO_HOST, NS, Timeline

CPUS = 96
WORKERS = 2  # DataLoader workers per rank
MEM_TOTAL = 2048 << 30
#: the training processes' pids, as the demo's train_run points give them (4100 + rank)
PID_BASE = 4100


def host_lines(
    tl: Timeline,
    run: str,
    *,
    host: str = DEMO_HOST,
    seed: int = 0,
    interval_s: float = 30.0,
    encoder: Encoder | None = None,
) -> list[str]:
    """``host`` points over the window and ``host_process`` points while the run ran, every ``interval_s``."""
    enc = encoder or Encoder()
    rng = random.Random(f"{seed}-host")
    node = enc.series("host", {"host": host})
    step = int(interval_s * NS)
    lines: list[str] = []
    t = tl.start_ns - tl.start_ns % step + step
    while t <= tl.end_ns:
        readings = _processes(tl, t, run, rng) if tl.in_run(t) else []
        busy_cores = sum((r.cpu_pct or 0.0) for r in readings) / 100 + rng.uniform(0.5, 1.5)
        busy = 100 * busy_cores / CPUS
        iowait = rng.uniform(0.0, 0.5)
        reading = NodeReading(
            cpus=CPUS,
            mem_total_bytes=MEM_TOTAL,
            mem_available_bytes=MEM_TOTAL - (400 << 30 if readings else 20 << 30) - rng.randrange(1 << 30),
            swap_used_bytes=0,
            cpu_busy_pct=busy,
            cpu_idle_pct=100 - busy - iowait,
            cpu_iowait_pct=iowait,
            cpu_steal_pct=0.0,
            swap_in_bytes_per_s=0.0,
            swap_out_bytes_per_s=0.0,
            disk_read_bytes_per_s=sum(r.read_bytes_per_s or 0.0 for r in readings),
            disk_write_bytes_per_s=rng.uniform(0, 2e6) + (4e9 / interval_s if _checkpointing(tl, t, step) else 0.0),
            disk_busy_pct=rng.uniform(1, 8),
            net_recv_bytes_per_s=rng.uniform(1e5, 1e6),
            net_sent_bytes_per_s=rng.uniform(1e5, 1e6),
        )
        lines.append(enc.line(node, reading.fields(), t) or "")
        for r in readings:
            series = enc.series("host_process", {"host": host, **r.tags})
            lines.append(enc.line(series, r.fields(), t) or "")
        t += step
    return [line for line in lines if line]


def _checkpointing(tl: Timeline, t: int, step: int) -> bool:
    return any(c <= t < c + step for c in tl.checkpoints_ns)


def _processes(tl: Timeline, t: int, run: str, rng: random.Random) -> list[ProcessReading]:
    """Each rank's training process and workers at ``t``: busy workers while the loader cannot keep up."""
    starved = tl.starved(t)
    out = []
    for rank in range(tl.gpus):
        pid = PID_BASE + rank
        out.append(
            ProcessReading(
                run, str(rank), "main", pid, RUNNING if rng.random() < 0.9 else "sleeping",
                cpu_pct=rng.uniform(95, 110), mem_rss_bytes=(38 << 30) + rng.randrange(1 << 30),
                mem_pss_bytes=(36 << 30) + rng.randrange(1 << 30), read_bytes_per_s=0.0, write_bytes_per_s=0.0,
                read_chars_per_s=rng.uniform(0, 1e6), threads=64, workers=WORKERS,
            )
        )  # fmt: skip
        for w in range(WORKERS):
            busy = rng.random() < (0.97 if starved else 0.55)
            state = RUNNING if busy else (DISK_SLEEP if rng.random() < 0.05 else "sleeping")
            out.append(
                ProcessReading(
                    run, str(rank), f"worker{w}", pid + 1000 * (w + 1), state,
                    cpu_pct=rng.uniform(90, 99) if starved else rng.uniform(40, 65),
                    mem_rss_bytes=(6 << 30) + rng.randrange(1 << 29), mem_pss_bytes=(1 << 30) + rng.randrange(1 << 28),
                    read_bytes_per_s=rng.uniform(20e6, 40e6), write_bytes_per_s=0.0,
                    read_chars_per_s=rng.uniform(40e6, 80e6), threads=4,
                )
            )  # fmt: skip
    return out
