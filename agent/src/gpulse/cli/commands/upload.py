"""``gpulse upload FILE...``: push a recording (a run's ``gpulse-records.rec`` or an agent ``--record`` file).

Every point is parsed and checked against the schema before it is sent (a run's packed step lines
are first written as the agent's encoder writes them, :func:`gpulse.channel.recording.read_records`);
a bad line is named by file and line number and skipped, never sent. The good lines go through the agent's own sink and
retry policy (:func:`gpulse.delivery.oneshot.deliver_batches`). Points carry their timestamps, so uploading a
file twice (or a file whose points the agent already wrote) overwrites instead of duplicating.

A person is waiting, so the server is asked first what it is (``/ping``): not InfluxDB, or the other
generation than ``--api``, stops before anything is read. The rule for the rest
(:func:`gpulse.influx.server.may_heal`, said in ``--help`` and in the banner): what will not get
better by waiting (a name that does not resolve, nothing listening on this machine, TLS,
credentials, a missing database or retention policy) stops at once, with the fix; what may pass (a
timeout, a reset, a refusal by another host, 429, 5xx) is retried, the probe included, until the
``--deadline`` counted from the start. Large files show
their progress: a bar on a terminal, a line every 10 s elsewhere.

Exit status: 0 everything sent; 1 some lines were not delivered (or the server could not be reached)
or the server rejected them; 2 configuration error (including ``--api`` not matching the server);
3 everything valid was sent but some lines were invalid and skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpulse.agent.connection_config import add_connection_flags
from gpulse.cli.exit_codes import ExitCode
from gpulse.influx.connection import ConfigError, Connection

if TYPE_CHECKING:
    from gpulse.influx.server import ServerInfo

EXIT_CODES = (
    ExitCode(0, "every line was sent"),
    ExitCode(1, "some lines were not delivered (unreachable server, deadline, or rejected by the server)"),
    ExitCode(3, "every valid line was sent, but some lines were invalid and skipped (named on stderr)"),
)

MAX_REPORTED = 20
#: The rule, said in --help and in the banner (:func:`gpulse.influx.server.may_heal` decides it).
MAY_HEAL = "timeouts, connection resets, a refusal by another host (its InfluxDB restarting), 429 and 5xx answers"
WILL_NOT_HEAL = (
    "what will not get better by waiting (a host name that does not resolve, nothing listening on this "
    "machine, a TLS failure, credentials, a missing database or retention policy)"
)
#: the first wait between two probes of a server that may come back (doubled up to PROBE_MAX_WAIT_S)
PROBE_FIRST_WAIT_S = 0.5
PROBE_MAX_WAIT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="recording(s) to push: line protocol, or a run's gpulse-records.rec"
    )
    parser.add_argument("--dry-run", action="store_true", help="only check the files; send nothing")
    parser.add_argument(
        "--deadline",
        type=float,
        default=300.0,
        metavar="S",
        help=f"retry {MAY_HEAL} for at most S seconds in all (default 300); {WILL_NOT_HEAL} fails at once",
    )
    parser.add_argument("--dead-letter", metavar="FILE", help="append lines the server rejects here, with the reason")
    add_connection_flags(parser)


class _Checked:
    """The valid lines of the files, read lazily; problems collected as they are met. ``stop`` ends it early."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.valid = 0
        self.bad: list[tuple[str, int, str]] = []
        self.stop = False
        self.times: list[int] = []  # oldest and newest timestamp of the valid lines (gpulse recompute advice)

    def __iter__(self) -> Iterator[str]:
        from gpulse.channel.recording import read_records
        from gpulse.channel.validate import check_line_point
        from gpulse.lineprotocol.parse import LineError

        self.valid, self.bad = 0, []
        for path in self.files:
            for lineno, raw, p in read_records(path):
                if self.stop:
                    return
                why = str(p) if isinstance(p, LineError) else check_line_point(p)
                if why:
                    self.bad.append((path, lineno, why))
                    continue
                self.valid += 1
                if p.ts is not None:
                    self.times = [min(self.times[0], p.ts), max(self.times[1], p.ts)] if self.times else [p.ts, p.ts]
                yield raw if raw.endswith("\n") else raw + "\n"


def count_lines(files: list[str]) -> int:
    """The points :func:`gpulse.channel.recording.read_records` will yield, quickly."""
    from gpulse.channel.recording import count_records

    return sum(count_records(path) for path in files)


