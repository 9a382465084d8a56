"""``gpulse schema``: print the data model as Markdown (the text of docs/schema.md)."""

from __future__ import annotations

import argparse
import sys

from gpulse.cli.exit_codes import ExitCode

EXIT_CODES = (
    ExitCode(0, "printed (with --check: the file is up to date)"),
    ExitCode(1, "with --check: the file is out of date"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the generated text")


def run(args: argparse.Namespace) -> int:
    from gpulse.docs.schema import render_markdown

    text = render_markdown()
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.check} is out of date: run 'make generate'", file=sys.stderr)
                return 1
        return 0
    sys.stdout.write(text)
    return 0
