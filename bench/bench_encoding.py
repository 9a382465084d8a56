"""1. Encoding: gpulse's encoder vs influxdb-client's Point.to_line_protocol on the same data.

Data: 8 GPUs x the full ``gpu`` field set per cycle (every tier due), as the simulated H100
node reports it (the same value shapes NVML gives: ints, short decimals, byte counts).
"""

from __future__ import annotations

import time

from common import Table, median_of, scale

from gpulse.lineprotocol.encode import Encoder
from gpulse.sources.simulated import SimulatedSource


def node_cycles(n: int) -> list[list[dict[str, object]]]:
    """``n`` cycles of 8 GPUs' ``gpu`` fields, each taken a minute apart so every tier is due."""
    src = SimulatedSource(8, model="H100", seed=5)
    src.open()
    t0 = 1_764_000_000_000_000_000
    cycles = []
    for c in range(n):
        readings = [r for r in src.collect(t0 + c * 60_000_000_000) if r.measurement == "gpu"]
        cycles.append([r.fields for r in sorted(readings, key=lambda r: r.gpu)])
    src.close()
    return cycles


def run(table: Table) -> dict[str, float]:
    tags = [
        {"host": "node-01", "gpu": str(i), "uuid": f"GPU-{i:08x}-1111-2222", "model": "NVIDIA H100 80GB HBM3"}
        for i in range(8)
    ]
    cycles = node_cycles(50)
    n_fields = len(cycles[0][0])
    assert n_fields >= 45, n_fields
    ts0 = 1_764_000_000_000_000_000
    n_gp, n_cl = scale(40, 4), scale(4, 1)

    enc = Encoder()
    series = [enc.series("gpu", t) for t in tags]

    def gpulse_once() -> float:
        line = enc.line
        t = time.perf_counter()
        for rep in range(n_gp):
            for c, per_gpu in enumerate(cycles):
                ts = ts0 + (rep * 50 + c) * 1_000_000
                for s, fields in zip(series, per_gpu, strict=True):
                    line(s, fields, ts)
        return n_gp * 50 * 8 / (time.perf_counter() - t)

    from influxdb_client import Point, WritePrecision

    def client_once() -> float:
        t = time.perf_counter()
        for rep in range(n_cl):
            for c, per_gpu in enumerate(cycles):
                ts = ts0 + (rep * 50 + c) * 1_000_000
                for tg, fields in zip(tags, per_gpu, strict=True):
                    p = Point("gpu")
                    for k, v in tg.items():
                        p.tag(k, v)
                    for k, v in fields.items():
                        p.field(k, v)
                    p.time(ts, WritePrecision.NS)
                    p.to_line_protocol()
        return n_cl * 50 * 8 / (time.perf_counter() - t)

    # Same output? (modulo field order and float formatting of integral floats)
    ours = enc.line(series[0], cycles[0][0], ts0)
    assert (
        ours is not None
        and ours.split(" ")[0]
        == Point("gpu")
        .tag("host", "node-01")
        .tag("gpu", "0")
        .tag("model", "NVIDIA H100 80GB HBM3")
        .tag("uuid", "GPU-00000000-1111-2222")
        .field("x", 1)
        .to_line_protocol()
        .split(" ")[0]
    )

    reps = scale(5, 2)
    ours_lps = median_of(gpulse_once, reps)
    theirs_lps = median_of(client_once, reps)
    speedup = ours_lps / theirs_lps
    table.add(
        f"encoding, lines/s (8 GPUs x full gpu field set, {n_fields} fields)",
        f"{ours_lps:,.0f}",
        f"{theirs_lps:,.0f} (influxdb-client Point)",
        f"{speedup:.1f}x",
        ">= 5x",
    )
    return {"encoder_speedup": round(speedup, 2)}
