"""Issue 26's ratio keys for one source tree, as one JSON line: to compare checkouts in the same hour.

``make bench`` measures the tree it lives in; this measures whichever ``gpulse`` is first on
``sys.path``, with this directory's benchmarks, so that two checkouts are measured by the same code
(an older one needs only ``agent/src``; its C extension, if it had one, built in place). Run the
trees in alternating order, several rounds each::

    cd bench && PYTHONPATH=/path/to/checkout/agent/src ../.venv/bin/python ratios.py cycle,step,ingest,import

Sections: ``cycle`` (the agent against bare NVML, one run each, as ``make bench`` takes them),
``step``, ``ingest`` and ``import`` (each its ``make bench`` section, whole). The line names the
tree measured (``tree``: the directory holding ``gpulse``) and the time it started.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from common import Table

import gpulse

SECTIONS = ("cycle", "step", "ingest", "import")


def cycle() -> dict[str, float]:
    """One round of ``make bench``'s agent-against-plain-loop comparison (``bench_sampling.against_bare``)."""
    import bench_sampling
    from support.influxd import InfluxDB1

    with tempfile.TemporaryDirectory() as tmp:
        server = InfluxDB1(Path(tmp) / "influxd").start()
        server.create_database("gpulse")
        try:
            agent, bare = bench_sampling.against_bare(Path(tmp), server.url)
        finally:
            server.stop()
    ours, theirs = agent.figures["total_ms"], bare["total_ms"]
    return {
        "agent_cpu_ms_per_cycle": round(ours, 3),
        "bare_nvml_cpu_ms_per_cycle": round(theirs, 3),
        "cycle_cpu_ratio_vs_bare_nvml": round(ours / theirs, 3),
    }


def main(argv: list[str]) -> int:
    wanted = argv[0].split(",") if argv else list(SECTIONS)
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        print(f"ratios.py: unknown section(s) {unknown}; choose from {','.join(SECTIONS)}", file=sys.stderr)
        return 2
    out: dict[str, object] = {"tree": str(Path(gpulse.__file__).parents[1]), "at": time.strftime("%H:%M:%S")}
    table = Table()
    for name in wanted:
        if name == "cycle":
            out.update(cycle())
        else:
            out.update(__import__(f"bench_{name}").run(table))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
