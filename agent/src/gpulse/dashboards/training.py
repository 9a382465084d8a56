"""Training-run dashboard: where each step's time goes, how fast the run learns, and which rank lags."""

from __future__ import annotations

from gpulse.dashboards.builder import Dashboard, Query, bargauge, stat, table, timeseries

SEL = '"run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ AND "rank" =~ /^$rank$/'
WHERE = f"{SEL} AND $timeFilter"
BY_TIME = "GROUP BY time($__interval) fill(none)"
BY_RANK = 'GROUP BY time($__interval), "rank" fill(none)'
PER_RANK = "rank $tag_rank"
PHASES = (
    ("data_wait_s", "data wait"),
    ("forward_s", "forward"),
    ("backward_s", "backward"),
    ("optimizer_s", "optimizer"),
)


def _sum_over_ranks(field: str) -> Query:
    """Run-wide rate: each rank's mean per interval, summed over ranks."""
    return Query(
        f'SELECT sum("v") FROM (SELECT mean("{field}") AS "v" FROM "train_step" WHERE {WHERE} {BY_RANK}) '
        f"WHERE $timeFilter {BY_TIME}",
        "all ranks",
    )


def build() -> Dashboard:
    d = Dashboard(
        "gpulse-training-run",
        "gpulse / Training run",
        "Training",
        "training-run",
        "One training run: step time by phase, input and communication stalls, throughput, MFU, loss, memory, "
        "rank stragglers and the run's GPUs.",
        time_from="now-3h",
        refresh="10s",
    )
    d.variable("run", "Run", 'SHOW TAG VALUES FROM "train_step" WITH KEY = "run"', multi=False)
    d.variable("host", "Host", 'SHOW TAG VALUES FROM "train_step" WITH KEY = "host" WHERE "run" =~ /^${run:regex}$/')
    d.variable(
        "rank",
        "Rank",
        'SHOW TAG VALUES FROM "train_step" WITH KEY = "rank" WHERE "run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/',
        numeric_sort=True,
    )
    d.annotation(
        "Run events",
        'SELECT "text", "kind", "step" FROM "train_event" WHERE "run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ AND $timeFilter',
        text="text",
        tags="kind",
        color="orange",
    )
    d.annotation(
        "Run start / end",
        'SELECT "status", "event" FROM "train_run" WHERE "run" =~ /^${run:regex}$/ AND "rank" = \'0\' AND $timeFilter',
        text="status",
        tags="event",
        color="green",
    )

    d.row(
        "Overview",
        stat("Step", "Latest global step.", Query(f'SELECT max("step") FROM "train_step" WHERE {WHERE}')),
        stat(
            "Mean step time",
            "Mean wall time of a step over the selected ranks and range.",
            Query(f'SELECT mean("step_time_s") FROM "train_step" WHERE {WHERE}'),
            unit="s",
            decimals=3,
        ),
        stat(
            "Mean MFU",
            "Model FLOPs utilisation: achieved / peak FLOP/s (formula in the run's train_run.mfu_formula).",
            Query(f'SELECT mean("mfu") FROM "train_step" WHERE {WHERE}'),
            unit="percentunit",
            decimals=1,
        ),
        stat(
            "Data wait share",
            "Share of step time spent waiting for the next batch: above a few percent, the input pipeline is the bottleneck.",
            Query(f'SELECT sum("data_wait_s") / sum("step_time_s") FROM "train_step" WHERE {WHERE}'),
            unit="percentunit",
            decimals=1,
        ),
    )
    d.row(
        "Step time",
        timeseries(
            "Step time by phase",
            "Host wall time per phase, averaged over the selected ranks and stacked; the line is the whole step. "
            "A gap between the stack and the line is time outside the instrumented phases.",
            Query(
                "SELECT "
                + ", ".join(f'mean("{f}") AS "{name}"' for f, name in PHASES)
                + f' FROM "train_step" WHERE {WHERE} {BY_TIME}',
                "$col",
            ),
            Query(f'SELECT mean("step_time_s") AS "step" FROM "train_step" WHERE {WHERE} {BY_TIME}', "step time"),
            unit="s",
            min=0,
            stacked=True,
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
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
            "Share of step time blocked on input (data wait) and spent in measured communication (comm).",
            Query(
                'SELECT sum("data_wait_s") / sum("step_time_s") AS "data wait", sum("comm_s") / sum("step_time_s") AS "communication" '
                f'FROM "train_step" WHERE {WHERE} {BY_TIME}',
                "$col",
            ),
            unit="percentunit",
            min=0,
        ),
    )
    d.row(
        "Throughput and efficiency",
        timeseries(
            "Samples/s", "Samples per second over all selected ranks.", _sum_over_ranks("samples_per_s"), width=8, min=0
        ),
        timeseries(
            "Tokens/s", "Tokens per second over all selected ranks.", _sum_over_ranks("tokens_per_s"), width=8, min=0
        ),
        timeseries(
            "MFU",
            "Model FLOPs utilisation per rank.",
            Query(f'SELECT mean("mfu") FROM "train_step" WHERE {WHERE} {BY_RANK}', PER_RANK),
            unit="percentunit",
            min=0,
            width=8,
        ),
    )
    d.row(
        "Learning and memory",
        timeseries(
            "Loss",
            "The logged training loss (log_loss), averaged over ranks.",
            Query(f'SELECT mean("log_loss") FROM "train_step" WHERE {WHERE} {BY_TIME}', "loss"),
            width=12,
        ),
        timeseries(
            "Memory peak per rank",
            "Peak CUDA memory allocated during a step and memory reserved by the caching allocator, per rank.",
            Query(
                f'SELECT max("mem_peak_bytes") AS "peak", max("mem_reserved_bytes") AS "reserved" FROM "train_step" WHERE {WHERE} {BY_RANK}',
                "rank $tag_rank $col",
            ),
            unit="bytes",
            min=0,
            width=12,
        ),
    )
    d.row(
        "Ranks",
        timeseries(
            "Step time across ranks",
            "Fastest and slowest rank's mean step time per interval, and their difference: a persistent spread is a straggler.",
            Query(
                'SELECT min("v") AS "fastest", max("v") AS "slowest", spread("v") AS "spread" FROM '
                f'(SELECT mean("step_time_s") AS "v" FROM "train_step" WHERE {WHERE} {BY_RANK}) WHERE $timeFilter {BY_TIME}',
                "$col",
            ),
            unit="s",
            min=0,
        ),
        bargauge(
            "Mean step time per rank",
            "Each rank's mean step time over the range; the longest bar is the rank everyone else waits for.",
            Query(f'SELECT mean("step_time_s") FROM "train_step" WHERE {WHERE} GROUP BY "rank"', PER_RANK),
            unit="s",
            min=0,
        ),
    )
    d.row(
        "The run's GPUs",
        timeseries(
            "GPU activity of the run",
            "SM activity and busy % of the GPUs the agent attributed to this run (gpu points tagged run).",
            Query(
                'SELECT mean("sm_active_pct") AS "SM activity", mean("util_gpu_pct") AS "busy" FROM "gpu" '
                'WHERE "run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ AND $timeFilter GROUP BY time($__interval), "host", "gpu" fill(none)',
                "$tag_host GPU $tag_gpu $col",
            ),
            unit="percent",
            min=0,
            max=100,
        ),
        table(
            "Run",
            "The run's start/end records: status, configuration and how MFU is computed.",
            Query(
                'SELECT "event", "status", "name", "steps", "duration_s", "mfu_formula", "config" FROM "train_run" '
                'WHERE "run" =~ /^${run:regex}$/ AND "rank" = \'0\'',
                table=True,
            ),
            width=12,
        ),
    )
    return d
