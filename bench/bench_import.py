"""7. Import: ``import gpulse.training`` time and memory vs ``import influxdb_client``, and its time
against ``import torch``, which every training process pays anyway (``import_ratio_vs_torch``).

Each import runs in a fresh interpreter, so nothing is cached in-process; the figures are medians
over several such runs, the two imports of a ratio taking turns.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

from common import Table, median_of, scale

_RSS = "int([l for l in open('/proc/self/status') if l.startswith('VmRSS:')][0].split()[1])/1024"
_PROBE = (
    "import time; r0={rss}; t=time.perf_counter(); import {mod}; dt=time.perf_counter()-t; print(dt*1000, {rss}-r0)"
)


def _import_cost(mod: str) -> tuple[float, float]:
    """(ms, MiB of RSS added) for importing ``mod`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(mod=mod, rss=_RSS)], capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), float(out[1])


def run(table: Table) -> dict[str, float]:
    reps = scale(7, 3)
    ours, torch = [], []
    for _ in range(reps):  # in turns: what drifts on a shared machine hits both alike
        ours.append(_import_cost("gpulse.training")[0])
        torch.append(_import_cost("torch")[0])
    ours_ms, torch_ms = statistics.median(ours), statistics.median(torch)
    theirs_ms = median_of(lambda: _import_cost("influxdb_client")[0], reps)
    ours_mib = _import_cost("gpulse.training")[1]
    theirs_mib = _import_cost("influxdb_client")[1]
    # What the training library must never drag into a training process.
    heavy = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, gpulse.training; print(sorted(m for m in ('torch','influxdb_client','numpy','gpulse.lineprotocol.encode') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    table.add(
        "import gpulse.training, ms",
        f"{ours_ms:.1f} ms (+{ours_mib:.1f} MiB)",
        f"{theirs_ms:.1f} ms (+{theirs_mib:.1f} MiB) import influxdb_client",
        f"{theirs_ms / ours_ms:.1f}x faster",
    )
    table.add(
        "import gpulse.training against import torch (median ms of each, fresh interpreters)",
        f"{ours_ms / torch_ms:.4f}",
        f"{torch_ms:.1f} ms import torch",
        f"{ours_ms:.1f} ms import gpulse.training",
        "<= 0.03",
    )
    table.add("heavy modules imported by gpulse.training", heavy, goal="[]")
    return {"training_import_ms": round(ours_ms, 2), "import_ratio_vs_torch": round(ours_ms / torch_ms, 4)}
