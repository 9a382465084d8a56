"""Panels of the host beside the GPUs (measurements ``host`` and ``host_process``), for the Node and
Training run dashboards: a starved DataLoader is a CPU or storage problem that GPU panels cannot show.

The Node dashboard gets the node's CPU (busy, iowait, steal), memory, disk and network beside its GPU
rows, and the CPU of the training processes on it; the Training run dashboard gets the run's own
processes (the training process and each DataLoader worker): their CPU, how often they are on a CPU
or blocked on disk (the shares the report's data-loading cases are judged by), and their memory.
"""

from __future__ import annotations

from gpulse.dashboards.builder import Panel, Query, timeseries
from gpulse.dashboards.units import BYTES, BYTES_PER_S, PERCENT

NODE_WHERE = '"host" =~ /^$host$/ AND $timeFilter'
BY_HOST = 'GROUP BY time($__interval), "host" fill(none)'
PER_HOST_COL = "$tag_host $col"
BY_PROCESS = 'GROUP BY time($__interval), "run", "rank", "process" fill(none)'
PER_PROCESS = "$tag_run rank $tag_rank $tag_process"
PER_PROCESS_COL = "rank $tag_rank $tag_process $col"
#: which run's processes: the Training run dashboard's selection
RUN_WHERE = '"run" =~ /^${run:regex}$/ AND "host" =~ /^$host$/ AND "rank" =~ /^$rank$/ AND $timeFilter'
RUN_BY_PROCESS = 'GROUP BY time($__interval), "rank", "process" fill(none)'


def _host(columns: str) -> str:
    return f'SELECT {columns} FROM "host" WHERE {NODE_WHERE} {BY_HOST}'


def node() -> list[Panel]:
    """The Node dashboard's host row."""
    return [
        timeseries(
            "Host CPU",
            "The node's CPU time, all CPUs together: busy (user, system, irq), iowait (idle while I/O was "
            "pending: storage too slow for the readers) and steal (taken by the hypervisor). A starved "
            "DataLoader shows as busy near 100 % (CPU-bound) or as iowait (I/O-bound) while the GPUs idle.",
            Query(
                _host(
                    'mean("cpu_busy_pct") AS "busy", mean("cpu_iowait_pct") AS "iowait", mean("cpu_steal_pct") AS "steal"'
                ),
                PERCENT,
                PER_HOST_COL,
            ),
            min=0,
            max=100,
            width=6,
        ),
        timeseries(
            "Host memory",
            "Memory available to new work without swapping, and swap in use: available falling towards zero "
            "with swap rising precedes the kernel killing DataLoader workers.",
            Query(
                _host('mean("mem_available_bytes") AS "available", mean("swap_used_bytes") AS "swap used"'),
                BYTES,
                PER_HOST_COL,
            ),
            min=0,
            width=6,
        ),
        timeseries(
            "Disk and network",
            "Bytes per second read from and written to the block devices, and received and sent on the network "
            "(loopback excluded): the input pipeline's reads show here.",
            Query(
                _host(
                    'mean("disk_read_bytes_per_s") AS "disk read", mean("disk_write_bytes_per_s") AS "disk write", '
                    'mean("net_recv_bytes_per_s") AS "net received", mean("net_sent_bytes_per_s") AS "net sent"'
                ),
                BYTES_PER_S,
                PER_HOST_COL,
            ),
            min=0,
            width=6,
        ),
        timeseries(
            "Busiest disk",
            "Busy time of the busiest block device: near 100 % it is at its limit for one queue of requests.",
            Query(_host('mean("disk_busy_pct") AS "busy"'), PERCENT, PER_HOST_COL),
            min=0,
            max=100,
            width=6,
        ),
        timeseries(
            "Training processes CPU",
            "CPU of each training process on the host and each of its DataLoader workers, in % of one core "
            "(100 = a full core).",
            Query(f'SELECT mean("cpu_pct") FROM "host_process" WHERE {NODE_WHERE} {BY_PROCESS}', PERCENT, PER_PROCESS),
            min=0,
            width=12,
            legend="wide",
        ),
        timeseries(
            "Training processes blocked on disk",
            "Share of samples each training process and worker was in uninterruptible sleep (state D): "
            "waiting for block I/O.",
            Query(
                f'SELECT mean("disk_sleep") * 100 FROM "host_process" WHERE {NODE_WHERE} {BY_PROCESS}',
                PERCENT,
                PER_PROCESS,
            ),
            min=0,
            max=100,
            width=12,
            legend="wide",
        ),
    ]


def run_processes() -> list[Panel]:
    """The Training run dashboard's row of the run's processes."""
    return [
        timeseries(
            "Process CPU",
            "CPU of the training process of each rank (main) and of each of its DataLoader workers, in % of one "
            "core. Workers near a full core each are CPU-bound; more of them help only while the host has "
            "free cores.",
            Query(
                f'SELECT mean("cpu_pct") FROM "host_process" WHERE {RUN_WHERE} {RUN_BY_PROCESS}',
                PERCENT,
                "rank $tag_rank $tag_process",
            ),
            min=0,
            width=8,
        ),
        timeseries(
            "On a CPU / blocked on disk",
            "Share of samples each process was running or waiting for a CPU (state R), and blocked on block "
            "I/O (state D): the shares the report's data-loading finding tells CPU-bound from I/O-bound by.",
            Query(
                'SELECT mean("running") * 100 AS "on a CPU", mean("disk_sleep") * 100 AS "blocked on disk" '
                f'FROM "host_process" WHERE {RUN_WHERE} {RUN_BY_PROCESS}',
                PERCENT,
                PER_PROCESS_COL,
            ),
            min=0,
            max=100,
            width=8,
        ),
        timeseries(
            "Process memory",
            "Resident memory of each process, and its proportional share (PSS: pages shared with other workers "
            "split among them, every ~10 s where the agent may read it). Workers' RSS counts the pages they "
            "share copy-on-write once each; PSS does not.",
            Query(
                'SELECT mean("mem_rss_bytes") AS "RSS", mean("mem_pss_bytes") AS "PSS" '
                f'FROM "host_process" WHERE {RUN_WHERE} {RUN_BY_PROCESS}',
                BYTES,
                PER_PROCESS_COL,
            ),
            min=0,
            width=8,
        ),
    ]
