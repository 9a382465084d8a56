"""Training-run dashboard: where each step's time goes, how fast the run learns, and which rank lags.

``$run`` lists the runs of the time range, the latest first, and Grafana selects the first: the
dashboard opens on the latest run, not the alphabetically first one. Every panel reads the raw tier
where raw retention still holds the range and the 1m tier before that (:mod:`.tier_split`), so a run
months old opens at 1-minute resolution.
"""

from __future__ import annotations

from typing import Any

from gpulse.dashboards import host_panels, node
from gpulse.dashboards.builder import (
    Annotation,
    Column,
    Dashboard,
    Panel,
    Query,
    Variable,
    any_job,
    bargauge,
    stat,
    table,
    timeseries,
)
from gpulse.dashboards.tier_split import RAW_RETENTION_SETTING, split_panels
from gpulse.dashboards.units import (
    BYTES,
    COUNT,
    ID,
    PERCENT,
    PLAIN,
    RATIO,
    SAMPLES_PER_S,
    SECONDS,
    TFLOPS,
    TOKENS_PER_S,
    Unit,
    falling,
    rising,
)

UID = "gpulse-training-run"
#: the table of rolling findings (the ``gpulse-run-finding`` alert links it)
FINDINGS_PANEL = "Findings while running"
SEL = '"run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ AND "rank" =~ /^$rank$/'
WHERE = f"{SEL} AND $timeFilter"
BY_TIME = "GROUP BY time($__interval) fill(none)"
BY_RANK = 'GROUP BY time($__interval), "rank" fill(none)'
PER_RANK = "rank $tag_rank"
#: The parts of a step as ``gpulse.report.phases`` defines them (docs/report.md), per interval from
#: the means of the same fields: backward's compute is the backward phase less the communication
#: wait it holds, other the step less forward, backward and optimizer. ``fill(0)`` makes an absent
#: field 0 (a run without phases, or without communication) instead of voiding the difference.
STEP_PARTS = (
    ("data_wait", 'mean("data_wait_s")'),
    ("forward", 'mean("forward_s")'),
    ("backward", 'mean("backward_s") - mean("comm_s")'),
    ("comm", 'mean("comm_s")'),
    ("optimizer", 'mean("optimizer_s")'),
    ("other", 'mean("step_time_s") - mean("forward_s") - mean("backward_s") - mean("optimizer_s")'),
)
BY_TIME_ZERO = "GROUP BY time($__interval) fill(0)"
#: The ``train_run`` points that can belong to a run shown in the range: those of runs started up to
#: raw retention before it (older ones are gone from raw; ``train_run`` is not downsampled).
#: ``<ms> - <duration>`` is duration arithmetic in InfluxQL 1.x and in InfluxDB 3's parser alike
#: (``core/influxdb_influxql_parser/src/time_range.rs`` ``reduce_binary_lhs_duration``).
RUN_RECORDS = "time >= ${__from}ms - $raw_retention AND time <= ${__to}ms"
#: Runs in the range, the latest start first, in two statements whose answers Grafana reads in
#: order (each a raw, so time-ordered, select of the run tag as the only column): the runs whose
#: ``train_run`` start point raw still holds, then the runs older than raw retention, from the 1m
#: tier's steps (by their first step in the range). One statement cannot do it: InfluxDB answers a
#: select over two subqueries with one series per measurement, in name order. Grafana's InfluxQL
#: variable support takes the first string field of each frame in row order, and ``sort: 0`` keeps
#: that order, so the dashboard opens on the latest run. On InfluxDB 3 the second statement reads
#: the raw database (the retention policy is dropped) before raw retention, and adds nothing; it
#: runs the statements of one request one by one too (``core/iox_v1_query_api/src/handler.rs``,
#: ``parse_statements``). That Grafana turns each answer into frames in order is modelled by
#: ``support.grafana_queries``, not checked against a Grafana server.
RUNS_LATEST_FIRST = (
    'SELECT "r" FROM (SELECT "status", "run" AS "r" FROM "train_run" WHERE "event" = \'start\' '
    f"AND {RUN_RECORDS}) ORDER BY time DESC; "
    'SELECT "r" FROM (SELECT first("step") AS "s", "run" AS "r" FROM "1m"."train_step" WHERE $timeFilter '
    'AND time <= now() - $raw_retention GROUP BY "run") ORDER BY time DESC'
)
MFU = falling(0.2, 0.35)


