"""Node dashboard: what every GPU of a host is doing, and why it may be slower than it could be.

Busy % (NVML utilization.gpu) is shown next to SM and tensor activity because a single resident
kernel reads 100 % busy; the gap between the two is the first thing to look at.
"""

from __future__ import annotations

from gpulse.dashboards.builder import Dashboard, Query, bargauge, stat, table, timeseries
from gpulse.schema import CLOCK_EVENT_FLAGS, THROTTLE_MASK

SEL = '"host" =~ /^$host$/ AND "gpu" =~ /^$gpu$/'
WHERE = f"{SEL} AND $timeFilter"
BY_GPU = 'GROUP BY time($__interval), "host", "gpu" fill(none)'
PER_GPU = "$tag_host GPU $tag_gpu"


def _gpu_mean(field: str, alias: str = PER_GPU, scale: str = "") -> Query:
    return Query(f'SELECT mean("{field}"){scale} FROM "gpu" WHERE {WHERE} {BY_GPU}', alias)


def _gpu_cols(*cols: tuple[str, str]) -> Query:
    """Several mean() columns per GPU; ``cols`` are (field, legend name)."""
    sel = ", ".join(f'mean("{f}") AS "{name}"' for f, name in cols)
    return Query(f'SELECT {sel} FROM "gpu" WHERE {WHERE} {BY_GPU}', "$tag_host GPU $tag_gpu $col")


def _throttle_reasons() -> Query:
    cols = ", ".join(
        f'mean("{name}") * 100 AS "{text}"' for bit, name, text in CLOCK_EVENT_FLAGS if bit & THROTTLE_MASK
    )
    return Query(f'SELECT {cols} FROM "gpu" WHERE {WHERE} {BY_GPU}', "$tag_host GPU $tag_gpu $col")


