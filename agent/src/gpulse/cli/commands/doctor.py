"""``gpulse doctor``: check driver, containers, database, token, layout, downsampling, clock, socket
and spool, one line each (✔ / ✘ / – not applicable), every failure with its fix. Exit 0 only when
nothing failed.

It reads the same settings as the agent (``--config`` TOML < ``GPULSE_*`` < flags), so it checks the
configuration the agent on this node will actually run with.
"""

from __future__ import annotations

import argparse
import sys

from gpulse.influx.connection import add_connection_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gpulse.cli.doctor import CHECKS

    parser.add_argument("--config", metavar="FILE", help="the agent's TOML file (env GPULSE_CONFIG)")
    add_connection_flags(parser)
    parser.add_argument("--spool-dir", metavar="DIR", help="the agent's spool (default $XDG_STATE_HOME/gpulse/spool)")
    parser.add_argument(
        "--socket", metavar="PATH", help="the agent's socket (default $XDG_RUNTIME_DIR/gpulse/agent.sock)"
    )
    parser.add_argument(
        "--skip",
        action="append",
        choices=CHECKS,
        default=[],
        metavar="CHECK",
        help=f"do not run CHECK (repeatable): {', '.join(CHECKS)}",
    )


def run(args: argparse.Namespace) -> int:
    from gpulse.agent.config import load_config
    from gpulse.cli.doctor import render, run_checks

    cfg = load_config(args)
    results = run_checks(cfg, args.skip)
    sys.stdout.write(render(results, cfg.connection))
    return 1 if any(r.status == "fail" for r in results) else 0
