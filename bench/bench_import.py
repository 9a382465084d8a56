"""7. Import: ``import gpulse.training`` time and memory vs ``import influxdb_client``.

Each import runs in a fresh interpreter (``python -X importtime``), so nothing is cached in-process.
"""

from __future__ import annotations

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
    ours_ms = median_of(lambda: _import_cost("gpulse.training")[0], reps)
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
        "<= 30 ms",
    )
    table.add("heavy modules imported by gpulse.training", heavy, goal="[]")
    return {"training_import_ms": round(ours_ms, 2)}
