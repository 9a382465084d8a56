"""``gpulse doctor``: check driver, containers, database, token, layout, downsampling, clock, socket
and spool, one line each (✔ / ✘ / – not applicable), every failure with its fix. Exit 0 only when
nothing failed.

It reads the same settings as the agent (``--config`` TOML < ``GPULSE_*`` < flags), so it checks the
configuration the agent on this node will actually run with.
"""

from __future__ import annotations

import argparse
import sys

from gpulse.agent.connection_config import add_connection_flags
from gpulse.cli.exit_codes import ExitCode

EXIT_CODES = (
    ExitCode(0, "no check failed"),
    ExitCode(1, "a check failed (its line says the fix)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gpulse.agent.config import SIMULATE_MODELS
    from gpulse.cli.doctor import CHECK_NAMES

    add_connection_flags(parser)
    parser.add_argument("--spool-dir", metavar="DIR", help="the agent's spool (default $XDG_STATE_HOME/gpulse/spool)")
    parser.add_argument(
        "--socket", metavar="PATH", help="the agent's socket (default $XDG_RUNTIME_DIR/gpulse/agent.sock)"
    )
    parser.add_argument("--socket-group", metavar="GROUP", help="the agent's --socket-group, trusted like the user")
    parser.add_argument(
        "--simulate", type=int, metavar="N", help="check the agent as it runs with N simulated GPUs (no GPU needed)"
    )
    parser.add_argument("--simulate-model", metavar="MODEL", help=f"with --simulate: {', '.join(SIMULATE_MODELS)}")
    parser.add_argument(
        "--skip",
        action="append",
        choices=CHECK_NAMES,
        default=[],
        metavar="CHECK",
        help=f"do not run CHECK (repeatable): {', '.join(CHECK_NAMES)}",
    )


def run(args: argparse.Namespace) -> int:
    from gpulse.agent.config import load_config
    from gpulse.cli.doctor import report

    text, status = report(load_config(args), args.skip)
    sys.stdout.write(text)
    return status
