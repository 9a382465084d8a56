"""History dashboard: months of GPU use from the downsampled retention policies.

Reads ``"gpulse"."1h"`` (kept forever) for per-day figures, so a year is ~9k points per GPU, and
``"gpulse"."1m"`` (400 days) for the one finer-grained graph. Downsampled gauges keep the mean
under the field's own name plus ``<field>_max``/``<field>_min``; counters keep their last value.
Each hourly point stands for one GPU-hour: the agent runs continuously, so a GPU with a point in
an hour was monitored for that hour.
"""

from __future__ import annotations

from gpulse.dashboards.builder import Dashboard, Query, table, timeseries

HOURLY = '"gpulse"."1h"'
MINUTE = '"gpulse"."1m"'
WHERE = '"host" =~ /^$host$/ AND $timeFilter'
DAILY = 'GROUP BY time(1d), "host" fill(none)'
PER_HOST = "$tag_host $col"


def build() -> Dashboard:
    d = Dashboard(
        "gpulse-history",
        "gpulse / History",
        "GPUs",
        "history",
        "Long-term GPU use per host and day from the downsampled retention policies: busy vs idle GPU-hours, "
        "SM activity, energy, throttling and training runs. Usable over a year.",
        time_from="now-30d",
        refresh="",
    )
    d.variable("host", "Host", 'SHOW TAG VALUES FROM "gpu" WITH KEY = "host"')

    d.row(
        "GPU-hours",
        timeseries(
            "Busy vs idle GPU-hours per day",
            "GPU-hours per host and day: busy = sum of hourly mean busy % / 100, idle = monitored GPU-hours minus busy.",
            Query(
                'SELECT sum("util_gpu_pct") / 100 AS "busy", count("util_gpu_pct") - sum("util_gpu_pct") / 100 AS "idle" '
                f'FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}',
                PER_HOST,
            ),
            unit="h",
            min=0,
            stacked=True,
            bars=True,
            min_interval="1d",
        ),
        timeseries(
            "SM activity per day",
            "Daily mean SM activity per host, and the highest hourly peak: the real work done, not just busy time.",
            Query(
                f'SELECT mean("sm_active_pct") AS "mean", max("sm_active_pct_max") AS "peak" FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}',
                PER_HOST,
            ),
            unit="percent",
            min=0,
            max=100,
            min_interval="1d",
        ),
    )
    d.row(
        "Energy and health",
        timeseries(
            "Energy per day (kWh)",
            "Energy per host and day: the sum of hourly mean power (W x 1 h = Wh) / 1000.",
            Query(f'SELECT sum("power_w") / 1000 AS "kWh" FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}', PER_HOST),
            unit="kwatth",
            min=0,
            bars=True,
            min_interval="1d",
            width=8,
        ),
        timeseries(
            "Throttled share per day",
            "Share of the day each host's GPUs spent with clocks held back by power, thermal or hardware reasons.",
            Query(f'SELECT mean("throttled") * 100 AS "throttled" FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}', PER_HOST),
            unit="percent",
            min=0,
            min_interval="1d",
            width=8,
        ),
        timeseries(
            "Peak memory used per day",
            "Highest GPU memory used by any GPU of the host in the day (from the hourly _max).",
            Query(f'SELECT max("mem_used_bytes_max") AS "peak" FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}', PER_HOST),
            unit="bytes",
            min=0,
            min_interval="1d",
            width=8,
        ),
    )
    d.row(
        "Recent detail",
        timeseries(
            "SM activity (1-minute resolution)",
            "Per-host SM activity from the 1-minute retention policy: mean and per-minute peak.",
            Query(
                f'SELECT mean("sm_active_pct") AS "mean", max("sm_active_pct_max") AS "peak" FROM {MINUTE}."gpu" '
                f'WHERE {WHERE} GROUP BY time($__interval), "host" fill(none)',
                PER_HOST,
            ),
            unit="percent",
            min=0,
            max=100,
            min_interval="1m",
            width=24,
        ),
    )
    d.row(
        "Training runs",
        timeseries(
            "Runs per day",
            "Training runs that logged at least one step on the day.",
            Query(
                f'SELECT count("steps") AS "runs" FROM (SELECT last("step") AS "steps" FROM {HOURLY}."train_step" '
                f'WHERE {WHERE} GROUP BY time(1d), "run" fill(none)) WHERE $timeFilter GROUP BY time(1d) fill(none)',
                "runs",
            ),
            min=0,
            bars=True,
            decimals=0,
            min_interval="1d",
            width=8,
        ),
        table(
            "Runs in range",
            "Every run in the range: last step, mean step time, MFU and tokens/s per rank (hourly means).",
            Query(
                'SELECT max("step") AS "steps", mean("step_time_s") AS "step time s", max("step_time_s_max") AS "slowest step s", '
                f'mean("mfu") AS "MFU", mean("tokens_per_s") AS "tokens/s per rank" FROM {HOURLY}."train_step" '
                f'WHERE {WHERE} GROUP BY "run"',
                table=True,
            ),
            width=16,
        ),
    )
    return d
