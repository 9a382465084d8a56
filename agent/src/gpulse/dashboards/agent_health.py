"""Agent-health dashboard: is every node's agent sampling, delivering and keeping up?

Counters in ``agent`` count since the agent started, so rates use ``non_negative_derivative`` /
``non_negative_difference`` (a restart resets them to zero and is skipped, not shown as negative).

Liveness does not follow the time picker: a host whose agent died must turn red, not vanish from
a range that no longer holds its points. Its panels look at the last ``LIVENESS_WINDOW`` of health
points, count each host's reports per minute (``fill(0)`` makes the silent minutes zeros), and
call a host silent when its last three minutes hold none; the agent reports every 10 s.
"""

from __future__ import annotations

from gpulse.dashboards.builder import Column, Dashboard, Query, Variable, join, organize, stat, table, timeseries
from gpulse.dashboards.units import (
    BYTES,
    COUNT,
    LINES_PER_S,
    MILLISECONDS,
    RECORDS_PER_S,
    SECONDS,
    TIME_AGO,
    any_is_bad,
    none_is_bad,
    rising,
)
from gpulse.schema import NVML_ERROR_KINDS

UID = "gpulse-agent-health"
WHERE = '"host" =~ /^$host$/ AND $timeFilter'
BY_HOST = 'GROUP BY time($__interval), "host" fill(none)'
PER_HOST = "$tag_host $col"
#: How far back liveness looks for hosts: within the raw retention, independent of the picker.
LIVENESS_WINDOW = "7d"
RECENT = "reports in the last 3 min"


def recent_reports(alias: str = RECENT) -> str:
    """Reports per host in the last three minutes, for every host seen in LIVENESS_WINDOW (0 when silent).

    The per-minute counts are ``fill(0)``-ed over the whole window and only the last three are
    summed (``moving_average`` x 3): an outer time condition would be pushed into the subquery,
    and a host without points in the last minutes would then have no series at all, not zeros.
    """
    return (
        f'SELECT last("m") * 3 AS "{alias}" FROM (SELECT moving_average(count("uptime_s"), 3) AS "m" FROM "agent" '
        f'WHERE "host" =~ /^$host$/ AND time > now() - {LIVENESS_WINDOW} GROUP BY time(1m), "host" fill(0)) '
        'GROUP BY "host"'
    )


#: Hosts with no report in the last three minutes: all hosts minus those with at least one
#: (``ceil(r / 1e6)`` is 1 for any r of 1 or more), so the count is 0, not empty, when all report.
SILENT_AGENTS = (
    f'SELECT count("r") - sum("alive") FROM (SELECT "r", ceil("r" / 1000000) AS "alive" FROM ({recent_reports("r")}))'
)


def _rates(*cols: tuple[str, str]) -> Query:
    sel = ", ".join(f'non_negative_derivative(last("{f}"), 1s) AS "{name}"' for f, name in cols)
    return Query(f'SELECT {sel} FROM "agent" WHERE {WHERE} {BY_HOST}', LINES_PER_S, PER_HOST)


def _increments(*cols: tuple[str, str]) -> Query:
    sel = ", ".join(f'non_negative_difference(last("{f}")) AS "{name}"' for f, name in cols)
    return Query(f'SELECT {sel} FROM "agent" WHERE {WHERE} {BY_HOST}', COUNT, PER_HOST)


