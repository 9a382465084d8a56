"""History dashboard: months of GPU use from the downsampled retention policies.

Reads ``"1h"`` (kept forever) for per-day figures, so a year is ~9k points per GPU, and ``"1m"``
(400 days) for the one finer-grained graph; ``$host`` comes from ``"1h"`` too, so a host that went
away months ago still has its year. Downsampled gauges keep the mean under the field's own name
plus ``<field>_max``/``<field>_min``; counters keep their last value. Each hourly point stands for
one GPU-hour: the agent runs continuously, so a GPU with a point in an hour was monitored for that
hour.

Each query goes to its tier's datasource (``tier=``): on InfluxDB 3, which ignores ``"1h"`` in a
query, that datasource's database is the tier (:mod:`.datasources`); ``$host`` is listed over the
range, since 3.x's ``SHOW TAG VALUES`` sees only its last day otherwise.

Days are InfluxQL's ``time(1d)`` buckets, which start at midnight UTC, so the dashboard's time zone
is UTC as well: a bar labelled with a date holds exactly that UTC day.
"""

from __future__ import annotations

from gpulse.dashboards import training
from gpulse.dashboards.builder import Column, Dashboard, Link, Panel, Query, Variable, organize, table, timeseries
from gpulse.dashboards.units import (
    BYTES,
    COUNT,
    GPU_HOURS,
    ID,
    KWH,
    PERCENT,
    RATIO,
    SECONDS,
    THROTTLED,
    TOKENS_PER_S,
)

UID = "gpulse-history"
HOURLY = '"1h"'
MINUTE = '"1m"'
WHERE = '"host" =~ /^$host$/ AND $timeFilter'
DAILY = 'GROUP BY time(1d), "host" fill(none)'
PER_HOST = "$tag_host $col"
OPEN_RUN = Link(
    "Open this run on the Training run dashboard",
    training.UID,
    (("run", "${__value.raw}"),),
)


#: What each "GPU-hours per" table is grouped by, after the tag it is named by.
GPU_HOURS_BY = {"job": ("job", "job_user", "account"), "job_user": ("job_user",), "account": ("account",)}
GPU_HOURS_TITLES = {"job": "GPU-hours per job", "job_user": "GPU-hours per user", "account": "GPU-hours per account"}


def _gpu_hours_by(tag: str, who: str, width: int) -> Panel:
    """GPU-hours (and busy GPU-hours) over the range per value of ``tag``, from the job tags of hourly ``gpu`` points.

    Each hourly point of a GPU a job held is one GPU-hour of that job; GPUs no job held are left out."""
    tags = GPU_HOURS_BY[tag]
    return table(
        GPU_HOURS_TITLES[tag],
        "GPU-hours the GPUs held over the range (an hourly point of a GPU is one GPU-hour of the job holding it), "
        f"and the busy share of them (sum of hourly mean busy % / 100). {who} GPUs no job held are left out.",
        Query(
            'SELECT count("util_gpu_pct") AS "GPU-hours", sum("util_gpu_pct") / 100 AS "busy GPU-hours" '
            f'FROM {HOURLY}."gpu" WHERE "{tag}" =~ /.+/ AND {WHERE} GROUP BY ' + ", ".join(f'"{t}"' for t in tags),
            table=True,
            tier="1h",
        ),
        columns=(Column("GPU-hours", GPU_HOURS), Column("busy GPU-hours", GPU_HOURS)),
        transformations=[
            organize(exclude=("Time",), order=tags),
            {"id": "sortBy", "options": {"sort": [{"field": "GPU-hours", "desc": True}]}},
        ],
        width=width,
    )