def _report_bad(bad: list[tuple[str, int, str]]) -> None:
    for path, lineno, why in bad[:MAX_REPORTED]:
        print(f"{path}:{lineno}: skipped: {why}", file=sys.stderr)
    if len(bad) > MAX_REPORTED:
        print(f"... and {len(bad) - MAX_REPORTED} more invalid lines", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    for path in args.files:
        if not os.path.isfile(path):
            raise ConfigError(f"{path} is not a file")
    checked = _Checked(args.files)
    if args.dry_run:
        for _ in checked:
            pass
        _report_bad(checked.bad)
        print(f"checked {len(args.files)} file(s): {checked.valid} valid lines, {len(checked.bad)} invalid")
        return 3 if checked.bad else 0

    from gpulse.agent.config import load_connection
    from gpulse.delivery.oneshot import DeliveryResult, deliver_batches
    from gpulse.influx.downsample import lookback_advice
    from gpulse.influx.server import Problem, ServerProblem, may_heal
    from gpulse.sinks.factory import build_sinks
    from gpulse.sinks.influx import InfluxSink
    from gpulse.util.progress import Progress

    conn = load_connection(args)
    total = count_lines(args.files)
    ends = time.monotonic() + args.deadline
    deadline = time.strftime("%H:%M:%S", time.localtime(time.time() + args.deadline))
    try:
        info = _probe_until(conn, ends, f"{deadline} (--deadline {args.deadline:g} s)")
    except ServerProblem as e:
        if e.diagnosis.problem is Problem.WRONG_API:
            raise ConfigError(str(e)) from None
        why = "" if not e.heals else f"; gave up at the deadline (--deadline {args.deadline:g} s)"
        print(f"gpulse upload: {e}{why}. Nothing was sent.", file=sys.stderr)
        _summary(args, conn, written=0, skipped=0, rejected=0, failed=total)
        return 1
    (sink,) = build_sinks(conn, None)  # the database sink (no record file here)
    assert isinstance(sink, InfluxSink)
    sink.explainer.info = info  # asked once, above
    print(
        f"gpulse upload: {total:,} lines from {len(args.files)} file(s) to {info.describe()}, "
        f"{sink.describe()}; {MAY_HEAL} are retried until {deadline} (--deadline {args.deadline:g} s); "
        f"{WILL_NOT_HEAL} stops at once",
        file=sys.stderr,
    )
    bar = Progress(total, "lines", label="gpulse upload")

    def progress(res: DeliveryResult) -> None:
        checked.stop = res.error is not None or res.gave_up
        if not checked.stop:  # lines sent (or rejected by the server), and invalid lines skipped
            bar.update(res.written + res.rejected + len(checked.bad))

    try:
        res = deliver_batches(
            sink,
            checked,
            dead_letter_path=args.dead_letter,
            deadline_s=max(ends - time.monotonic(), 0.1),
            progress=progress,
            will_not_heal=lambda failure: not may_heal(failure, conn.url or ""),
        )
    finally:
        bar.finish()
        sink.close()
    _report_bad(checked.bad)
    failed = total - res.written - res.rejected - len(checked.bad)
    if res.gave_up:
        print(
            f"gpulse upload: gave up at the deadline (--deadline {args.deadline:g} s) while retrying: "
            f"{res.last_error}. Run the same command again to send the rest (re-sending is harmless: "
            "a point sent twice is stored once)",
            file=sys.stderr,
        )
    _summary(args, conn, written=res.written, skipped=len(checked.bad), rejected=res.rejected, failed=failed)
    advice = lookback_advice(*checked.times, conn) if res.written and checked.times else None
    if advice:  # older than what the tasks/continuous queries re-aggregate by themselves
        print(f"gpulse upload: {advice}")
    if res.rejected or failed:
        return 1
    return 3 if checked.bad else 0


def _probe_until(conn: Connection, ends: float, until: str) -> ServerInfo:
    """The server's answer to the probe, asked again while what is wrong may pass (``ServerProblem.heals``)
    and the deadline (``ends``, monotonic) leaves time; each try bounded by the time left."""
    from gpulse.influx.server import ServerProblem, probe_connection

    wait = PROBE_FIRST_WAIT_S
    while True:
        left = ends - time.monotonic()
        try:
            return probe_connection(dataclasses.replace(conn, timeout_s=max(0.1, round(min(conn.timeout_s, left), 1))))
        except ServerProblem as e:
            if not e.heals or time.monotonic() + wait >= ends:
                raise
            print(f"gpulse upload: {e.diagnosis.detail}; asking again in {wait:g} s, until {until}", file=sys.stderr)
        time.sleep(wait)
        wait = min(wait * 2, PROBE_MAX_WAIT_S)


def _summary(
    args: argparse.Namespace, conn: Connection, *, written: int, skipped: int, rejected: int, failed: int
) -> None:
    print(
        f"uploaded {written} lines from {len(args.files)} file(s) to {conn.describe()}; "
        f"{skipped} invalid lines skipped, {rejected} rejected by the server, {failed} not delivered"
    )
