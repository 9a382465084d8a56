"""``gpulse upload FILE...``: push a recording (a run's ``gpulse-records.lp`` or an agent ``--record`` file).

Every line is parsed and checked against the schema before it is sent; a bad line is named by
file and line number and skipped, never sent. The good lines go through the agent's own sink and
retry policy (``gpulse.delivery.pipeline.deliver_batches``). Points carry their timestamps, so uploading a
file twice (or a file whose points the agent already wrote) overwrites instead of duplicating.

Exit status: 0 everything sent; 1 some lines were not delivered or the server rejected them;
2 configuration error; 3 everything valid was sent but some lines were invalid and skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from gpulse.influx.connection import ConfigError, add_connection_flags

MAX_REPORTED = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="line-protocol recording(s) to push")
    parser.add_argument("--dry-run", action="store_true", help="only check the files; send nothing")
    parser.add_argument(
        "--deadline", type=float, default=300.0, metavar="S", help="give up retrying after S seconds (default 300)"
    )
    parser.add_argument("--dead-letter", metavar="FILE", help="append lines the server rejects here, with the reason")
    parser.add_argument("--config", metavar="FILE", help="TOML file with a [connection] table (env GPULSE_CONFIG)")
    add_connection_flags(parser)


class _Checked:
    """The valid lines of the files, read lazily; problems collected as they are met."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.valid = 0
        self.bad: list[tuple[str, int, str]] = []

    def __iter__(self) -> Iterator[str]:
        from gpulse.channel.validate import check_line_point
        from gpulse.lineprotocol.parse import LineError, read_lines

        self.valid, self.bad = 0, []
        for path in self.files:
            for lineno, raw, p in read_lines(path):
                why = str(p) if isinstance(p, LineError) else check_line_point(p)
                if why:
                    self.bad.append((path, lineno, why))
                    continue
                self.valid += 1
                yield raw if raw.endswith("\n") else raw + "\n"


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

    from gpulse.cli.commands.report import connection_from
    from gpulse.delivery.oneshot import deliver_batches
    from gpulse.sinks.factory import build_sinks

    conn = connection_from(args)
    sinks = [s for s in build_sinks(conn, None) if s.is_database]
    written = rejected = failed = 0
    try:
        for sink in sinks:
            res = deliver_batches(sink, checked, dead_letter_path=args.dead_letter, deadline_s=args.deadline)
            written += res.written
            rejected += res.rejected
            failed += res.failed
    finally:
        for sink in sinks:
            sink.close()
    _report_bad(checked.bad)
    print(
        f"uploaded {written} lines from {len(args.files)} file(s) to {conn.describe()}; "
        f"{len(checked.bad)} invalid lines skipped, {rejected} rejected by the server, {failed} not delivered"
    )
    if rejected or failed:
        return 1
    return 3 if checked.bad else 0
