"""Node dashboard: what every GPU of a host is doing, and why it may be slower than it could be.

Busy % (NVML utilization.gpu) is shown next to SM and tensor activity because a single resident
kernel reads 100 % busy; the gap between the two is the first thing to look at. ``$host`` holds
one host by default (the first), so a 64-GPU node opens with 64 series, not 64 times the hosts;
per-GPU graphs keep a narrow legend at the side so the plot keeps its width, and the tooltip lists
the GPUs sorted by value. ``$job`` narrows ``$gpu`` to the GPUs a job (Slurm job id or pod UID,
the ``job`` tag of ``gpu`` points) held in the range; its "All" also keeps GPUs no job held.
"""

from __future__ import annotations

from gpulse.dashboards import host_panels
from gpulse.dashboards.builder import (
    Annotation,
    Column,
    Dashboard,
    Link,
    Query,
    Variable,
    any_job,
    bargauge,
    join,
    organize,
    stat,
    table,
    timeseries,
)
from gpulse.dashboards.units import (
    BYTES,
    BYTES_PER_S,
    CELSIUS,
    COUNT,
    ID,
    JOULE,
    MHZ,
    PCIE_GEN,
    PCIE_LANES,
    PERCENT,
    PSTATE,
    RATIO,
    SHARE_OF_LIMIT,
    TEMPERATURE,
    THROTTLED,
    TIME_AGO,
    WATT,
    Unit,
    any_is_bad,
    rising,
)
from gpulse.schema import CLOCK_EVENT_FLAGS, THROTTLE_MASK

UID = "gpulse-node"
SEL = '"host" =~ /^$host$/ AND "gpu" =~ /^$gpu$/'
WHERE = f"{SEL} AND $timeFilter"
#: gpu_info is written at agent start and every hour: what was known by the end of the range,
#: looked for from a day before it (a bounded read, as InfluxDB 3 needs).
INFO_WHERE = f"{SEL} AND time >= ${{__from}}ms - 1d AND time <= ${{__to}}ms"
JOB = any_job('SHOW TAG VALUES FROM "gpu" WITH KEY = "job" WHERE "host" =~ /^$host$/ AND $timeFilter')
BY_GPU = 'GROUP BY time($__interval), "host", "gpu" fill(none)'
BY_TIME = "GROUP BY time($__interval) fill(none)"
PER_GPU = "$tag_host GPU $tag_gpu"
PER_GPU_COL = "$tag_host GPU $tag_gpu $col"

#: Clock-event reasons that mean "slower than it could be", as (field, legend).
THROTTLE_FLAGS = tuple((name, text) for bit, name, text in CLOCK_EVENT_FLAGS if bit & THROTTLE_MASK)
#: The driver's cumulative throttle-time counters (µs), as (field, legend).
THROTTLE_COUNTERS = (
    ("throttle_power_us", "power"),
    ("throttle_thermal_us", "thermal"),
    ("throttle_sync_boost_us", "sync boost"),
    ("throttle_board_limit_us", "board limit"),
    ("throttle_low_util_us", "low utilisation"),
    ("throttle_reliability_us", "reliability"),
)
PIPES = (
    ("tensor_active_pct", "tensor (any)"),
    ("hmma_active_pct", "HMMA (FP16/BF16 tensor)"),
    ("fp16_active_pct", "FP16"),
    ("fp32_active_pct", "FP32"),
    ("fp64_active_pct", "FP64"),
)


def gpu_mean(field: str, unit: Unit) -> Query:
    return Query(f'SELECT mean("{field}") FROM "gpu" WHERE {WHERE} {BY_GPU}', unit, PER_GPU)


def _latest_per_gpu(outer: str, *inner: tuple[str, str]) -> str:
    """``outer`` over each GPU's latest value: what the node looks like at the end of the range."""
    cols = ", ".join(f'last("{f}") AS "{a}"' for f, a in inner)
    return f'SELECT {outer} FROM (SELECT {cols} FROM "gpu" WHERE {WHERE} GROUP BY "host", "gpu")'


def _increments(field: str) -> Query:
    return Query(
        f'SELECT non_negative_difference(last("{field}")) FROM "gpu" WHERE {WHERE} {BY_GPU}',
        COUNT,
        PER_GPU,
    )


