"""``make bench``: every benchmark, a readable table, and one JSON object as the very last line.

Each figure is printed beside a baseline measured in the same run on the same machine, since
absolute times on a shared 2-core machine mean little. ``BENCH_QUICK=1`` runs a small version
(the test suite checks that it works). See BENCHMARKS.md for the figures and the machine.
"""

from __future__ import annotations

import json
import platform
import sys
import time

import bench_e2e
import bench_encoding
import bench_findings
import bench_host
import bench_import
import bench_ingest
import bench_memory
import bench_profile
import bench_sampling
import bench_step
from common import QUICK, Table

SECTIONS = (
    ("1. encoding", bench_encoding),
    ("2. sampling cost", bench_sampling),
    ("3. training step overhead", bench_step),
    ("4. ingest", bench_ingest),
    ("5. end to end", bench_e2e),
    ("6. memory", bench_memory),
    ("7. import", bench_import),
    ("8. host sampling", bench_host),
    ("9. profiler window", bench_profile),
    ("10. live findings", bench_findings),
)
KEYS = (
    "encoder_speedup",
    "cycle_wall_ms_per_gpu_1gpu",
    "cycle_wall_ms_per_gpu_8gpu",
    "nvml_calls_per_gpu_cycle",
    "cycle_cpu_ms_8gpu_1hz",
    "cycle_cpu_ms_8gpu_10hz",
    "cycle_cpu_ratio_vs_bare_nvml",
    "step_overhead_us",
    "step_overhead_us_agent_absent",
    "step_background_cpu_us",
    "step_background_cpu_us_agent_absent",
    "step_hot_us",
    "step_hot_ratio_vs_python_floor",
    "ingest_records_per_s",
    "ingest_ratio_vs_bare_recv",
    "e2e_ratio_vs_bulk_post",
    "agent_rss_mib_start",
    "agent_rss_mib_end",
    "training_import_ms",
    "import_ratio_vs_torch",
    "cycle_cpu_ratio_host_vs_without",
    "profile_step_ratio_open_vs_closed",
    "step_ratio_live_findings_on_vs_off",
)


def main() -> int:
    t0 = time.monotonic()
    print(f"gpulse benchmarks{' (BENCH_QUICK)' if QUICK else ''}: Python {platform.python_version()}, "
          f"{platform.machine()}, {platform.node()}", flush=True)  # fmt: skip
    table = Table()
    results: dict[str, float] = {}
    for title, module in SECTIONS:
        print(f"\n{title}", flush=True)
        results.update(module.run(table))
    print(f"\nall figures ({time.monotonic() - t0:.0f} s):\n{table.render()}\n", flush=True)
    missing = [k for k in KEYS if k not in results]
    if missing:
        print(f"missing figures: {missing}", file=sys.stderr)
        return 1
    print(json.dumps({k: results[k] for k in KEYS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