def build() -> Dashboard:
    d = Dashboard(
        UID,
        "gpulse / Agent health",
        "Agent",
        "agent-health",
        "The gpulse agent on each host: whether it still reports, delivery (written, spooled, dropped), spool, "
        "write latency, sampling cycles and NVML errors.",
        time_from="now-6h",
        refresh="10s",
    )
    d.variable(
        Variable(
            "host", "Host", f'SHOW TAG VALUES FROM "agent" WITH KEY = "host" WHERE time > now() - {LIVENESS_WINDOW}'
        )
    )

    d.row(
        "Liveness",
        stat(
            "Silent agents",
            f"Hosts seen in the last {LIVENESS_WINDOW} whose agent sent no health point in the last 3 minutes "
            "(it sends one every 10 s): red from 1. Independent of the time picker.",
            Query(SILENT_AGENTS, COUNT),
            thresholds=any_is_bad(),
            no_value="0",
            width=4,
            height=6,
        ),
        table(
            "Agents",
            f"Every host seen in the last {LIVENESS_WINDOW}: when its agent last reported, how many reports the "
            "last 3 minutes hold (red at 0: down, or it cannot reach InfluxDB), uptime and GPUs. Independent "
            "of the time picker, so a dead host stays listed, in red.",
            Query(
                f'SELECT last("uptime_s") AS "uptime" FROM "agent" WHERE "host" =~ /^$host$/ AND time > now() - {LIVENESS_WINDOW} '
                'GROUP BY "host"',
                table=True,
            ),
            Query(recent_reports(), table=True),
            Query(
                'SELECT last("gpus") AS "GPUs", last("gpus_lost") AS "GPUs lost" FROM "agent" '
                f'WHERE "host" =~ /^$host$/ AND time > now() - {LIVENESS_WINDOW} GROUP BY "host"',
                table=True,
            ),
            columns=(
                Column("last report", TIME_AGO),
                Column(RECENT, COUNT, none_is_bad(), cell="color-background"),
                Column("uptime", SECONDS),
                Column("GPUs", COUNT),
                Column("GPUs lost", COUNT, any_is_bad(), cell="color-background"),
            ),
            transformations=[
                organize(only="A", rename={"Time": "last report"}),
                organize(only="B", exclude=("Time",)),
                organize(only="C", exclude=("Time",)),
                join("host"),
                organize(order=("host", "last report", RECENT, "uptime", "GPUs", "GPUs lost")),
            ],
            width=20,
            height=6,
        ),
    )
    d.row(
        "Delivery",
        timeseries(
            "Lines per second",
            "Lines the database accepted (written), lines sent to the disk spool, replayed from it, dropped and rejected.",
            _rates(
                ("lines_written", "written"),
                ("lines_spooled", "spooled"),
                ("lines_replayed", "replayed"),
                ("lines_dropped", "dropped"),
                ("lines_rejected", "rejected"),
            ),
            min=0,
            legend="wide",
        ),
        timeseries(
            "Spool size",
            "Bytes waiting in the disk spool, and lines waiting in memory: growth means the database is unreachable "
            "or too slow.",
            Query(f'SELECT mean("spool_bytes") AS "spool" FROM "agent" WHERE {WHERE} {BY_HOST}', BYTES, PER_HOST),
            Query(
                f'SELECT mean("buffer_lines") AS "lines in memory" FROM "agent" WHERE {WHERE} {BY_HOST}',
                COUNT,
                PER_HOST,
            ),
            min=0,
            legend="wide",
        ),
        timeseries(
            "Write latency",
            "Duration of the last successful write (ms), and seconds since it happened (dashed lines at 30 s "
            "and 120 s: the spool takes over).",
            Query(
                f'SELECT mean("write_latency_ms") AS "latency" FROM "agent" WHERE {WHERE} {BY_HOST}',
                MILLISECONDS,
                PER_HOST,
            ),
            Query(
                f'SELECT max("last_write_age_s") AS "since last write" FROM "agent" WHERE {WHERE} {BY_HOST}',
                SECONDS,
                PER_HOST,
            ),
            min=0,
            legend="wide",
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [
                        {"id": "thresholds", "value": rising(30, 120).to_json()},
                        {"id": "custom.thresholdsStyle", "value": {"mode": "dashed"}},
                        {"id": "custom.axisPlacement", "value": "right"},
                    ],
                }
            ],
        ),
        timeseries(
            "Dropped values and rejected records",
            "Non-finite field values dropped by the encoder, and training records rejected as malformed, per interval.",
            _increments(("values_dropped_nonfinite", "non-finite values"), ("records_rejected", "records rejected")),
            min=0,
            legend="wide",
        ),
    )
    d.row(
        "Sampling",
        timeseries(
            "Cycle time",
            "CPU wall time of the last sampling cycle; near the sampling interval means cycles will be skipped.",
            Query(
                f'SELECT mean("cycle_ms") AS "mean", max("cycle_ms") AS "max" FROM "agent" WHERE {WHERE} {BY_HOST}',
                MILLISECONDS,
                PER_HOST,
            ),
            min=0,
            legend="wide",
        ),
        timeseries(
            "Skipped cycles",
            "Sampling cycles skipped because the previous one ran late, per interval.",
            _increments(("cycles_skipped", "skipped")),
            min=0,
            bars=True,
            legend="wide",
        ),
        timeseries(
            "NVML errors",
            "Failed NVML calls per interval, by error kind (gpu is lost, timeout, ...).",
            _increments(*((f"nvml_errors_{k}", k.replace("_", " ")) for k in NVML_ERROR_KINDS)),
            min=0,
            bars=True,
            stacked=True,
            legend="wide",
        ),
        timeseries(
            "Training records received",
            "Training-step records per second received on the agent's socket.",
            Query(
                f'SELECT non_negative_derivative(last("records_received"), 1s) AS "received" FROM "agent" '
                f"WHERE {WHERE} {BY_HOST}",
                RECORDS_PER_S,
                PER_HOST,
            ),
            min=0,
            legend="wide",
        ),
    )
    return d
