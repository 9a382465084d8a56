"""``gpulse recompute``: rebuild the 1m and 1h tiers from the raw points of a time range.

The downsampling (tasks on InfluxDB 2.x, continuous queries on 1.x) re-aggregates a fixed look-back
on every run, so points that arrive within it are folded in by themselves. Older gaps (an outage
longer than the look-back, ``gpulse upload`` of an old recording) need this command: it runs the very
same pipelines (:func:`gpulse.influx.downsample.flux_query`, :func:`~gpulse.influx.downsample.influxql_select`)
over the range, a day at a time, the 1m tier before the 1h tier of each day. Re-running it is
harmless: a window is rewritten with the same points.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime, timezone

from gpulse.agent.connection_config import add_connection_flags
from gpulse.cli.exit_codes import ExitCode
from gpulse.influx.connection import ConfigError

EXIT_CODES = (
    ExitCode(0, "the tiers of the range are rebuilt"),
    ExitCode(1, "the database refused or failed (the message says what)"),
)

HOUR_NS = 3600 * 10**9
_AGO = re.compile(r"^\d+(?:\.\d+)?(ns|us|µs|u|µ|ms|s|m|h|d|w)$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--start",
        required=True,
        metavar="TIME",
        help="from here (RFC 3339 such as 2026-01-05T00:00:00Z, a date (UTC), or a duration ago such as 3d)",
    )
    parser.add_argument("--stop", metavar="TIME", help="up to here, same forms (default now)")
    parser.add_argument(
        "--chunk", default="1d", metavar="DURATION", help="recompute this much per request (default 1d, whole hours)"
    )
    add_connection_flags(parser)


def parse_time(text: str, now_ns: int) -> int:
    """Nanoseconds of an RFC 3339 time, a date (midnight UTC), or a duration before ``now_ns``."""
    from gpulse.influx.durations import parse_duration

    t = text.strip()
    if _AGO.match(t):
        return now_ns - parse_duration(t)
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"not a time: {text!r} (examples: 2026-01-05T00:00:00Z, 2026-01-05, 3d)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp()) * 10**9 + dt.microsecond * 1000


def chunks(start_ns: int, stop_ns: int, chunk_ns: int) -> list[tuple[int, int]]:
    """``[start, stop)`` widened to whole hours and cut into pieces of ``chunk_ns`` (whole hours too)."""
    start, stop = start_ns // HOUR_NS * HOUR_NS, -(-stop_ns // HOUR_NS) * HOUR_NS
    step = max(HOUR_NS, chunk_ns // HOUR_NS * HOUR_NS)
    return [(t, min(t + step, stop)) for t in range(start, stop, step)]


def _when(ts_ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts_ns // 10**9))


def run(args: argparse.Namespace) -> int:
    from gpulse.agent.config import load_connection
    from gpulse.influx.durations import parse_duration
    from gpulse.influx.setup.common import SetupError
    from gpulse.influx.tiers import TIERS

    conn = load_connection(args)
    now = time.time_ns()
    start = parse_time(args.start, now)
    stop = parse_time(args.stop, now) if args.stop else now
    try:
        chunk_ns = parse_duration(args.chunk)
    except ValueError as e:
        raise ConfigError(f"--chunk: {e}") from None
    if stop <= start:
        raise ConfigError(f"--stop ({args.stop or 'now'}) must come after --start ({args.start})")
    from gpulse.influx.setup import downsample_now

    pieces = chunks(start, stop, chunk_ns)
    tiers = " and ".join(t.name for t in TIERS)
    print(
        f"gpulse recompute: the {tiers} tiers of {conn.describe()}, {_when(pieces[0][0])} to {_when(pieces[-1][1])} UTC"
    )
    began = time.monotonic()
    try:
        for i, (a, b) in enumerate(pieces, start=1):
            t0 = time.monotonic()
            downsample_now(conn, a, b)
            print(
                f"  {_when(a)} .. {_when(b)} UTC  done in {time.monotonic() - t0:.1f} s  ({i}/{len(pieces)})",
                flush=True,
            )
    except SetupError as e:
        print(f"gpulse recompute: {e}", file=sys.stderr)
        return 1
    print(f"gpulse recompute: {len(pieces)} range(s) recomputed in {time.monotonic() - began:.1f} s")
    return 0