def build() -> Dashboard:
    d = Dashboard(
        "gpulse-node",
        "gpulse / Node",
        "GPUs",
        "node",
        "Per-GPU activity, memory, power, thermals, clocks, throttling, interconnect, processes and XID/ECC events of one host.",
        time_from="now-1h",
        refresh="10s",
    )
    d.variable("host", "Host", 'SHOW TAG VALUES FROM "gpu" WITH KEY = "host"')
    d.variable("gpu", "GPU", 'SHOW TAG VALUES FROM "gpu" WITH KEY = "gpu" WHERE "host" =~ /^$host$/', numeric_sort=True)
    d.annotation(
        "XID / ECC events",
        'SELECT "text", "kind", "xid" FROM "gpu_event" WHERE "host" =~ /^$host$/ AND "gpu" =~ /^$gpu$/ AND $timeFilter',
        text="text",
        tags="kind",
        color="red",
    )

    d.row(
        "Overview",
        stat(
            "GPUs reporting",
            "Distinct GPUs with a sample in the time range.",
            Query(
                f'SELECT count("last") FROM (SELECT last("util_gpu_pct") AS "last" FROM "gpu" WHERE {WHERE} GROUP BY "host", "gpu")'
            ),
        ),
        stat(
            "Mean busy",
            "Average NVML busy time across the selected GPUs (a kernel was running; not how much of the GPU it used).",
            Query(f'SELECT mean("util_gpu_pct") FROM "gpu" WHERE {WHERE}'),
            unit="percent",
            decimals=1,
        ),
        stat(
            "Mean SM activity",
            "Average fraction of SMs busy (GPM, Hopper and later). Much lower than busy % means small or latency-bound kernels.",
            Query(f'SELECT mean("sm_active_pct") FROM "gpu" WHERE {WHERE}'),
            unit="percent",
            decimals=1,
        ),
        stat(
            "Time throttled",
            "Share of samples in which power, thermal, hardware-slowdown or sync-boost reasons held the clocks back.",
            Query(f'SELECT mean("throttled") * 100 FROM "gpu" WHERE {WHERE}'),
            unit="percent",
            decimals=1,
        ),
    )
    d.row(
        "Activity",
        timeseries(
            "GPU busy %",
            "NVML utilization.gpu: share of time at least one kernel ran. A single tiny kernel reads 100 %; compare with SM activity.",
            _gpu_mean("util_gpu_pct"),
            unit="percent",
            min=0,
            max=100,
            width=8,
        ),
        timeseries(
            "SM activity %",
            "GPM SM activity: the fraction of SMs with work, averaged over the sampling cycle.",
            _gpu_mean("sm_active_pct"),
            unit="percent",
            min=0,
            max=100,
            width=8,
        ),
        timeseries(
            "Tensor activity %",
            "GPM tensor-pipe activity: how much of the time the tensor cores were issuing (the MFU proxy).",
            _gpu_mean("tensor_active_pct"),
            unit="percent",
            min=0,
            max=100,
            width=8,
        ),
    )
    d.row(
        "Memory",
        timeseries(
            "Memory used / reserved / total",
            "Device memory used by processes, reserved by the driver, and the total (NVML v2 memory info).",
            _gpu_cols(("mem_used_bytes", "used"), ("mem_reserved_bytes", "reserved"), ("mem_total_bytes", "total")),
            unit="bytes",
            min=0,
        ),
        timeseries(
            "Memory bandwidth",
            "Memory-controller busy time (NVML utilization.memory) and GPM DRAM bandwidth utilisation.",
            _gpu_cols(("util_mem_pct", "controller busy %"), ("dram_bw_pct", "DRAM bandwidth %")),
            unit="percent",
            min=0,
        ),
    )
    d.row(
        "Power and thermals",
        timeseries(
            "Power vs limit",
            "Board power draw against the enforced power limit; a flat line at the limit means power capping.",
            _gpu_cols(("power_w", "power"), ("power_limit_w", "limit")),
            unit="watt",
            min=0,
            width=8,
        ),
        timeseries(
            "Energy per interval",
            "Energy used in each interval, from the driver's energy counter (resets on driver reload are skipped).",
            Query(
                f'SELECT non_negative_difference(last("energy_mj")) / 1000 FROM "gpu" WHERE {WHERE} {BY_GPU}',
                PER_GPU,
            ),
            unit="joule",
            min=0,
            width=8,
        ),
        timeseries(
            "Temperatures",
            "GPU die and HBM temperatures.",
            _gpu_cols(("temp_gpu_c", "die"), ("temp_mem_c", "memory")),
            unit="celsius",
            width=8,
        ),
    )
    d.row(
        "Clocks and throttling",
        timeseries(
            "SM clock vs max",
            "SM clock per GPU; the dashed line is the maximum SM clock from gpu_info (written at agent start).",
            _gpu_mean("clock_sm_mhz"),
            Query(
                'SELECT max("clock_sm_max_mhz") AS "max" FROM "gpu_info" WHERE "host" =~ /^$host$/ AND "gpu" =~ /^$gpu$/',
                table=True,
            ),
            unit="rotmhz",
            min=0,
            custom={"thresholdsStyle": {"mode": "dashed"}},
            transformations=[
                {
                    "id": "configFromData",
                    "options": {
                        "configRefId": "B",
                        "mappings": [{"fieldName": "max", "handlerKey": "threshold1"}],
                        "applyTo": {"id": "byFrameRefID", "options": "A"},
                    },
                }
            ],
        ),
        timeseries(
            "Throttle reasons (% of time)",
            "Share of samples in which each clock-event reason held the clocks back (idle, application-clock and display reasons excluded).",
            _throttle_reasons(),
            unit="percent",
            min=0,
            stacked=True,
            bars=True,
        ),
    )
    d.row(
        "Interconnect",
        timeseries(
            "PCIe throughput",
            "PCIe transmit and receive rates (NVML 20 ms window).",
            _gpu_cols(("pcie_tx_bytes_per_s", "tx"), ("pcie_rx_bytes_per_s", "rx")),
            unit="Bps",
            min=0,
        ),
        timeseries(
            "NVLink throughput",
            "NVLink transmit and receive rates over all links, derived from the driver's byte counters.",
            Query(
                'SELECT non_negative_derivative(last("nvlink_tx_kib"), 1s) * 1024 AS "tx", '
                'non_negative_derivative(last("nvlink_rx_kib"), 1s) * 1024 AS "rx" '
                f'FROM "gpu" WHERE {WHERE} {BY_GPU}',
                "$tag_host GPU $tag_gpu $col",
            ),
            unit="Bps",
            min=0,
        ),
    )
    d.row(
        "Processes and errors",
        table(
            "Processes",
            "Processes holding each GPU in the time range, latest sample first: pid, command, user, container and memory.",
            Query(
                'SELECT "pid", "command", "user", "container", "mem_used_bytes", "sm_util_pct" FROM "gpu_process" '
                f'WHERE {WHERE} GROUP BY "host", "gpu" ORDER BY time DESC LIMIT 200',
                table=True,
            ),
            width=16,
        ),
        bargauge(
            "ECC errors and retired pages",
            "Lifetime corrected/uncorrected ECC errors, remapped rows and retired pages per GPU (any uncorrected error deserves a look).",
            Query(
                'SELECT last("ecc_corrected_aggregate") AS "ECC corrected", last("ecc_uncorrected_aggregate") AS "ECC uncorrected", '
                'last("remapped_rows_uncorrectable") AS "rows remapped", last("retired_pages_dbe") AS "pages retired (DBE)" '
                f'FROM "gpu" WHERE {WHERE} GROUP BY "host", "gpu"',
                "$tag_host GPU $tag_gpu $col",
            ),
            width=8,
        ),
        table(
            "GPU events",
            "XID, ECC and GPU-lost events in the time range (also shown as annotations on every graph).",
            Query(
                f'SELECT "kind", "xid", "text" FROM "gpu_event" WHERE {WHERE} GROUP BY "host", "gpu" ORDER BY time DESC LIMIT 100',
                table=True,
            ),
            width=12,
            height=6,
        ),
        table(
            "GPU inventory",
            "What each GPU is (from gpu_info, written at agent start): model, driver, limits and maximum clocks.",
            Query(
                'SELECT last("name") AS "name", last("driver_version") AS "driver", last("mem_total_bytes") AS "memory", '
                'last("power_limit_w") AS "power limit W", last("clock_sm_max_mhz") AS "max SM MHz", '
                'last("pcie_max_gen") AS "PCIe gen", last("nvlink_links") AS "NVLink links" '
                'FROM "gpu_info" WHERE "host" =~ /^$host$/ AND "gpu" =~ /^$gpu$/ GROUP BY "host", "gpu"',
                table=True,
            ),
            width=12,
            height=6,
        ),
    )
    return d