def build() -> Dashboard:
    d = Dashboard(
        UID,
        "gpulse / History",
        "GPUs",
        "history",
        "Long-term GPU use per host and UTC day from the downsampled retention policies: busy vs idle "
        "GPU-hours, SM activity, energy, throttling and training runs. Usable over a year.",
        time_from="now-30d",
        refresh="",
        timezone="utc",
    )
    d.variable(
        Variable("host", "Host", f'SHOW TAG VALUES FROM {HOURLY}."gpu" WITH KEY = "host" WHERE $timeFilter', tier="1h")
    )

    d.row(
        "GPU-hours",
        timeseries(
            "Busy vs idle GPU-hours per day",
            "GPU-hours per host and UTC day: busy = sum of hourly mean busy % / 100, idle = monitored GPU-hours "
            "minus busy.",
            Query(
                'SELECT sum("util_gpu_pct") / 100 AS "busy", count("util_gpu_pct") - sum("util_gpu_pct") / 100 AS "idle" '
                f'FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}',
                GPU_HOURS,
                PER_HOST,
                tier="1h",
            ),
            min=0,
            stacked=True,
            bars=True,
            interval="1d",
            legend="wide",
        ),
        timeseries(
            "SM activity per day",
            "Mean SM activity per host and UTC day, and the highest hourly peak: the real work done, not just busy time.",
            Query(
                f'SELECT mean("sm_active_pct") AS "mean", max("sm_active_pct_max") AS "peak" FROM {HOURLY}."gpu" '
                f"WHERE {WHERE} {DAILY}",
                PERCENT,
                PER_HOST,
                tier="1h",
            ),
            min=0,
            max=100,
            interval="1d",
            legend="wide",
        ),
    )
    d.row(
        "GPU-hours per job",
        _gpu_hours_by("job", "Job is the Slurm job id or the pod UID, with its Slurm user and account.", width=12),
        _gpu_hours_by("job_user", "User is the Slurm job's user (pods have none).", width=6),
        _gpu_hours_by("account", "Account is the Slurm job's account (pods have none).", width=6),
    )
    d.row(
        "Energy and health",
        timeseries(
            "Energy per day",
            "Energy per host and UTC day: the sum of hourly mean power (W x 1 h = Wh) / 1000.",
            Query(
                f'SELECT sum("power_w") / 1000 AS "energy" FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}',
                KWH,
                PER_HOST,
                tier="1h",
            ),
            min=0,
            bars=True,
            interval="1d",
            width=8,
            legend="wide",
        ),
        timeseries(
            "Throttled share per day",
            "Share of the UTC day each host's GPUs spent with clocks held back by power, thermal or hardware reasons "
            "(dashed lines at 5 % and 20 %).",
            Query(
                f'SELECT mean("throttled") * 100 AS "throttled" FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}',
                PERCENT,
                PER_HOST,
                tier="1h",
            ),
            min=0,
            thresholds=THROTTLED,
            interval="1d",
            width=8,
            legend="wide",
        ),
        timeseries(
            "Peak memory used per day",
            "Highest GPU memory used by any GPU of the host in the UTC day (from the hourly _max).",
            Query(
                f'SELECT max("mem_used_bytes_max") AS "peak" FROM {HOURLY}."gpu" WHERE {WHERE} {DAILY}',
                BYTES,
                PER_HOST,
                tier="1h",
            ),
            min=0,
            interval="1d",
            width=8,
            legend="wide",
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
                PERCENT,
                PER_HOST,
                tier="1m",
            ),
            min=0,
            max=100,
            interval="1m",
            width=24,
            legend="wide",
        ),
    )
    d.row(
        "Training runs",
        timeseries(
            "Runs per day",
            "Training runs that logged at least one step on the UTC day.",
            Query(
                f'SELECT count("steps") AS "runs" FROM (SELECT last("step") AS "steps" FROM {HOURLY}."train_step" '
                f'WHERE {WHERE} GROUP BY time(1d), "run" fill(none)) WHERE $timeFilter GROUP BY time(1d) fill(none)',
                COUNT,
                "runs",
                tier="1h",
            ),
            min=0,
            bars=True,
            interval="1d",
            width=8,
            legend="wide",
        ),
        table(
            "Runs in range",
            "Every run in the range: last step, mean and slowest step time, MFU and tokens/s per rank (hourly "
            "means). Click a run to open it on the Training run dashboard.",
            Query(
                'SELECT max("step") AS "steps", mean("step_time_s") AS "step time", max("step_time_s_max") AS "slowest step", '
                f'mean("mfu") AS "MFU", mean("tokens_per_s") AS "tokens/s per rank" FROM {HOURLY}."train_step" '
                f'WHERE {WHERE} GROUP BY "run"',
                table=True,
                tier="1h",
            ),
            columns=(
                Column("steps", ID),
                Column("step time", SECONDS),
                Column("slowest step", SECONDS),
                Column("MFU", RATIO, training.MFU),
                Column("tokens/s per rank", TOKENS_PER_S),
            ),
            transformations=[organize(exclude=("Time",))],
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "run"},
                    "properties": [{"id": "links", "value": [OPEN_RUN.to_json()]}],
                }
            ],
            width=16,
        ),
    )
    return d
