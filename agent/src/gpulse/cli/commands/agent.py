"""``gpulse agent``: sample this node's GPUs and training runs and deliver them to InfluxDB.

Settings come from the TOML file (``--config``) < ``GPULSE_*`` environment < these flags; see
``gpulse.toml.example``. Every flag defaults to ``None`` here so that an absent flag lets the
environment and the file speak (the real defaults live in :class:`gpulse.agent.config.AgentConfig`).
"""

from __future__ import annotations

import argparse

from gpulse.agent.connection_config import add_connection_flags
from gpulse.agent.loop import EXIT_ANOTHER_AGENT, EXIT_FAILURE, EXIT_NO_DRIVER, EXIT_OK
from gpulse.cli.exit_codes import ExitCode

EXIT_CODES = (
    ExitCode(EXIT_OK, "stopped as asked (signal or --duration); with --check: every check passed"),
    ExitCode(
        EXIT_FAILURE, "could not start (spool or record file), or the GPU source failed; with --check: a check failed"
    ),
    ExitCode(EXIT_NO_DRIVER, "no GPU driver (NVML does not load); the message says how to run simulated GPUs"),
    ExitCode(
        EXIT_ANOTHER_AGENT,
        "another agent already runs on this socket or for this destination (the message names its PID)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_flags(parser)
    g = parser.add_argument_group("sampling")
    g.add_argument("--interval", type=float, metavar="S", help="sampling interval in seconds (default 1, minimum 0.1)")
    g.add_argument("--simulate", type=int, metavar="N", help="simulate N GPUs instead of reading NVML")
    g.add_argument("--simulate-model", metavar="MODEL", help="H100 (default), A100 or RTX4090")
    g.add_argument("--seed", type=int, metavar="N", help="seed of the simulated GPUs (default 0)")
    g.add_argument(
        "--no-host-metrics",
        action="store_true",
        default=None,
        help="do not sample the host's CPU, memory, disks, network and training processes",
    )
    g.add_argument(
        "--slurm-job-dir",
        metavar="DIR",
        help="read the GPU-to-job mapping a Slurm prolog writes here (deploy/slurm/prolog.sh: "
        "/run/gpulse/slurm-jobs), for GPU processes whose cgroup names no job",
    )
    g.add_argument("--host", metavar="NAME", help="host tag (default: this machine's hostname)")
    g.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: run until signalled)")
    g.add_argument(
        "--self-metrics-interval",
        type=float,
        metavar="S",
        help="write the agent's own health every S seconds (default 10)",
    )
    g.add_argument(
        "--status-interval",
        type=float,
        metavar="S",
        help="log the status line every S seconds when stderr is no terminal (default 30)",
    )
    live = parser.add_argument_group("rolling findings (the diagnosis while a run is going)")
    live.add_argument(
        "--live-window-steps", type=int, metavar="N", help="judge the last N steps of each run (default 100) ..."
    )
    live.add_argument(
        "--live-window-s", type=float, metavar="S", help="... or its last S seconds if longer (default 120)"
    )
    live.add_argument("--live-every-s", type=float, metavar="S", help="evaluate the rules every S seconds (default 5)")
    live.add_argument(
        "--no-live-findings",
        action="store_true",
        default=None,
        help="judge no rolling findings (the end-of-run diagnosis is unchanged)",
    )
    d = parser.add_argument_group("delivery")
    d.add_argument(
        "--flush-interval", type=float, metavar="S", help="send a batch at least every S seconds (default 1)"
    )
    d.add_argument("--spool-dir", metavar="DIR", help="disk spool (default $XDG_STATE_HOME/gpulse/spool)")
    d.add_argument(
        "--spool-max-bytes", metavar="N", help="spool size cap, e.g. 1GiB (default); oldest data dropped beyond"
    )
    d.add_argument("--max-lines", type=int, metavar="N", help="lines per write request at most (default 5000)")
    d.add_argument("--max-bytes", metavar="N", help="bytes per write request at most, e.g. 4MiB (default)")
    d.add_argument(
        "--replay-spool-to-new-destination",
        action="store_true",
        default=None,
        help="replay data spooled for another destination (URL, API, org/bucket, database) into this one; "
        "without it, such a spool is kept aside and logged",
    )
    d.add_argument("--record", metavar="FILE", help="also append the line protocol to FILE (only FILE without --url)")
    d.add_argument(
        "--shutdown-timeout",
        type=float,
        metavar="S",
        help="on SIGTERM, deliver for at most S seconds, then spool (default 5)",
    )
    d.add_argument(
        "--summary-file",
        metavar="FILE",
        help="at exit, write the final counts (samples, points per measurement, lines written/spooled/dropped) "
        "to FILE as JSON, for scripts",
    )
    t = parser.add_argument_group("training channel")
    t.add_argument(
        "--socket",
        metavar="PATH",
        help="Unix socket training runs send to (default $XDG_RUNTIME_DIR/gpulse/agent.sock)",
    )
    t.add_argument("--socket-group", metavar="GROUP", help="let members of GROUP send to the socket too")
    t.add_argument("--no-socket", action="store_true", default=None, help="do not open the training channel")
    parser.add_argument("--check", action="store_true", help="check config, GPUs and database, print a verdict, exit")


def run(args: argparse.Namespace) -> int:
    from gpulse.agent.config import load_config
    from gpulse.influx.connection import ConfigError

    try:
        cfg = load_config(args)
    except ConfigError as e:
        if not args.check:
            raise
        from gpulse.cli.agent_check import invalid_config

        return invalid_config(e)
    if args.check:
        from gpulse.cli.agent_check import run as run_checks

        return run_checks(cfg)
    from gpulse.agent.loop import Agent

    return Agent(cfg).run()
