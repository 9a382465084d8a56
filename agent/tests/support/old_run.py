"""A training run older than raw retention, as a gpulse database holds it: in the 1m tier only.

InfluxDB refuses points older than a retention policy's duration, so such a run cannot be written
to ``raw``. Its raw points go to a scratch database (``scratch``, policies ``raw`` and ``1m``), are
downsampled there by the continuous queries' own ``SELECT ... INTO``
(:func:`gpulse.influx.downsample.influxql_select`), and the result is copied into ``gpulse."1m"``:
what the continuous queries left when the run was recent.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from gpulse.influx import downsample
from gpulse.influx.tiers import TIERS
from gpulse.lineprotocol.encode import Encoder
from gpulse.report.live import FindingState, LiveFinding

NS = 1_000_000_000


def setup_v1(url: str, bucket: str = "gpulse", raw_retention: str = "30d") -> str:
    """The real ``gpulse setup --api v1`` (database, retention policies, continuous queries); the command, less the URL."""
    from support.fixtures import gpulse_cmd

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    args = ("setup", "--api", "v1", "--url", url, "--bucket", bucket, "--raw-retention", raw_retention)
    res = subprocess.run(gpulse_cmd(*args), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr + res.stdout
    return "gpulse " + " ".join(a for a in args if a != url)


def run_points(run: str, host: str, start_ns: int, steps: int) -> str:
    """Two ranks of ``run``, one step a second after ``start_ns``, their GPUs tagged with the run, their
    training processes as the agent samples them, the run's start, and a finding the agent raised for it."""
    enc = Encoder()
    lines = []
    for rank in (0, 1):
        tags = {"run": run, "host": host, "rank": str(rank)}
        step = enc.series("train_step", tags)
        gpu = enc.series("gpu", {"host": host, "gpu": str(rank), "uuid": f"GPU-{rank}", "run": run})
        proc = enc.series("host_process", {**tags, "process": "main"})
        lines.append(enc.line(enc.series("train_run", tags), {"event": "start", "status": "running"}, start_ns))
        for i in range(steps):
            t = start_ns + (i + 1) * NS
            fields = {
                "step": i, "step_time_s": 0.5 + 0.1 * rank, "data_wait_s": 0.02, "forward_s": 0.1,
                "backward_s": 0.2, "optimizer_s": 0.05, "comm_s": 0.05, "samples_per_s": 16.0,
                "tokens_per_s": 8192.0, "tflops": 150.0, "mfu": 0.3, "mem_peak_bytes": (30 + i % 3) << 30,
                "mem_reserved_bytes": 34 << 30, "alloc_retries": 0, "log_loss": 2.0,
            }  # fmt: skip
            lines.append(enc.line(step, fields, t))
            lines.append(enc.line(gpu, {"sm_active_pct": 80.0, "util_gpu_pct": 95.0}, t))
            lines.append(
                enc.line(
                    proc,
                    {
                        "cpu_pct": 97.0,
                        "running": 1.0,
                        "disk_sleep": 0.0,
                        "mem_rss_bytes": 3 << 30,
                        "mem_pss_bytes": 2 << 30,
                    },
                    t,
                )
            )
    finding = LiveFinding(run, "rank_imbalance", FindingState.RAISED, "", "rank 1 is slower", "", "", 60, 120, 0, 240)
    series = enc.series("train_finding", {"run": run, "host": host, "rule": finding.rule})
    lines.append(enc.line(series, finding.fields(), start_ns + 120 * NS))
    return "".join(line for line in lines if line)


def write_to_1m_only(influx: Any, lines: str, start_ns: int, end_ns: int) -> None:
    """``lines`` downsampled into ``gpulse."1m"`` and nowhere else in ``gpulse``."""
    influx.query('CREATE DATABASE "scratch" WITH DURATION INF NAME "raw"')
    influx.query('CREATE RETENTION POLICY "1m" ON "scratch" DURATION INF REPLICATION 1')
    influx.write(lines, db="scratch")
    for m in downsample.downsampled_measurements():
        influx.query(downsample.influxql_select(TIERS[0], m.name, "scratch", start_ns, end_ns), db="scratch")
    influx.query('SELECT * INTO "gpulse"."1m".:MEASUREMENT FROM "scratch"."1m"./.*/ GROUP BY *', db="gpulse")
    influx.query('DROP DATABASE "scratch"')
