"""``python -m gpulse.dashboards [--check] [ROOT]``: write (or verify) the generated Grafana files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulse.dashboards import check, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulse.dashboards", description=__doc__)
    parser.add_argument("root", nargs="?", default=".", help="repository root (default: current directory)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a checked-in file differs from the generator")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.check:
        stale = check(root)
        for rel in stale:
            print(f"out of date: {rel} (run make generate)", file=sys.stderr)
        return 1 if stale else 0
    for rel in write(root):
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
