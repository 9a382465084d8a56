"""The checked-in downsampling files under ``influxdb/``, rendered from :mod:`gpulse.influx.downsample`.

``python -m gpulse.influx.render --write influxdb`` regenerates them (``make generate``); ``--check DIR``
fails when a file differs from what the code makes (the tests run it). A generator, not a runtime
module: setup creates the tasks and continuous queries from :mod:`gpulse.influx.downsample` directly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from gpulse.influx.downsample import GENERATED_NOTE, continuous_queries, flux_task
from gpulse.influx.tiers import TIERS, task_name


def generated_files(bucket: str = "gpulse", database: str = "gpulse") -> dict[str, str]:
    """Relative path under ``influxdb/`` -> text, for every generated file."""
    files = {f"tasks/{task_name(t)}.flux": flux_task(t, bucket) for t in TIERS}
    cqs = continuous_queries(database)
    files["v1/continuous-queries.influxql"] = (
        f"-- {GENERATED_NOTE}\n-- `gpulse setup --api v1` creates these (and the retention policies) for you.\n"
        + "".join(f"{q};\n" for q in cqs.values())
    )
    return files


def _stale(root: Path, files: dict[str, str]) -> Iterable[str]:
    for rel, text in files.items():
        p = root / rel
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            yield rel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpulse.influx.render", description=__doc__.split("\n")[0])
    ap.add_argument("--write", metavar="DIR", help="write the generated files under DIR (the repo's influxdb/)")
    ap.add_argument("--check", metavar="DIR", help="exit 1 when a file under DIR differs from the generated text")
    args = ap.parse_args(argv)
    files = generated_files()
    if args.write:
        for rel, text in files.items():
            p = Path(args.write) / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
    if args.check:
        stale = list(_stale(Path(args.check), files))
        if stale:
            print(f"out of date (run 'make generate'): {', '.join(stale)}", file=sys.stderr)
            return 1
    if not (args.write or args.check):
        for rel, text in files.items():
            sys.stdout.write(f"=== {rel}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
