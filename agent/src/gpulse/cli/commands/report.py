"""``gpulse report``: a run's metrics report and diagnosis, from InfluxDB or a recording file.

Prints the report (diagnosis first; ``--json`` prints the JSON instead), writes
``metrics_report.json`` into ``--out`` and, with ``--html``, ``metrics_report.html`` next to it.
A recording that holds no training run (``gpulse agent --record``) gives a node report instead
(``node_report.json``/``.html``: the GPUs, their energy, throttling and events).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpulse.agent.connection_config import add_connection_flags
from gpulse.cli.exit_codes import ExitCode
from gpulse.influx.connection import ConfigError

EXIT_CODES = (
    ExitCode(0, "the report is written"),
    ExitCode(1, "the database could not be read, or it holds no points for the run"),
)
#: Flags whose value may begin with ``-`` (a run id named after an absolute path: ``-tmp-out-v0``).
DASH_VALUES = ("--run",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run", metavar="ID", help="the run id (optional with --from-file when the file holds one run)"
    )
    parser.add_argument(
        "--from-file",
        metavar="FILE",
        action="append",
        help="read a recording (agent --record file or a run's gpulse-records.rec) instead of InfluxDB; repeatable",
    )
    parser.add_argument("--out", metavar="DIR", default=".", help="directory for metrics_report.json/.html (default .)")
    parser.add_argument("--html", action="store_true", help="also write the self-contained HTML report")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the text one")
    parser.add_argument(
        "--threshold",
        metavar="NAME=VALUE",
        action="append",
        help="override a diagnosis threshold (repeatable; names in docs/report.md)",
    )
    add_connection_flags(parser)


def _choose(run: str | None, runs: list[str], where: str) -> str:
    if run:
        return run
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise ConfigError(f"no training run found in {where}")
    raise ConfigError(f"{where} holds {len(runs)} runs; choose one with --run: {', '.join(runs[:20])}")


def run(args: argparse.Namespace) -> int:
    from gpulse.report.diagnose import ThresholdError, parse_threshold_args
    from gpulse.report.load import list_runs_influx, load_files, load_influx, read_points, runs_in
    from gpulse.report.output import write_run_report

    try:
        thresholds = parse_threshold_args(args.threshold)
    except ThresholdError as e:  # the report model is stdlib-only: its error becomes the CLI's
        raise ConfigError(str(e)) from None
    if args.from_file:
        for path in args.from_file:
            if not os.path.isfile(path):
                raise ConfigError(f"{path} is not a file")
        rows, bad = read_points(args.from_file)
        for path, lineno, why in bad[:5]:
            print(f"gpulse report: {path}:{lineno}: skipped: {why}", file=sys.stderr)
        if len(bad) > 5:
            print(f"gpulse report: ... {len(bad) - 5} more unreadable lines skipped", file=sys.stderr)
        if not args.run and not runs_in(rows):  # a node recording without a training run
            return _node_report(args, rows, thresholds)
        run_id = _choose(args.run, runs_in(rows), ", ".join(args.from_file))
        data = load_files(rows, run_id)
    else:
        from gpulse.agent.config import load_connection
        from gpulse.influx.query import InfluxQL, QueryError
        from gpulse.influx.server import ServerProblem, probe_connection
        from gpulse.influx.tiers import RAW

        conn = load_connection(args)
        try:
            info = probe_connection(conn)  # the wrong --api is said as such, not as "HTTP 401"
        except ServerProblem as e:
            print(f"gpulse report: {e}", file=sys.stderr)
            return 1
        q = InfluxQL(conn)
        q.explainer.info = info
        try:
            run_id = _choose(args.run, [] if args.run else list_runs_influx(q), q.conn.describe())
            data = load_influx(q, run_id)
            if data.tier != RAW and not data.empty:
                print(
                    f"gpulse report: run {run_id!r} is no longer in the raw points: read from the {data.tier} tier "
                    "(per-minute means per rank; no run records or events)",
                    file=sys.stderr,
                )
        except QueryError as e:
            print(f"gpulse report: cannot read {q.conn.describe()}: {e}", file=sys.stderr)
            return 1
        finally:
            q.close()
    if data.empty:
        print(f"gpulse report: no points for run {run_id!r}", file=sys.stderr)
        return 1
    report = data.report(thresholds)
    write_run_report(
        report, args.out, steps=data.steps, gpu=data.gpu, events=data.events, html=args.html, as_json=args.json
    )
    return 0


def _node_report(args: argparse.Namespace, rows: dict[str, list[dict[str, Any]]], thresholds: dict[str, float]) -> int:
    """A recording with GPU samples and no training run: what the node's GPUs did."""
    from gpulse.report.model import build_node_report
    from gpulse.report.output import write_node_report

    gpu = rows.get("gpu", [])
    if not gpu:
        raise ConfigError(f"no training run and no GPU samples in {', '.join(args.from_file)}")
    report = build_node_report(gpu, rows.get("gpu_event", []), thresholds)
    write_node_report(report, args.out, gpu=gpu, html=args.html, as_json=args.json)
    return 0
