"""``gpulse demo``: fill InfluxDB with a simulated 8-GPU node and an 8-rank training run of the last
few hours (a healthy phase, a data-loading bottleneck, a straggling GPU, thermal throttling,
checkpoints, an XID), downsample it once so the History dashboard has data, then print the Grafana
links and the run's diagnosis.

With ``--record FILE`` and no ``--url`` the points go only to the file (a URL in the environment or
the config file is not used: recording is recording), and the
report and its HTML page are built from it: the whole demo, locally. The scenario is in
:mod:`gpulse.sources.scenario`; the points travel through the agent's own sinks and retry policy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from gpulse.agent.connection_config import add_connection_flags
from gpulse.cli.exit_codes import ExitCode
from gpulse.influx.connection import DEFAULT_URL, ConfigError

EXIT_CODES = (
    ExitCode(0, "the demo's points are written (or recorded) and its report built"),
    ExitCode(1, "the database is not ready for it, or did not take every line"),
)

#: The admin token ``make up`` generates (see .env.example); the demo's default credentials.
LOCAL_STACK_TOKEN_FILE = "secrets/influxdb-admin-token"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_flags(parser)
    parser.add_argument(
        "--record",
        metavar="FILE",
        help="also write every point to FILE (line protocol), replacing FILE once complete; without --url, "
        "only to FILE (a URL from the environment or a config file is not used): a demo with no database",
    )
    parser.add_argument(
        "--hours", type=float, default=3.0, metavar="H", help="how far back the demo reaches (default 3)"
    )
    parser.add_argument(
        "--gpus", type=int, default=8, metavar="N", help="GPUs on the simulated node, one rank each (default 8)"
    )
    parser.add_argument(
        "--interval", type=float, default=10.0, metavar="S", help="seconds between GPU samples (default 10)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the simulated values (default 0)")
    parser.add_argument(
        "--grafana-url",
        metavar="URL",
        help="Grafana for the printed links (default $GPULSE_GRAFANA_URL, else http://127.0.0.1:$GPULSE_GRAFANA_PORT, port 3000)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="gpulse-demo",
        help="where the run's metrics_report.json/.html go (default gpulse-demo)",
    )


def connection(args: argparse.Namespace):
    """Flags > env > config file as everywhere (``--record`` takes a URL only from ``--url``: recording
    is recording); with no token given, the local stack's with the token ``make up`` made."""
    from gpulse.agent.config import load_connection

    record = bool(args.record)
    conn = load_connection(args, url_optional=record, record_flag=record)
    local = conn.api == "v2" and (conn.url or "").rstrip("/") == DEFAULT_URL
    if conn.token or not local or not os.path.isfile(LOCAL_STACK_TOKEN_FILE):
        return conn
    return load_connection(
        args, {**os.environ, "GPULSE_TOKEN_FILE": LOCAL_STACK_TOKEN_FILE}, url_optional=record, record_flag=record
    )


def grafana_base(args: argparse.Namespace) -> str:
    if args.grafana_url:
        return args.grafana_url.rstrip("/")
    if os.environ.get("GPULSE_GRAFANA_URL"):
        return os.environ["GPULSE_GRAFANA_URL"].rstrip("/")
    return f"http://127.0.0.1:{os.environ.get('GPULSE_GRAFANA_PORT') or 3000}"


def _hhmm(ts_ns: int) -> str:
    return time.strftime("%H:%M", time.localtime(ts_ns / 1e9))