def overview() -> list:
    return [
        stat(
            "Busy GPUs",
            "GPUs whose latest busy % is at least 10 %, and all GPUs reporting in the range.",
            Query(_latest_per_gpu('count("b") AS "busy"', ("util_gpu_pct", "b")) + ' WHERE "b" >= 10', COUNT),
            Query(_latest_per_gpu('count("b") AS "of GPUs"', ("util_gpu_pct", "b")), COUNT),
            options={"textMode": "value_and_name"},
            no_value="0",
        ),
        stat(
            "Total power",
            "Sum of every selected GPU's latest board power.",
            Query(_latest_per_gpu('sum("p")', ("power_w", "p")), WATT),
        ),
        stat(
            "Power of limit",
            "Latest total power as a share of the summed enforced power limits: near 100 % the GPUs are power-capped.",
            Query(_latest_per_gpu('sum("p") / sum("l") * 100', ("power_w", "p"), ("power_limit_w", "l")), PERCENT),
            thresholds=SHARE_OF_LIMIT,
        ),
        stat(
            "Hottest GPU",
            "The highest latest die temperature of the selected GPUs (yellow from 75 °C, red from 85 °C).",
            Query(_latest_per_gpu('max("t")', ("temp_gpu_c", "t")), CELSIUS),
            thresholds=TEMPERATURE,
        ),
        stat(
            "Memory used (all GPUs)",
            "Device memory used by processes as a share of all selected GPUs' memory, latest.",
            Query(
                _latest_per_gpu('sum("u") / sum("t") * 100', ("mem_used_bytes", "u"), ("mem_total_bytes", "t")),
                PERCENT,
            ),
            thresholds=SHARE_OF_LIMIT,
        ),
        stat(
            "Mean SM activity",
            "Average fraction of SMs busy over the range (GPM, Hopper and later). Much lower than busy % means "
            "small or latency-bound kernels.",
            Query(f'SELECT mean("sm_active_pct") FROM "gpu" WHERE {WHERE}', PERCENT),
        ),
        stat(
            "Time throttled",
            "Share of samples in which power, thermal, hardware-slowdown or sync-boost reasons held the clocks back "
            "(yellow from 5 %, red from 20 %).",
            Query(f'SELECT mean("throttled") * 100 FROM "gpu" WHERE {WHERE}', PERCENT),
            thresholds=THROTTLED,
        ),
        stat(
            "Uncorrected ECC",
            "Uncorrected ECC errors since the driver loaded, summed over the selected GPUs (any is red). "
            "Empty where the GPU has no ECC.",
            Query(_latest_per_gpu('sum("e")', ("ecc_uncorrected_volatile", "e")), COUNT),
            thresholds=any_is_bad(),
            no_value="n/a",
        ),
    ]


