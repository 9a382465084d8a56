"""What the downsampling's look-back costs the server: one 1m-tier run over 10 min, 1 h and 6 h of raw points.

Every run of the 1m tier re-aggregates its look-back (6 h), not only the 10 minutes since the last
run, so that late points are folded in (``influxdb/README.md``). This measures one run of the 1m
tier's continuous queries (the same ``SELECT ... INTO`` ``gpulse recompute --api v1`` runs) on a real
InfluxDB 1.x over one 8-GPU node sampled every second, for a look-back of 10 min (what a run would
read without one), 1 h and 6 h. InfluxDB 2.x runs the same aggregation in Flux on the same storage
engine; its times differ, the amount read is the same.

    cd bench && ../.venv/bin/python bench_lookback.py        # BENCH_QUICK=1: 1 GPU, 1 h of data
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from common import QUICK, Table, median_of, scale, timed
from support.influxd import InfluxDB1

from gpulse.influx.connection import Connection
from gpulse.influx.downsample import TIERS, downsampled_measurements, influxql_select, parse_duration
from gpulse.influx.query import InfluxQL
from gpulse.influx.setup.v1 import setup_v1
from gpulse.lineprotocol.encode import Encoder
from gpulse.schema import MEASUREMENTS

MINUTE = 60 * 10**9


def gpu_lines(end_ns: int, hours: float, gpus: int) -> list[str]:
    """One sample per second and GPU with every field of the gpu measurement the schema downsamples."""
    enc, rnd = Encoder(), random.Random(0)
    fields = [f for f in MEASUREMENTS["gpu"].fields if f.downsample]
    series = [
        enc.series("gpu", {"host": "node1", "gpu": str(g), "uuid": f"GPU-{g}", "model": "H100"}) for g in range(gpus)
    ]
    lines = []
    start = end_ns - int(hours * 3600) * 10**9
    for ts in range(start, end_ns, 10**9):
        for s in series:
            values = {f.name: (rnd.randrange(10**9) if f.type == "int" else rnd.random() * 100) for f in fields}
            lines.append(enc.line(s, values, ts))
    return lines


def run(table: Table) -> dict[str, float]:
    gpus, hours = (1, 1.0) if QUICK else (8, 6.0)
    lookbacks = ["10m", "1h"] if QUICK else ["10m", "1h", TIERS[0].lookback]
    fields = sum(1 for f in MEASUREMENTS["gpu"].fields if f.downsample)
    with tempfile.TemporaryDirectory() as tmp:
        server = InfluxDB1(Path(tmp)).start()
        try:
            conn = Connection(url=server.url, api="v1", bucket="gpulse")
            setup_v1(conn)
            end = time.time_ns() // MINUTE * MINUTE
            lines = gpu_lines(end, hours, gpus)
            for i in range(0, len(lines), 5000):
                server.write("".join(lines[i : i + 5000]))
            ql = InfluxQL(conn)
            seconds = {
                lb: median_of(lambda lb=lb: timed(lambda: _minute_tier(ql, end - parse_duration(lb), end)), scale(3, 1))
                for lb in lookbacks
            }
            ql.close()
        finally:
            server.stop()
    base = seconds["10m"]
    for lb in lookbacks:
        values = gpus * parse_duration(lb) // 10**9 * fields
        name = f"1m-tier run, look-back {lb} ({values / 1e6:.2f} M values, {gpus} GPUs at 1 s)"
        table.add(name, f"{seconds[lb]:.2f} s", f"{base:.2f} s (10m)", f"{seconds[lb] / base:.1f}x")
    return {f"lookback_run_s_{lb}": v for lb, v in seconds.items()}


def _minute_tier(ql: InfluxQL, start: int, end: int) -> None:
    """One run of the 1m tier's continuous queries over ``[start, end)``: their own SELECT ... INTO."""
    for m in downsampled_measurements():
        ql.rows(influxql_select(TIERS[0], m.name, "gpulse", start, end), db="")


if __name__ == "__main__":
    t = Table()
    print(run(t))
    print(t.render())
