"""``gpulse`` command line: one subcommand per module in :mod:`gpulse.cli.commands`.

Subcommand modules are imported only when chosen, so ``gpulse --help`` and every command start
fast, and a command's heavy imports never slow the others. Each module defines
``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys

from gpulse import __version__

#: name -> (module under gpulse.cli.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("agent", "sample GPUs and training runs on this node and deliver to InfluxDB"),
    "setup": ("setup", "create buckets, retention policies, downsampling and tokens (idempotent)"),
    "recompute": ("recompute", "rebuild the 1m and 1h tiers of a time range (after an outage or an old upload)"),
    "upload": ("upload", "push a recording (agent --record or a training run's fallback file) to InfluxDB"),
    "report": ("report", "build a run's metrics_report.json, diagnosis and HTML report"),
    "demo": ("demo", "fill InfluxDB with a simulated 8-GPU node and training run"),
    "doctor": ("doctor", "check driver, database, tokens, tasks, socket and spool, each with a fix"),
    "status": ("status", "the running agent's own view through its socket"),
    "schema": ("schema", "print the data model (docs/schema.md)"),
}

#: The modules of the agent's dependencies (the ``agent`` extra in agent/pyproject.toml), which a
#: training environment's ``pip install gpulse`` leaves out; only the commands below run without them.
AGENT_EXTRA_MODULES = ("pynvml", "tenacity", "docker", "psutil")
WITHOUT_AGENT_EXTRA = frozenset(("report", "schema"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpulse", description="GPU training, made visible.")
    parser.add_argument("--version", action="version", version=f"gpulse {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    top = build_parser()
    # Parse the global part first; the chosen command's module builds its own parser.
    idx = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if idx is None:
        top.parse_args(argv)
        top.print_help()
        return 2
    glob = top.parse_args(argv[:idx]) if idx else argparse.Namespace(verbose=False)
    name = argv[idx]
    missing = (
        [] if name in WITHOUT_AGENT_EXTRA else [m for m in AGENT_EXTRA_MODULES if importlib.util.find_spec(m) is None]
    )
    if missing:
        print(
            f"gpulse {name}: this environment lacks the agent's dependencies ({', '.join(missing)}); "
            "install gpulse with its agent extra: pip install 'gpulse[agent]'",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"gpulse.cli.commands.{COMMANDS[name][0]}")
    parser = argparse.ArgumentParser(prog=f"gpulse {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(argv[idx + 1 :])
    args.verbose = getattr(args, "verbose", False) or glob.verbose
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from gpulse.influx.connection import ConfigError

    try:
        return int(module.run(args) or 0)
    except ConfigError as e:
        print(f"gpulse {name}: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