def build() -> Dashboard:
    d = Dashboard(
        UID,
        "gpulse / Node",
        "GPUs",
        "node",
        "Per-GPU activity, pipes, memory, power, thermals, clocks, throttling, PCIe/NVLink, reliability, "
        "processes and XID/ECC events of one host.",
        time_from="now-1h",
        refresh="10s",
    )
    d.variable(
        Variable("host", "Host", 'SHOW TAG VALUES FROM "gpu" WITH KEY = "host" WHERE $timeFilter', include_all=False)
    )
    d.variable(JOB)
    d.variable(
        Variable(
            "gpu",
            "GPU",
            'SHOW TAG VALUES FROM "gpu" WITH KEY = "gpu" WHERE "host" =~ /^$host$/ AND "job" =~ /^$job$/ '
            "AND $timeFilter",
            sort=3,
        )
    )
    d.annotation(
        Annotation(
            "XID / ECC events",
            f'SELECT "text", "kind", "xid" FROM "gpu_event" WHERE {WHERE}',
            text="text",
            tags="kind",
            color="red",
        )
    )

    d.row("Overview", *overview())
    d.row(
        "Activity",
        timeseries(
            "GPU busy %",
            "NVML utilization.gpu: share of time at least one kernel ran. A single tiny kernel reads 100 %; "
            "compare with SM activity.",
            gpu_mean("util_gpu_pct", PERCENT),
            min=0,
            max=100,
            width=8,
        ),
        timeseries(
            "SM activity %",
            "GPM SM activity: the fraction of SMs with work, averaged over the sampling cycle.",
            gpu_mean("sm_active_pct", PERCENT),
            min=0,
            max=100,
            width=8,
        ),
        timeseries(
            "Tensor activity %",
            "GPM tensor-pipe activity: how much of the time the tensor cores were issuing (the MFU proxy).",
            gpu_mean("tensor_active_pct", PERCENT),
            min=0,
            max=100,
            width=8,
        ),
    )
    d.row("Host beside the GPUs", *host_panels.node())
    d.row(
        "Pipes and occupancy",
        timeseries(
            "SM occupancy %",
            "GPM SM occupancy: resident warps as a share of the maximum. Low occupancy with high SM activity "
            "means few warps hide latency.",
            gpu_mean("sm_occupancy_pct", PERCENT),
            min=0,
            max=100,
            width=8,
        ),
        timeseries(
            "Pipe activity (mean of the selected GPUs)",
            "GPM activity of each arithmetic pipe, averaged over the selected GPUs: which kind of math the "
            "kernels issue (FP16/BF16 training should live in the tensor and HMMA lines).",
            Query(
                "SELECT "
                + ", ".join(f'mean("{f}") AS "{name}"' for f, name in PIPES)
                + f' FROM "gpu" WHERE {WHERE} {BY_TIME}',
                PERCENT,
                "$col",
            ),
            min=0,
            max=100,
            width=8,
            legend="wide",
        ),
        timeseries(
            "Encoder / decoder %",
            "Video encoder and decoder busy time (NVENC/NVDEC): data loaders that decode video on the GPU show here.",
            Query(
                'SELECT mean("enc_util_pct") AS "encoder", mean("dec_util_pct") AS "decoder" '
                f'FROM "gpu" WHERE {WHERE} {BY_GPU}',
                PERCENT,
                PER_GPU_COL,
            ),
            min=0,
            max=100,
            width=8,
        ),
    )
    d.row(
        "Memory",
        timeseries(
            "Memory used %",
            "Device memory used by processes as a share of the total (yellow from 80 %, red from 95 %: "
            "the next allocation may fail).",
            Query(
                f'SELECT mean("mem_used_bytes") / mean("mem_total_bytes") * 100 FROM "gpu" WHERE {WHERE} {BY_GPU}',
                PERCENT,
                PER_GPU,
            ),
            min=0,
            max=100,
            thresholds=rising(80, 95, style="line+area"),
            width=8,
        ),
        timeseries(
            "Memory used",
            "Device memory used by processes (NVML v2 memory info, without driver-reserved memory).",
            gpu_mean("mem_used_bytes", BYTES),
            min=0,
            width=8,
        ),
        timeseries(
            "Memory bandwidth %",
            "GPM DRAM bandwidth utilisation, and NVML's memory-controller busy time (the share of time it was "
            "reading or writing at all).",
            Query(
                'SELECT mean("dram_bw_pct") AS "DRAM bandwidth", mean("util_mem_pct") AS "controller busy" '
                f'FROM "gpu" WHERE {WHERE} {BY_GPU}',
                PERCENT,
                PER_GPU_COL,
            ),
            min=0,
            max=100,
            width=8,
        ),
    )
    d.row(
        "Power and thermals",
        timeseries(
            "Power",
            "Board power draw per GPU.",
            gpu_mean("power_w", WATT),
            min=0,
            width=6,
        ),
        timeseries(
            "Power % of limit",
            "Power draw as a share of the enforced power limit: a flat line near 100 % means power capping "
            "(the dashed lines at 80 % and 95 %).",
            Query(
                f'SELECT mean("power_w") / mean("power_limit_w") * 100 FROM "gpu" WHERE {WHERE} {BY_GPU}',
                PERCENT,
                PER_GPU,
            ),
            min=0,
            thresholds=SHARE_OF_LIMIT,
            width=6,
        ),
        timeseries(
            "GPU temperature and fan",
            "GPU die temperature (dashed lines at 75 °C and 85 °C, where most data-centre GPUs start to slow "
            "down) and, on the right axis, fan speed where the board has a fan it reports (passively cooled "
            "data-centre boards do not).",
            gpu_mean("temp_gpu_c", CELSIUS),
            Query(f'SELECT mean("fan_pct") FROM "gpu" WHERE {WHERE} {BY_GPU}', PERCENT, PER_GPU + " fan"),
            thresholds=TEMPERATURE,
            width=6,
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [
                        {"id": "custom.axisPlacement", "value": "right"},
                        {"id": "custom.thresholdsStyle", "value": {"mode": "off"}},
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "min", "value": 0},
                        {"id": "max", "value": 100},
                    ],
                }
            ],
        ),
        timeseries(
            "HBM temperature",
            "Memory (HBM) temperature where the GPU reports it (dashed lines at 85 °C and 95 °C).",
            gpu_mean("temp_mem_c", CELSIUS),
            thresholds=rising(85, 95),
            width=6,
        ),
        timeseries(
            "Energy per interval",
            "Energy used in each interval, from the driver's energy counter (resets on driver reload are skipped).",
            Query(
                f'SELECT non_negative_difference(last("energy_mj")) / 1000 FROM "gpu" WHERE {WHERE} {BY_GPU}',
                JOULE,
                PER_GPU,
            ),
            min=0,
            bars=True,
            width=24,
            height=6,
        ),
    )
    d.row(
        "Clocks and throttling",
        timeseries(
            "SM clock",
            "SM clock per GPU; the GPU inventory below lists each GPU's maximum. A clock far below the maximum "
            "while busy is throttling (see the reasons next to it).",
            gpu_mean("clock_sm_mhz", MHZ),
            min=0,
            width=8,
        ),
        timeseries(
            "Memory clock",
            "Memory clock per GPU (the inventory lists the maximum).",
            gpu_mean("clock_mem_mhz", MHZ),
            min=0,
            width=8,
        ),
        timeseries(
            "P-state",
            "Performance state: P0 is maximum performance, higher numbers are deeper power saving. A busy GPU "
            "should sit at P0.",
            Query(f'SELECT max("pstate") FROM "gpu" WHERE {WHERE} {BY_GPU}', PSTATE, PER_GPU),
            min=0,
            max=15,
            steps=True,
            width=8,
        ),
        timeseries(
            "Throttle reasons (% of samples)",
            "Share of samples in which each clock-event reason held the clocks back, averaged over the selected "
            "GPUs (idle, application-clock and display reasons are not throttling and are left out).",
            Query(
                "SELECT "
                + ", ".join(f'mean("{name}") * 100 AS "{text}"' for name, text in THROTTLE_FLAGS)
                + f' FROM "gpu" WHERE {WHERE} {BY_TIME}',
                PERCENT,
                "$col",
            ),
            min=0,
            stacked=True,
            bars=True,
            legend="wide",
        ),
        timeseries(
            "Throttle time by reason",
            "Share of wall time the driver's throttle-time counters grew, per reason, averaged over the selected "
            "GPUs (the driver's own accounting, independent of the sampling).",
            Query(
                "SELECT "
                + ", ".join(f'mean("{name}") AS "{name}"' for _, name in THROTTLE_COUNTERS)
                + " FROM (SELECT "
                + ", ".join(
                    f'non_negative_derivative(last("{f}"), 1s) / 1000000 AS "{name}"' for f, name in THROTTLE_COUNTERS
                )
                + f' FROM "gpu" WHERE {WHERE} {BY_GPU}) WHERE $timeFilter {BY_TIME}',
                RATIO,
                "$col",
            ),
            min=0,
            legend="wide",
        ),
    )
    d.row(
        "Interconnect",
        timeseries(
            "PCIe throughput",
            "PCIe transmit and receive rates (NVML, 20 ms window).",
            Query(
                'SELECT mean("pcie_tx_bytes_per_s") AS "tx", mean("pcie_rx_bytes_per_s") AS "rx" '
                f'FROM "gpu" WHERE {WHERE} {BY_GPU}',
                BYTES_PER_S,
                PER_GPU_COL,
            ),
            min=0,
            width=8,
        ),
        timeseries(
            "NVLink throughput",
            "NVLink transmit and receive rates over all links, derived from the driver's byte counters.",
            Query(
                'SELECT non_negative_derivative(last("nvlink_tx_kib"), 1s) * 1024 AS "tx", '
                'non_negative_derivative(last("nvlink_rx_kib"), 1s) * 1024 AS "rx" '
                f'FROM "gpu" WHERE {WHERE} {BY_GPU}',
                BYTES_PER_S,
                PER_GPU_COL,
            ),
            min=0,
            width=8,
        ),
        timeseries(
            "PCIe replays",
            "PCIe replays per interval: link-level retransmissions. A steady count means a marginal riser, "
            "slot or cable.",
            _increments("pcie_replays"),
            min=0,
            bars=True,
            thresholds=any_is_bad(style="line"),
            width=8,
        ),
        table(
            "PCIe link now vs maximum",
            "Each GPU's current PCIe link generation and width next to the maximum its slot and card support "
            "(from gpu_info): a GPU below its maximum runs with less host bandwidth. Idle GPUs drop the "
            "generation to save power; compare while busy.",
            Query(
                'SELECT last("pcie_link_gen") AS "gen", last("pcie_link_width") AS "width" '
                f'FROM "gpu" WHERE {WHERE} GROUP BY "host", "gpu", "uuid"',
                table=True,
            ),
            Query(
                'SELECT last("pcie_max_gen") AS "max gen", last("pcie_max_width") AS "max width" '
                f'FROM "gpu_info" WHERE {INFO_WHERE} GROUP BY "uuid"',
                table=True,
            ),
            columns=(
                Column("gen", PCIE_GEN),
                Column("max gen", PCIE_GEN),
                Column("width", PCIE_LANES),
                Column("max width", PCIE_LANES),
            ),
            transformations=[
                organize(only="A", exclude=("Time",)),
                organize(only="B", exclude=("Time",)),
                join("uuid"),
                organize(exclude=("uuid",), order=("host", "gpu", "gen", "max gen", "width", "max width")),
            ],
            width=12,
            height=7,
        ),
        timeseries(
            "PCIe link generation and width",
            "Current PCIe link generation and width per GPU over time: drops while busy point to a link that "
            "retrained down.",
            Query(f'SELECT max("pcie_link_gen") FROM "gpu" WHERE {WHERE} {BY_GPU}', PCIE_GEN, PER_GPU + " gen"),
            Query(f'SELECT max("pcie_link_width") FROM "gpu" WHERE {WHERE} {BY_GPU}', PCIE_LANES, PER_GPU + " width"),
            min=0,
            steps=True,
            width=12,
            height=7,
        ),
    )
    d.row(
        "Reliability",
        timeseries(
            "ECC errors since driver load",
            "Volatile ECC error counters (reset when the driver reloads): corrected errors are absorbed, "
            "any uncorrected one can crash the job.",
            Query(
                'SELECT last("ecc_corrected_volatile") AS "corrected", last("ecc_uncorrected_volatile") AS "uncorrected" '
                f'FROM "gpu" WHERE {WHERE} {BY_GPU}',
                COUNT,
                PER_GPU_COL,
            ),
            min=0,
            steps=True,
            width=8,
        ),
        bargauge(
            "Remapped rows and retired pages",
            "Lifetime ECC errors, remapped rows and retired pages per GPU (red from 1: an uncorrectable row "
            "remap or a double-bit page retirement deserves an RMA check).",
            Query(
                'SELECT last("ecc_uncorrected_aggregate") AS "ECC uncorrected (lifetime)", '
                'last("remapped_rows_uncorrectable") AS "rows remapped (uncorrectable)", '
                'last("remapped_rows_pending") AS "row remap pending", last("remapped_rows_failure") AS "row remap failed", '
                f'last("retired_pages_dbe") AS "pages retired (DBE)" FROM "gpu" WHERE {WHERE} GROUP BY "host", "gpu"',
                COUNT,
                PER_GPU_COL,
            ),
            thresholds=any_is_bad(),
            min=0,
            width=8,
        ),
        table(
            "GPU events",
            "XID, ECC and GPU-lost events in the time range (also shown as annotations on every graph).",
            Query(
                f'SELECT "kind", "xid", "text" FROM "gpu_event" WHERE {WHERE} GROUP BY "host", "gpu" '
                "ORDER BY time DESC LIMIT 100",
                table=True,
            ),
            columns=(Column("xid", ID),),
            width=8,
        ),
    )
    d.row(
        "Processes",
        table(
            "Processes",
            "One row per process that held a GPU in the time range (like nvitop): its GPU memory now and at "
            "its peak, mean SM and memory-controller use, when it was last seen, and who and what it is: its "
            "job (Slurm job id or pod UID) and pod, where it runs in one.",
            Query(
                'SELECT "pid", "user", "container", "command", "mem_used_bytes", "sm_util_pct", "mem_util_pct" '
                f'FROM "gpu_process" WHERE {WHERE} GROUP BY "host", "gpu", "job", "pod"',
                table=True,
            ),
            columns=(
                Column("PID", ID),
                Column("GPU memory", BYTES),
                Column("peak GPU memory", BYTES),
                Column("SM %", PERCENT, rising(50, 90)),
                Column("memory-controller %", PERCENT),
                Column("last seen", TIME_AGO),
            ),
            transformations=[
                {
                    "id": "groupBy",
                    "options": {
                        "fields": {
                            "host": {"aggregations": [], "operation": "groupby"},
                            "gpu": {"aggregations": [], "operation": "groupby"},
                            "pid": {"aggregations": [], "operation": "groupby"},
                            "user": {"aggregations": [], "operation": "groupby"},
                            "job": {"aggregations": [], "operation": "groupby"},
                            "pod": {"aggregations": [], "operation": "groupby"},
                            "container": {"aggregations": [], "operation": "groupby"},
                            "command": {"aggregations": [], "operation": "groupby"},
                            "mem_used_bytes": {"aggregations": ["lastNotNull", "max"], "operation": "aggregate"},
                            "sm_util_pct": {"aggregations": ["mean"], "operation": "aggregate"},
                            "mem_util_pct": {"aggregations": ["mean"], "operation": "aggregate"},
                            "Time": {"aggregations": ["max"], "operation": "aggregate"},
                        }
                    },
                },
                organize(
                    order=(
                        "host",
                        "gpu",
                        "pid",
                        "user",
                        "job",
                        "pod",
                        "container",
                        "mem_used_bytes (lastNotNull)",
                        "mem_used_bytes (max)",
                        "sm_util_pct (mean)",
                        "mem_util_pct (mean)",
                        "Time (max)",
                        "command",
                    ),
                    rename={
                        "pid": "PID",
                        "mem_used_bytes (lastNotNull)": "GPU memory",
                        "mem_used_bytes (max)": "peak GPU memory",
                        "sm_util_pct (mean)": "SM %",
                        "mem_util_pct (mean)": "memory-controller %",
                        "Time (max)": "last seen",
                    },
                ),
                {"id": "sortBy", "options": {"sort": [{"field": "GPU memory", "desc": True}]}},
            ],
            no_value="no process held a selected GPU in this range",
            height=9,
        ),
    )
    d.row(
        "Inventory",
        table(
            "GPU inventory",
            "What each GPU is, from gpu_info (written at agent start and again every hour, so it outlives the "
            "raw retention): model, driver, memory, power limit, maximum clocks and PCIe link, NVLink links.",
            Query(
                'SELECT last("name") AS "name", last("driver_version") AS "driver", last("cuda_version") AS "CUDA", '
                'last("mem_total_bytes") AS "memory", last("power_limit_w") AS "power limit", '
                'last("clock_sm_max_mhz") AS "max SM clock", last("clock_mem_max_mhz") AS "max memory clock", '
                'last("pcie_max_gen") AS "max PCIe gen", last("pcie_max_width") AS "max PCIe width", '
                'last("nvlink_links") AS "NVLink links", last("pci_bus_id") AS "PCI bus" '
                f'FROM "gpu_info" WHERE {INFO_WHERE} GROUP BY "host", "gpu"',
                table=True,
            ),
            columns=(
                Column("memory", BYTES),
                Column("power limit", WATT),
                Column("max SM clock", MHZ),
                Column("max memory clock", MHZ),
                Column("max PCIe gen", PCIE_GEN),
                Column("max PCIe width", PCIE_LANES),
                Column("NVLink links", COUNT),
            ),
            transformations=[organize(exclude=("Time",))],
            height=7,
        ),
    )
    return d


#: Where the Training run dashboard's GPU panel sends a click: this dashboard, that host and GPU.
def link_to_gpu(title: str = "Open this GPU on the Node dashboard") -> Link:
    return Link(title, UID, (("host", "${__field.labels.host}"), ("gpu", "${__field.labels.gpu}")))