def _sum_over_ranks(field: str, unit: Unit) -> Query:
    """Run-wide rate: each rank's mean per interval, summed over ranks."""
    return Query(
        f'SELECT sum("v") FROM (SELECT mean("{field}") AS "v" FROM "train_step" WHERE {WHERE} {BY_RANK}) '
        f"WHERE $timeFilter {BY_TIME}",
        unit,
        "all ranks",
    )


def _stat(title: str, description: str, fn: str, field: str, unit: Unit, **kw: Any) -> Panel:
    """A stat of one aggregate of one train_step field over the selected ranks and range."""
    return stat(title, description, Query(f'SELECT {fn}("{field}") FROM "train_step" WHERE {WHERE}', unit), **kw)


def build() -> Dashboard:
    d = Dashboard(
        UID,
        "gpulse / Training run",
        "Training",
        "training-run",
        "One training run: step time by phase, input and communication stalls, throughput, MFU, loss, memory, "
        "rank stragglers and the run's GPUs (a click opens a GPU on the Node dashboard).",
        time_from="now-3h",
        refresh="10s",
    )
    d.variable(RAW_RETENTION_SETTING)
    d.variable(Variable("run", "Run (latest first)", RUNS_LATEST_FIRST, multi=False, include_all=False, sort=0))
    # the run's jobs (a requeued run spans several): one narrows the hosts and ranks to that job's
    d.variable(
        any_job('SHOW TAG VALUES FROM "train_step" WITH KEY = "job" WHERE "run" =~ /^${run:regex}$/ AND $timeFilter')
    )
    d.variable(
        Variable(
            "host",
            "Host",
            'SHOW TAG VALUES FROM "train_step" WITH KEY = "host" WHERE "run" =~ /^${run:regex}$/ '
            'AND "job" =~ /^$job$/ AND $timeFilter',
        )
    )
    d.variable(
        Variable(
            "rank",
            "Rank",
            'SHOW TAG VALUES FROM "train_step" WITH KEY = "rank" WHERE "run" =~ /^${run:regex}$/ '
            'AND "job" =~ /^$job$/ AND "host" =~ /^$host$/ AND $timeFilter',
            sort=3,
        )
    )
    d.annotation(
        Annotation(
            "Run events",
            'SELECT "text", "kind", "step" FROM "train_event" WHERE "run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ '
            "AND $timeFilter",
            text="text",
            tags="kind",
            color="orange",
        )
    )
    d.annotation(
        Annotation(
            "Findings (raised / cleared while running)",
            'SELECT "evidence", "state", "rule" FROM "train_finding" WHERE "run" =~ /^${run:regex}$/ '
            'AND "host" =~ /^$host$/ AND $timeFilter',
            text="evidence",
            tags="state",
            title="rule",
            color="red",
        )
    )
    d.annotation(
        Annotation(
            "Run start / end",
            'SELECT "status", "event" FROM "train_run" WHERE "run" =~ /^${run:regex}$/ AND "rank" = \'0\' AND $timeFilter',
            text="status",
            tags="event",
            color="green",
        )
    )

    d.row(
        "Overview",
        _stat(
            "Step",
            "Latest global step of the run (the highest of the selected ranks).",
            "max",
            "step",
            ID,
        ),
        _stat(
            "Mean step time",
            "Mean wall time of a step over the selected ranks and range.",
            "mean",
            "step_time_s",
            SECONDS,
        ),
        _stat(
            "Mean MFU",
            "Model FLOPs utilisation: achieved / peak FLOP/s (formula in the Run table). Red below 20 %, "
            "yellow below 35 %.",
            "mean",
            "mfu",
            RATIO,
            thresholds=MFU,
        ),
        _stat(
            "Mean TFLOP/s per rank",
            "Achieved model TFLOP/s of one rank, averaged over ranks and range.",
            "mean",
            "tflops",
            TFLOPS,
        ),
        _stat(
            "Tokens/s per rank",
            "Tokens per second of one rank, averaged over ranks and range (the graph below sums the ranks).",
            "mean",
            "tokens_per_s",
            TOKENS_PER_S,
        ),
        stat(
            "Data wait share",
            "Share of step time spent waiting for the next batch: above 5 % (yellow) the input pipeline starts "
            "to cost; above 15 % (red) it is the bottleneck.",
            Query(f'SELECT sum("data_wait_s") / sum("step_time_s") FROM "train_step" WHERE {WHERE}', RATIO),
            thresholds=rising(0.05, 0.15),
        ),
        stat(
            "Communication share",
            "Share of step time in measured communication (yellow from 10 %, red from 30 %).",
            Query(f'SELECT sum("comm_s") / sum("step_time_s") FROM "train_step" WHERE {WHERE}', RATIO),
            thresholds=rising(0.1, 0.3),
        ),
        _stat(
            "Peak memory",
            "Highest CUDA memory allocated during a step, over the selected ranks.",
            "max",
            "mem_peak_bytes",
            BYTES,
        ),
    )
    d.row(
        "Step time",
        timeseries(
            "Step time by phase",
            "The parts of a step (docs/report.md), host wall time averaged over the selected ranks and stacked: "
            "data wait, forward, backward's compute, the exposed communication wait after it, optimizer, and other "
            "(the step less the named phases; custom phases count in it). The line is data wait + step.",
            Query(
                "SELECT "
                + ", ".join(f'{expr} AS "{name}"' for name, expr in STEP_PARTS)
                + f' FROM "train_step" WHERE {WHERE} {BY_TIME_ZERO}',
                SECONDS,
                "$col",
            ),
            Query(
                f'SELECT mean("data_wait_s") + mean("step_time_s") AS "step" FROM "train_step" WHERE {WHERE} '
                f"{BY_TIME_ZERO}",
                SECONDS,
                "step time",
            ),
            min=0,
            stacked=True,
            legend="wide",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "step time"},
                    "properties": [
                        {"id": "custom.stacking", "value": {"mode": "none", "group": "B"}},
                        {"id": "custom.fillOpacity", "value": 0},
                        {"id": "custom.lineWidth", "value": 2},
                    ],
                }
            ],
        ),
        timeseries(
            "Data-wait and communication ratios",
            "Share of step time blocked on input (data wait) and spent in measured communication.",
            Query(
                'SELECT sum("data_wait_s") / sum("step_time_s") AS "data wait", sum("comm_s") / sum("step_time_s") '
                f'AS "communication" FROM "train_step" WHERE {WHERE} {BY_TIME}',
                RATIO,
                "$col",
            ),
            min=0,
            thresholds=rising(0.05, 0.15),
            legend="wide",
        ),
    )
    d.row(
        "Throughput and efficiency",
        timeseries(
            "Samples/s",
            "Samples per second over all selected ranks.",
            _sum_over_ranks("samples_per_s", SAMPLES_PER_S),
            width=6,
            min=0,
            legend="wide",
        ),
        timeseries(
            "Tokens/s",
            "Tokens per second over all selected ranks.",
            _sum_over_ranks("tokens_per_s", TOKENS_PER_S),
            width=6,
            min=0,
            legend="wide",
        ),
        timeseries(
            "MFU",
            "Model FLOPs utilisation per rank (dashed lines at 20 % and 35 %).",
            Query(f'SELECT mean("mfu") FROM "train_step" WHERE {WHERE} {BY_RANK}', RATIO, PER_RANK),
            min=0,
            thresholds=MFU,
            width=6,
        ),
        timeseries(
            "TFLOP/s per rank",
            "Achieved model TFLOP/s per rank.",
            Query(f'SELECT mean("tflops") FROM "train_step" WHERE {WHERE} {BY_RANK}', TFLOPS, PER_RANK),
            min=0,
            width=6,
        ),
    )
    d.row(
        "Learning and memory",
        timeseries(
            "Loss",
            "The logged training loss (log_loss), averaged over ranks.",
            Query(f'SELECT mean("log_loss") FROM "train_step" WHERE {WHERE} {BY_TIME}', PLAIN, "loss"),
            width=8,
            legend="wide",
        ),
        timeseries(
            "Memory peak per rank",
            "Peak CUDA memory allocated during a step and memory reserved by the caching allocator, per rank.",
            Query(
                'SELECT max("mem_peak_bytes") AS "peak", max("mem_reserved_bytes") AS "reserved" '
                f'FROM "train_step" WHERE {WHERE} {BY_RANK}',
                BYTES,
                "rank $tag_rank $col",
            ),
            min=0,
            width=8,
        ),
        timeseries(
            "Allocator retries",
            "Caching-allocator retries per interval (cudaMalloc failed and the cache was flushed): a run close "
            "to out-of-memory slows down here first.",
            Query(
                f'SELECT non_negative_difference(last("alloc_retries")) FROM "train_step" WHERE {WHERE} {BY_RANK}',
                COUNT,
                PER_RANK,
            ),
            min=0,
            bars=True,
            width=8,
        ),
    )
    d.row(
        "Ranks",
        timeseries(
            "Step time across ranks",
            "Fastest and slowest rank's mean step time per interval, and their difference: a persistent spread "
            "is a straggler.",
            Query(
                'SELECT min("v") AS "fastest", max("v") AS "slowest", spread("v") AS "spread" FROM '
                f'(SELECT mean("step_time_s") AS "v" FROM "train_step" WHERE {WHERE} {BY_RANK}) WHERE $timeFilter '
                f"{BY_TIME}",
                SECONDS,
                "$col",
            ),
            min=0,
            legend="wide",
        ),
        bargauge(
            "Mean step time per rank",
            "Each rank's mean step time over the range; the longest bar is the rank everyone else waits for.",
            Query(f'SELECT mean("step_time_s") FROM "train_step" WHERE {WHERE} GROUP BY "rank"', SECONDS, PER_RANK),
            min=0,
        ),
    )
    d.row("The run's processes on the host", *host_panels.run_processes())
    d.row(
        "The run's GPUs",
        timeseries(
            "GPU activity of the run",
            "SM activity and busy % of the GPUs the agent attributed to this run (gpu points tagged run). "
            "Click a line to open that GPU on the Node dashboard over the same time range.",
            Query(
                'SELECT mean("sm_active_pct") AS "SM activity", mean("util_gpu_pct") AS "busy" FROM "gpu" '
                'WHERE "run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ AND $timeFilter '
                'GROUP BY time($__interval), "host", "gpu" fill(none)',
                PERCENT,
                "$tag_host GPU $tag_gpu $col",
            ),
            min=0,
            max=100,
            links=(node.link_to_gpu(),),
        ),
        table(
            "Run",
            "The run's start/end records: status, configuration and how MFU is computed.",
            Query(
                'SELECT "event", "status", "name", "steps", "duration_s", "mfu_formula", "config" FROM "train_run" '
                f'WHERE "run" =~ /^${{run:regex}}$/ AND "rank" = \'0\' AND {RUN_RECORDS}',
                table=True,
            ),
            columns=(Column("steps", COUNT), Column("duration_s", SECONDS)),
            width=12,
        ),
        table(
            FINDINGS_PANEL,
            "Each raise, clear and end of a finding of the agent's rolling diagnosis (the rules of "
            "docs/report.md over the run's recent steps on each node), with the steps it held, what it saw "
            "and what to do. The same points are the red annotations on the graphs.",
            Query(
                'SELECT "state", "first_step", "last_step", "evidence", "action" FROM "train_finding" '
                'WHERE "run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ AND $timeFilter GROUP BY "host", "rule" '
                "ORDER BY time DESC LIMIT 100",
                table=True,
            ),
            columns=(Column("first_step", ID), Column("last_step", ID)),
            width=12,
        ),
    )
    split_panels(d.panels())
    return d