def run(args: argparse.Namespace) -> int:
    from collections import Counter

    from gpulse.delivery.oneshot import deliver_batches
    from gpulse.lineprotocol.encode import Encoder
    from gpulse.sinks.factory import build_sinks
    from gpulse.sources import scenario, scenario_host

    if args.gpus < 2 or args.hours <= 0 or args.interval <= 0:
        raise ConfigError("--gpus must be at least 2, --hours and --interval positive")
    conn = connection(args)
    if conn.url:
        problem = _not_ready(conn)
        if problem:
            print(f"gpulse demo: {problem}", file=sys.stderr)
            return 1
    t_start = time.monotonic()
    end = time.time_ns() // 10**9 * 10**9
    tl = scenario.Timeline.build(end, hours=args.hours, gpus=args.gpus)
    run_id = scenario.run_id_for(end)
    enc = Encoder()
    gpu, uuids = scenario.gpu_lines(tl, run_id, seed=args.seed, interval_s=args.interval, encoder=enc)
    train = scenario.training_lines(tl, run_id, uuids, seed=args.seed, encoder=enc)
    host = scenario_host.host_lines(tl, run_id, seed=args.seed, encoder=enc)
    agent = scenario.agent_lines(
        tl, len(gpu) + len(host), len(train.lines), gpus=args.gpus, seed=args.seed, encoder=enc
    )
    lines = gpu + train.lines + host + agent
    counts = Counter(line.split(",", 1)[0] for line in lines)

    from gpulse.agent.config import url_unused_by_record

    where = conn.describe() if conn.url else args.record
    if args.record and (unused := url_unused_by_record(args)):
        where += f" only ({unused} is not used with --record; add --url to send there too)"
    print(
        f"gpulse demo: a simulated {args.gpus}-GPU node ({scenario.DEMO_HOST}) and training run {run_id}, last {args.hours:g} h -> {where}"
    )
    print(f"  {_hhmm(tl.run_start_ns)}-{_hhmm(tl.run_end_ns)}  run {run_id}: {train.ranks} ranks, {train.steps} steps")
    for e in tl.episodes:
        print(f"  {_hhmm(e.start_ns)}-{_hhmm(min(e.end_ns, tl.run_end_ns))}  {e.what}")
    for ts in tl.checkpoints_ns:
        print(f"  {_hhmm(ts)}        checkpoint")
    print(f"  {_hhmm(tl.xid_ns)}        XID {scenario.XID[0]} on GPU {tl.xid_gpu}")

    # The recording is written aside and replaces FILE only once complete: an earlier demo's file
    # stays whole until then (and a second demo does not add a second run to it).
    partial = f"{args.record}.partial-{os.getpid()}" if args.record else None
    try:
        for sink in build_sinks(conn if conn.url else None, partial):
            try:
                result = deliver_batches(sink, lines, deadline_s=180)
            finally:
                sink.close()
            if result.failed or result.rejected:
                print(
                    f"gpulse demo: {sink.describe()} took {result.written} of {len(lines)} lines "
                    f"({result.rejected} rejected, {result.failed} not delivered); see the log above",
                    file=sys.stderr,
                )
                return 1
        if partial:
            os.replace(partial, args.record)
    finally:
        if partial and os.path.exists(partial):
            os.unlink(partial)
    summary = ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))
    print(f"wrote {len(lines)} points in {time.monotonic() - t_start:.1f} s: {summary}")

    if conn.url:
        _downsample(conn, tl.start_ns, tl.end_ns)
        print("downsampled the whole window into the 1m and 1h tiers (the History dashboard reads them)")
        _print_links(args, tl, run_id)
    return _report(args, conn, run_id)


def _not_ready(conn) -> str:
    """Why the database cannot take the demo yet (unreachable, credentials, no setup), with the fix, or ''."""
    from gpulse.agent.config import AgentConfig
    from gpulse.cli import advice
    from gpulse.cli.checks import database
    from gpulse.cli.checks.base import Context, Status, run_checks
    from gpulse.influx.server import Problem

    checks = (database.DATABASE, database.TOKEN, database.BUCKET, database.LAYOUT)
    ctx = Context(AgentConfig(connection=conn), live=False)
    for r in run_checks(checks, ctx):
        if r.status is Status.FAIL:
            fix = r.fix
            if ctx.database_problem is Problem.UNREACHABLE:  # the demo runs without a database too
                # --record takes no URL from the environment or a config file: this works as printed
                without = "without a database, `gpulse demo --record demo.lp` runs the whole demo from a file"
                fix = advice.no_database(conn, without)
            return f"{r.detail}\n  fix: {fix}"
    return ""


def _downsample(conn, start_ns: int, end_ns: int) -> None:
    from gpulse.influx.setup import downsample_now

    downsample_now(conn, start_ns, end_ns)


def _print_links(args: argparse.Namespace, tl, run_id: str) -> None:
    from urllib.parse import urlencode

    from gpulse.dashboards import dashboards

    base = grafana_base(args)
    window = {"from": tl.start_ns // 10**6, "to": tl.end_ns // 10**6}
    print(f"Grafana: {base}")
    width = max(len(d.title) for d in dashboards())
    for d in dashboards():
        params = dict(window)
        if any(v.name == "run" for v in d.variables):
            params["var-run"] = run_id
        if d.time_from.startswith("now-") and d.time_from[-1] in "dwy":
            params = {}  # the History dashboard: its own long range reads best
        query = f"?{urlencode(params)}" if params else ""
        print(f"  {d.title:<{width}}  {base}/d/{d.uid}{query}")


def _report(args: argparse.Namespace, conn, run_id: str) -> int:
    from gpulse.report.load import load_files, load_influx, read_points
    from gpulse.report.output import write_run_report

    if conn.url:
        from gpulse.influx.query import InfluxQL

        data = load_influx(InfluxQL(conn), run_id)
    else:
        rows, _bad = read_points([args.record])
        data = load_files(rows, run_id)
    report = data.report()
    print()
    _json, html = write_run_report(report, args.out, steps=data.steps, gpu=data.gpu, events=data.events, html=True)
    print(f"the run's report: {html}; again any time: {report_command(args, conn, run_id)}")
    return 0


def report_command(args: argparse.Namespace, conn, run_id: str) -> str:
    """The ``gpulse report`` command that rebuilds this report where the demo ran: from the
    database with the connection the demo used, or from the recording when there was none."""
    from gpulse.cli import advice

    if not conn.url:
        return advice.command("report", "--from-file", args.record, "--html", "--out", args.out)
    return advice.command("report", "--run", run_id, *conn.command_flags(), "--html", "--out", args.out)
