"""``gpulse`` command line: one subcommand per module in :mod:`gpulse.cli.commands`.

Subcommand modules are imported only when chosen, so ``gpulse --help`` and every command start
fast, and a command's heavy imports never slow the others. Each module defines
``add_arguments(parser)``, ``run(args) -> int`` and ``EXIT_CODES`` (:mod:`gpulse.cli.exit_codes`:
its ``--help`` ends with them). ``-v`` works before or after the command's name.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from typing import Any

from gpulse import __version__
from gpulse.cli.exit_codes import CONFIG_ERROR, INTERRUPTED, PIPE_CLOSED, epilog

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


def command_module(name: str) -> Any:
    """The module of ``gpulse <name>`` (imported now)."""
    return importlib.import_module(f"gpulse.cli.commands.{COMMANDS[name][0]}")


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``gpulse <name>``: its own flags, ``-v``, and its exit statuses in the epilog."""
    module = command_module(name)
    parser = argparse.ArgumentParser(
        prog=f"gpulse {name}",
        description=COMMANDS[name][1],
        epilog=epilog(module.EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    if not any("--verbose" in a.option_strings for a in parser._actions):
        parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (also before the command)")
    return parser


def glue_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``--run -tmp-x`` as ``--run=-tmp-x`` for the ``flags`` whose values may begin with ``-`` (run
    ids named after an absolute path do): argparse takes such a value for an unknown option. A
    ``--flag`` after one is not its value (``--run --json`` still says the id is missing)."""
    out: list[str] = []
    glue = False
    for arg in argv:
        if glue and not arg.startswith("--"):
            out[-1] += f"={arg}"
            glue = False
        else:
            out.append(arg)
            glue = arg in flags
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    top = build_parser()
    # Parse the global part first; the chosen command's module builds its own parser.
    idx = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if idx is None:
        top.parse_args(argv)
        top.print_help()
        return CONFIG_ERROR
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
    module = command_module(name)
    args = command_parser(name).parse_args(glue_values(argv[idx + 1 :], getattr(module, "DASH_VALUES", ())))
    args.verbose = getattr(args, "verbose", False) or glob.verbose
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from gpulse.influx.connection import ConfigError

    try:
        status = int(module.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except ConfigError as e:
        print(f"gpulse {name}: configuration error: {e}", file=sys.stderr)
        return CONFIG_ERROR
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        return _pipe_closed()


def _pipe_closed() -> int:
    """The reader of stdout went away: stop quietly, as ``cat`` does (the Python docs' recipe in
    "Note on SIGPIPE": point stdout at /dev/null so the exit's flush cannot fail again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
