"""5. End to end: lines/s the agent's delivery path puts into a real InfluxDB 1.x on loopback, vs the
database's own limit on this machine: the same line protocol, pre-encoded and gzipped in the same
batch sizes, posted by a bare keep-alive HTTP client.

The agent path is the production one: ``Delivery`` (batching by lines/bytes, gzip, retry policy,
spool directory present) over the v1 sink. Each repetition writes into a fresh database, and the
two contenders alternate, so neither profits from the other's warm shards.
"""

from __future__ import annotations

import gzip
import http.client
import tempfile
import time
from pathlib import Path

from common import Table, scale
from support.influxd import InfluxDB1

from gpulse.delivery.pipeline import Delivery
from gpulse.lineprotocol.encode import Encoder
from gpulse.sinks.influx_v1 import InfluxV1Sink
from gpulse.sources.simulated import SimulatedSource

BATCH_LINES = 5000


def make_lines(n_cycles: int) -> list[str]:
    src = SimulatedSource(8, model="H100", seed=3)
    gpus = src.open()
    enc = Encoder()
    series = {
        g.index: enc.series("gpu", {"host": "bench", "gpu": str(g.index), "uuid": g.uuid, "model": g.model})
        for g in gpus
    }
    t0 = 1_764_000_000_000_000_000
    out: list[str] = []
    for c in range(n_cycles):
        for r in src.collect(t0 + c * 100_000_000):
            if r.measurement == "gpu":
                line = enc.line(series[r.gpu], r.fields, r.ts_ns)
                if line:
                    out.append(line)
    src.close()
    return out


def agent_path(server: InfluxDB1, db: str, lines: list[str], spool: Path) -> float:
    sink = InfluxV1Sink(server.url, db)
    d = Delivery([sink], spool_dir=spool, max_lines=BATCH_LINES)  # the agent's defaults: 1 s flush interval
    d.start()
    t = time.perf_counter()
    for i in range(0, len(lines), 1000):  # the agent submits a cycle's worth at a time
        d.submit(lines[i : i + 1000])
    ok = d.flush(timeout=300)
    dt = time.perf_counter() - t
    stats = d.stats()
    d.close(timeout=10)
    if not ok or stats["lines_written"] != len(lines):
        raise RuntimeError(f"agent path did not deliver everything: {stats}")
    return len(lines) / dt


def bulk_post(server: InfluxDB1, db: str, lines: list[str]) -> float:
    bodies = [gzip.compress("".join(lines[i : i + BATCH_LINES]).encode(), 1) for i in range(0, len(lines), BATCH_LINES)]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Content-Encoding": "gzip", "Content-Type": "text/plain; charset=utf-8"}
    t = time.perf_counter()
    for body in bodies:
        conn.request("POST", f"/write?db={db}&precision=n", body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        if r.status != 204:
            raise RuntimeError(f"bulk post answered {r.status}")
    dt = time.perf_counter() - t
    conn.close()
    return len(lines) / dt


def run(table: Table) -> dict[str, float]:
    lines = make_lines(scale(6000, 600))  # x8 GPUs
    reps = scale(3, 1)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        server = InfluxDB1(Path(tmp) / "influxd").start()
        try:
            for rep in range(reps + 1):  # the first round warms the server up and is not counted
                for name in (f"a{rep}", f"b{rep}"):
                    server.create_database(name)
                if rep % 2:
                    b = bulk_post(server, f"b{rep}", lines)
                    a = agent_path(server, f"a{rep}", lines, Path(tmp) / f"spool{rep}")
                else:
                    a = agent_path(server, f"a{rep}", lines, Path(tmp) / f"spool{rep}")
                    b = bulk_post(server, f"b{rep}", lines)
                if rep:
                    ours.append(a)
                    theirs.append(b)
            written = server.count("gpu", "util_gpu_pct", db=f"a{reps}")
        finally:
            server.stop()
    ours_m, theirs_m = sorted(ours)[len(ours) // 2], sorted(theirs)[len(theirs) // 2]
    ratio = ours_m / theirs_m
    table.add(
        f"end to end into InfluxDB 1.x, lines/s ({len(lines):,} lines, {written:,} read back)",
        f"{ours_m:,.0f}",
        f"{theirs_m:,.0f} (bare HTTP, pre-gzipped)",
        f"{ratio:.2f}",
        ">= 0.8",
    )
    return {"e2e_ratio_vs_bulk_post": round(ratio, 3)}
