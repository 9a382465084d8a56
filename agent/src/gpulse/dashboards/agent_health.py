"""Agent-health dashboard: is every node's agent sampling, delivering and keeping up?

Counters in ``agent`` count since the agent started, so rates use ``non_negative_derivative`` /
``non_negative_difference`` (a restart resets them to zero and is skipped, not shown as negative).
"""

from __future__ import annotations

from gpulse.dashboards.builder import Dashboard, Query, stat, timeseries
from gpulse.schema import NVML_ERROR_KINDS

WHERE = '"host" =~ /^$host$/ AND $timeFilter'
BY_HOST = 'GROUP BY time($__interval), "host" fill(none)'
PER_HOST = "$tag_host $col"


def _rates(*cols: tuple[str, str]) -> Query:
    sel = ", ".join(f'non_negative_derivative(last("{f}"), 1s) AS "{name}"' for f, name in cols)
    return Query(f'SELECT {sel} FROM "agent" WHERE {WHERE} {BY_HOST}', PER_HOST)


def _increments(*cols: tuple[str, str]) -> Query:
    sel = ", ".join(f'non_negative_difference(last("{f}")) AS "{name}"' for f, name in cols)
    return Query(f'SELECT {sel} FROM "agent" WHERE {WHERE} {BY_HOST}', PER_HOST)


def build() -> Dashboard:
    d = Dashboard(
        "gpulse-agent-health",
        "gpulse / Agent health",
        "Agent",
        "agent-health",
        "The gpulse agent on each host: delivery (written, spooled, dropped), spool, write latency, sampling "
        "cycles, NVML errors and how long ago each host last reported.",
        time_from="now-6h",
        refresh="10s",
    )
    d.variable("host", "Host", 'SHOW TAG VALUES FROM "agent" WITH KEY = "host"')

    d.row(
        "Liveness",
        stat(
            "Last report",
            "When each host's agent last wrote its health point: more than a minute ago means it is down or cannot deliver.",
            Query(f'SELECT last("uptime_s") FROM "agent" WHERE {WHERE} GROUP BY "host"', "$tag_host", table=True),
            unit="dateTimeFromNow",
            options={
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "/^Time$/", "values": True},
                "textMode": "value_and_name",
            },
            width=12,
        ),
        stat(
            "Uptime",
            "Seconds since each agent started (a reset means a restart).",
            Query(f'SELECT last("uptime_s") FROM "agent" WHERE {WHERE} GROUP BY "host"', "$tag_host"),
            unit="s",
            width=6,
        ),
        stat(
            "GPUs sampled / lost",
            "GPUs each agent samples, and GPUs it has marked lost (fell off the bus, XID 79).",
            Query(
                f'SELECT last("gpus") AS "sampled", last("gpus_lost") AS "lost" FROM "agent" WHERE {WHERE} GROUP BY "host"',
                PER_HOST,
            ),
            width=6,
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
            unit="short",
            min=0,
        ),
        timeseries(
            "Spool size",
            "Bytes waiting in the disk spool, and lines waiting in memory: growth means the database is unreachable or too slow.",
            Query(
                f'SELECT mean("spool_bytes") AS "spool bytes", mean("buffer_lines") AS "buffered lines" FROM "agent" WHERE {WHERE} {BY_HOST}',
                PER_HOST,
            ),
            unit="short",
            min=0,
        ),
        timeseries(
            "Write latency",
            "Duration of the last successful write, and seconds since it happened.",
            Query(
                f'SELECT mean("write_latency_ms") AS "latency ms", max("last_write_age_s") AS "since last write s" FROM "agent" WHERE {WHERE} {BY_HOST}',
                PER_HOST,
            ),
            unit="short",
            min=0,
        ),
        timeseries(
            "Dropped values and rejected records",
            "Non-finite field values dropped by the encoder, and training records rejected as malformed, per interval.",
            _increments(("values_dropped_nonfinite", "non-finite values"), ("records_rejected", "records rejected")),
            min=0,
        ),
    )
    d.row(
        "Sampling",
        timeseries(
            "Cycle time",
            "CPU wall time of the last sampling cycle; near the sampling interval means cycles will be skipped.",
            Query(
                f'SELECT mean("cycle_ms") AS "mean", max("cycle_ms") AS "max" FROM "agent" WHERE {WHERE} {BY_HOST}',
                PER_HOST,
            ),
            unit="ms",
            min=0,
        ),
        timeseries(
            "Skipped cycles",
            "Sampling cycles skipped because the previous one ran late, per interval.",
            _increments(("cycles_skipped", "skipped")),
            min=0,
            bars=True,
        ),
        timeseries(
            "NVML errors",
            "Failed NVML calls per interval, by error kind (gpu is lost, timeout, ...).",
            _increments(*((f"nvml_errors_{k}", k.replace("_", " ")) for k in NVML_ERROR_KINDS)),
            min=0,
            bars=True,
            stacked=True,
        ),
        timeseries(
            "Training records received",
            "Training-step records per second received on the agent's socket.",
            _rates(("records_received", "received")),
            min=0,
        ),
    )
    return d
