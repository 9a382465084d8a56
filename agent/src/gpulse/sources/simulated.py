"""Simulated GPUs (``gpulse agent --simulate N``, ``gpulse demo``, tests, people without a GPU).

Every value is a pure function of (seed, GPU index, timestamp): gauges come from the GPU's phase
at that instant plus deterministic noise, and counters (energy, NVLink bytes, throttle time, ECC)
are integrals of per-phase rates over 10-second cells since the simulated driver load, so
``collect(t)`` may be called for past timestamps in any order (the demo backfills hours) and two
sources with the same seed agree exactly. Counters restart at a simulated driver load once a day,
as real NVML counters do at a driver reload or GPU reset, which keeps the integrals short.

Phases: ``idle``, ``busy``, ``starved`` (data-loading bottleneck: memory full, little compute),
``throttled`` (thermal), ``straggler`` (power-capped, slower clocks). Without a scenario the node
cycles through a 30-minute schedule and the last GPU is the noisy one (it also runs hot).

Attribution: the first half of the GPUs (at least one) is held by one simulated Slurm job
(:meth:`SimulatedSource.job_tags`, its id from the seed), so their ``gpu`` and ``gpu_process``
points carry the job tags a node under Slurm gives them; the other GPUs belong to no job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpulse import schema
from gpulse.sources.base import GpuIdentity, GpuSource, Reading

NS = 1_000_000_000
PHASES = ("idle", "busy", "starved", "throttled", "straggler")
Scenario = Callable[[int, int], str]

_CELL_NS = 10 * NS  # counter integration cell
_BOOT_NS = 86_400 * NS  # simulated driver load once a day
_MEDIUM_NS = 10 * NS
_SLOW_NS = 60 * NS
_PROCESS_NS = 5 * NS
_GIB = 1 << 30
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Model:
    """What a simulated product looks like and which metrics it supports."""

    name: str
    mem_total: int
    power_limit_w: float
    sm_max: int
    mem_clock: int
    pcie_gen: int
    nvlink_links: int
    gpm: bool
    ecc: bool
    fan: bool
    hbm: bool
    idle_power_w: float
    idle_pstate: int


MODELS: dict[str, Model] = {
    "H100": Model("NVIDIA H100 80GB HBM3", 85_520_809_984, 700.0, 1980, 2619, 5, 18, True, True, False, True, 70.0, 0),
    "A100": Model("NVIDIA A100-SXM4-80GB", 85_899_345_920, 400.0, 1410, 1593, 4, 12, False, True, False, True, 55.0, 0),
    "RTX4090": Model(
        "NVIDIA GeForce RTX 4090", 25_757_220_864, 450.0, 2520, 10501, 4, 0, False, False, True, False, 22.0, 8
    ),
}

# Per-phase targets (H100-like fractions; scaled by the model's limits).
# util, mem_util, sm, occ, tensor, hmma, dram, fp16, fp32, fp64, mem_frac, power_frac, temp, clk_frac,
# pcie_tx GB/s, pcie_rx GB/s, nvlink GB/s each way, clock-event mask, throttle (power, thermal) µs per s
_PROFILES: dict[str, tuple[float, ...]] = {
    "idle": (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.006, 0.0, 33, 0.17, 0.01, 0.01, 0.0, 0x1, 0, 0),
    "busy": (99, 45, 78, 42, 48, 46, 38, 4, 12, 0, 0.90, 0.88, 67, 1.0, 1.5, 3.0, 120.0, 0x0, 0, 0),
    "starved": (28, 10, 15, 8, 6, 6, 7, 1, 3, 0, 0.93, 0.35, 45, 1.0, 0.5, 12.0, 10.0, 0x0, 0, 0),
    "throttled": (100, 40, 70, 38, 40, 38, 33, 3, 10, 0, 0.90, 0.95, 88, 0.70, 1.2, 2.5, 90.0, 0x60, 50_000, 900_000),
    "straggler": (100, 48, 88, 45, 55, 52, 42, 4, 13, 0, 0.90, 1.0, 75, 0.82, 1.4, 2.8, 110.0, 0x4, 700_000, 0),
}
(U, MU, SM, OCC, TEN, HMMA, DRAM, F16, F32, F64, MEMF, PWRF, TEMP, CLKF, PTX, PRX, NVL, MASK, THP, THT) = range(20)

_CLOCK_FLAGS = tuple((bit, name) for bit, name, _ in schema.CLOCK_EVENT_FLAGS)
_GPM_FIELDS = (
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "hmma_active_pct",
    "dram_bw_pct",
    "fp16_active_pct",
    "fp32_active_pct",
    "fp64_active_pct",
    "gpm_pcie_tx_bytes_per_s",
    "gpm_pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
)


def _mix(x: int) -> int:
    """splitmix64: a cheap, well-spread hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def default_scenario(n: int) -> Scenario:
    """A 30-minute cycle: idle, busy, data starvation, busy with the last GPU throttling, busy."""
    noisy = n - 1

    def phase(t_ns: int, gpu: int) -> str:
        m = (t_ns // NS) % 1800
        if m < 120:
            return "idle"
        if 1080 <= m < 1260:
            return "starved"
        if 1260 <= m < 1500 and gpu == noisy:
            return "throttled"
        return "busy"

    return phase


class SimulatedSource(GpuSource):
    """N simulated GPUs of one model; see the module docstring for the determinism contract."""

    def __init__(
        self,
        n: int,
        model: str | None = "H100",
        seed: int | None = 0,
        host_pid_base: int = 4100,
        scenario: Scenario | None = None,
    ) -> None:
        key = (model or "H100").upper().replace(" ", "")
        if key not in MODELS:
            raise ValueError(f"unknown simulated model {model!r}: choose one of {', '.join(MODELS)}")
        if n < 1:
            raise ValueError("the simulated source needs at least one GPU")
        self.n = n
        self.model = MODELS[key]
        self.seed = int(seed or 0)
        self.host_pid_base = host_pid_base
        self.scenario = scenario or default_scenario(n)
        self.noisy = n - 1
        self._gpus: list[GpuIdentity] = []
        self._info_due = False
        self._gpm_primed = False
        self._events: list[tuple[int, int, str, int, str]] = []
        self._emitted: set[tuple[int, int, str, int, str]] = set()
        self._buckets = {"medium": None, "slow": None, "process": None}
        self._prefix: dict[tuple[int, int], list[tuple[float, ...]]] = {}
        self._supported, self._unsupported = self._capabilities()
        self._boot_off = (self.seed % 24) * 3600 * NS

    # -- GpuSource -------------------------------------------------------------------------------
    def open(self) -> list[GpuIdentity]:
        self._gpus = [GpuIdentity(i, self._uuid(i), self.model.name) for i in range(self.n)]
        self._info_due = True
        self._gpm_primed = False
        return list(self._gpus)

    @property
    def gpus(self) -> list[GpuIdentity]:
        return list(self._gpus)

    def error_counts(self) -> dict[str, int]:
        return dict.fromkeys(schema.NVML_ERROR_KINDS, 0)

    def lost(self) -> set[int]:
        return set()

    def close(self) -> None:
        self._prefix.clear()

    def inject_event(self, gpu: int, ts_ns: int, kind: str, xid: int = 0, text: str = "") -> None:
        """Plant an event; the first collect() at or after ``ts_ns`` reports it (with its own ts)."""
        self._events.append((ts_ns, gpu, kind, xid, text))
        self._events.sort()

    def collect(self, now_ns: int) -> list[Reading]:
        if not self._gpus:
            return []
        out: list[Reading] = []
        if self._info_due:
            self._info_due = False
            out.extend(Reading("gpu_info", g.index, self._info(g), now_ns) for g in self._gpus)
        medium = self._due("medium", now_ns, _MEDIUM_NS)
        slow = self._due("slow", now_ns, _SLOW_NS)
        procs = self._due("process", now_ns, _PROCESS_NS)
        gpm = self.model.gpm and self._gpm_primed
        self._gpm_primed = True  # like NVML's GPM: the first cycle has no previous sample
        for i in range(self.n):
            phase = self.phase(now_ns, i)
            fields = self._gauges(now_ns, i, phase, gpm)
            self._counters(now_ns, i, fields, out, medium, slow)
            job = self.job_tags(i)
            out.append(Reading("gpu", i, fields, now_ns, job))
            if procs and phase != "idle":
                out.append(self._process(now_ns, i, fields)._replace(tags=job))
        for ev in self._events:
            ts, gpu, kind, xid, text = ev
            if ts > now_ns:
                break
            if ev not in self._emitted and 0 <= gpu < self.n:
                self._emitted.add(ev)
                out.append(Reading("gpu_event", gpu, {"kind": kind, "xid": xid, "data": xid, "text": text}, ts))
        return out

    def job_tags(self, gpu: int) -> dict[str, str] | None:
        """The tags of the simulated Slurm job holding ``gpu`` (``schema.JOB_TAGS``), or ``None``."""
        if gpu >= max(1, self.n // 2):
            return None
        job = str(100_000 + _mix(self.seed) % 900_000)
        return {"job": job, "job_user": "trainer", "account": "ml-research", "partition": "gpu"}

    # -- values ----------------------------------------------------------------------------------
    def phase(self, t_ns: int, gpu: int) -> str:
        p = self.scenario(t_ns, gpu)
        return p if p in _PROFILES else "busy"

    def _noise(self, t_ns: int, gpu: int) -> tuple[float, float, float, float]:
        """Four deterministic values in [-1, 1) for this GPU in this 100-ms bucket."""
        h = _mix((self.seed << 40) ^ (gpu << 56) ^ (t_ns // 100_000_000))
        amp = 2.0 if gpu == self.noisy else 1.0
        return tuple(amp * (((h >> s) & 0xFFFF) / 32768.0 - 1.0) for s in (0, 16, 32, 48))  # type: ignore[return-value]

    def _gauges(self, t_ns: int, gpu: int, phase: str, gpm: bool) -> dict[str, object]:
        m = self.model
        p = _PROFILES[phase]
        a, b, c, d = self._noise(t_ns, gpu)
        wave = math.sin(t_ns / (97 * NS) + gpu * 0.7)
        active = phase != "idle"
        util = _clamp(p[U] + (3 * a if active else 0), 0, 100)
        mem_used = int(m.mem_total * _clamp(p[MEMF] + 0.004 * b, 0.002, 0.985))
        reserved = int(m.mem_total * 0.0065)
        power = m.idle_power_w if not active else m.power_limit_w * _clamp(p[PWRF] + 0.03 * c + 0.01 * wave, 0.1, 1.0)
        power = min(power + (2 * abs(a) if not active else 0), m.power_limit_w)
        temp = p[TEMP] + 1.5 * wave + b + (6 if gpu == self.noisy and active else 0)
        mask = int(p[MASK])
        f: dict[str, object] = {
            "util_gpu_pct": round(util, 1),
            "util_mem_pct": round(_clamp(p[MU] + 2 * b * active, 0, 100), 1),
            "mem_used_bytes": mem_used,
            "mem_free_bytes": m.mem_total - mem_used - reserved,
            "mem_reserved_bytes": reserved,
            "mem_total_bytes": m.mem_total,
            "temp_gpu_c": round(temp, 1),
            "power_w": round(power, 1),
            "power_limit_w": m.power_limit_w,
            "clock_sm_mhz": int(m.sm_max * p[CLKF] - (15 * abs(d) if active else 0)),
            "clock_mem_mhz": m.mem_clock,
            "clock_graphics_mhz": int(m.sm_max * p[CLKF] - (15 * abs(d) if active else 0)),
            "clock_event_reasons": mask,
            "pstate": 0 if active else m.idle_pstate,
            "pcie_tx_bytes_per_s": round(p[PTX] * 1e9 * (1 + 0.1 * c), 0),
            "pcie_rx_bytes_per_s": round(p[PRX] * 1e9 * (1 + 0.1 * d), 0),
            "enc_util_pct": 0.0,
            "dec_util_pct": 0.0,
        }
        for bit, name in _CLOCK_FLAGS:
            f[name] = 1 if mask & bit else 0
        f["throttled"] = 1 if mask & schema.THROTTLE_MASK else 0
        if m.hbm:
            f["temp_mem_c"] = round(temp + 4 + (8 if phase == "throttled" else 0), 1)
        if m.fan:
            f["fan_pct"] = round(_clamp(30 + (temp - 35) * 1.4, 30, 100), 1)
        if gpm:
            k = 1 + 0.04 * a
            f["sm_active_pct"] = round(_clamp(p[SM] * k, 0, 100), 2)
            f["sm_occupancy_pct"] = round(_clamp(p[OCC] * k, 0, 100), 2)
            f["tensor_active_pct"] = round(_clamp(p[TEN] * (1 + 0.05 * b), 0, 100), 2)
            f["hmma_active_pct"] = round(_clamp(p[HMMA] * (1 + 0.05 * b), 0, 100), 2)
            f["dram_bw_pct"] = round(_clamp(p[DRAM] * (1 + 0.05 * c), 0, 100), 2)
            f["fp16_active_pct"] = round(p[F16] * k, 2)
            f["fp32_active_pct"] = round(p[F32] * k, 2)
            f["fp64_active_pct"] = round(p[F64] * k, 2)
            f["gpm_pcie_tx_bytes_per_s"] = f["pcie_tx_bytes_per_s"]
            f["gpm_pcie_rx_bytes_per_s"] = f["pcie_rx_bytes_per_s"]
            nvl = p[NVL] * 1e9 * (1 + 0.05 * d)
            f["nvlink_tx_bytes_per_s"] = round(nvl, 0)
            f["nvlink_rx_bytes_per_s"] = round(nvl * 0.98, 0)
        return f

    # -- counters (closed form over 10-s cells since the simulated driver load) -------------------
    def _rates(self, t_ns: int, gpu: int) -> tuple[float, ...]:
        """Per-second increments during the cell starting at ``t_ns``."""
        m = self.model
        phase = self.phase(t_ns, gpu)
        p = _PROFILES[phase]
        power = m.idle_power_w if phase == "idle" else m.power_limit_w * p[PWRF]
        nvl_kib = p[NVL] * 1e9 / 1024 if m.nvlink_links else 0.0
        low_util = 1e6 if phase == "idle" else 0.0
        return (power * 1000.0, nvl_kib, nvl_kib * 0.98, p[THP], p[THT], low_util)

    def _integrals(self, t_ns: int, gpu: int) -> tuple[float, ...]:
        """(energy mJ, nvlink tx KiB, rx KiB, throttle power µs, thermal µs, low-util µs) at ``t_ns``."""
        boot = (t_ns - self._boot_off) // _BOOT_NS * _BOOT_NS + self._boot_off
        cell = (t_ns - boot) // _CELL_NS
        key = (gpu, boot)
        pre = self._prefix.get(key)
        if pre is None:
            if len(self._prefix) > 256:
                self._prefix.clear()
            pre = self._prefix[key] = [(0.0,) * 6]
        while len(pre) <= cell:  # extend the prefix sums up to this cell (memoised, still pure)
            k = len(pre) - 1
            r = self._rates(boot + k * _CELL_NS, gpu)
            last = pre[-1]
            pre.append(tuple(last[j] + r[j] * (_CELL_NS / NS) for j in range(6)))
        r = self._rates(boot + cell * _CELL_NS, gpu)
        frac = (t_ns - boot - cell * _CELL_NS) / NS
        base = pre[cell]
        return tuple(base[j] + r[j] * frac for j in range(6))

    def _counters(
        self, t_ns: int, gpu: int, f: dict[str, object], out: list[Reading], medium: bool, slow: bool
    ) -> None:
        m = self.model
        e, ntx, nrx, thp, tht, tlow = self._integrals(t_ns, gpu)
        f["energy_mj"] = int(e)
        if medium and m.ecc:  # consumer boards report no throttle-time counters (NotSupported)
            f["throttle_power_us"] = int(thp)
            f["throttle_thermal_us"] = int(tht)
            f["throttle_low_util_us"] = int(tlow)
            f["throttle_sync_boost_us"] = 0
            f["throttle_board_limit_us"] = 0
            f["throttle_reliability_us"] = 0
        if medium:
            f["pcie_replays"] = ((t_ns - self._boot_off) % _BOOT_NS) // (3 * 3600 * NS) if gpu == self.noisy else 0
            f["pcie_link_gen"] = m.pcie_gen
            f["pcie_link_width"] = 16
            if m.nvlink_links:
                links = m.nvlink_links
                tx_total = rx_total = 0
                for link in range(links):
                    w = 1.0 / links
                    tx, rx = int(ntx * w), int(nrx * w)
                    tx_total += tx
                    rx_total += rx
                    out.append(
                        Reading("gpu_nvlink", gpu, {"tx_kib": tx, "rx_kib": rx, "active": 1}, t_ns, {"link": str(link)})
                    )
                f["nvlink_tx_kib"] = tx_total
                f["nvlink_rx_kib"] = rx_total
        if slow and m.ecc:
            since_boot_h = ((t_ns - self._boot_off) % _BOOT_NS) // (3600 * NS)
            corrected = int(since_boot_h) if gpu == self.noisy else 0
            f["ecc_corrected_volatile"] = corrected
            f["ecc_uncorrected_volatile"] = 0
            f["ecc_corrected_aggregate"] = corrected + 12 * (gpu == self.noisy)
            f["ecc_uncorrected_aggregate"] = 0
            f["remapped_rows_correctable"] = 1 if gpu == self.noisy else 0
            f["remapped_rows_uncorrectable"] = 0
            f["remapped_rows_pending"] = 0
            f["remapped_rows_failure"] = 0

    def _process(self, t_ns: int, gpu: int, f: dict[str, object]) -> Reading:
        fields = {
            "pid": self.host_pid_base + gpu,
            "command": f"python train.py --config configs/llama-7b.yaml --local_rank {gpu}",
            "user": "trainer",
            "mem_used_bytes": max(0, int(f["mem_used_bytes"]) - _GIB // 2),  # type: ignore[call-overload]
            "sm_util_pct": round(min(100.0, float(f["util_gpu_pct"]) * 0.9), 1),  # type: ignore[arg-type]
            "mem_util_pct": f["util_mem_pct"],
        }
        return Reading("gpu_process", gpu, fields, t_ns)

    # -- identity and capabilities ---------------------------------------------------------------
    def _uuid(self, gpu: int) -> str:
        h = f"{_mix(self.seed * 1_000_003 + gpu):016x}{_mix(gpu * 7919 + self.seed + 1):016x}"
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def _capabilities(self) -> tuple[list[str], list[str]]:
        m = self.model
        absent: set[str] = set()
        if not m.gpm:
            absent.update(_GPM_FIELDS)
        if not m.fan:
            absent.add("fan_pct")
        if not m.hbm:
            absent.add("temp_mem_c")
        if not m.nvlink_links:
            absent.update(("nvlink_tx_kib", "nvlink_rx_kib"))
        if not m.ecc:
            prefixes = ("ecc_", "remapped_", "retired_", "throttle_")
            absent.update(f.name for f in schema.GPU.fields if f.name.startswith(prefixes))
        absent.update(f.name for f in schema.GPU.fields if f.name.startswith("retired_"))  # pre-Ampere only
        names = [f.name for f in schema.GPU.fields]
        return [n for n in names if n not in absent], [n for n in names if n in absent]

    def _info(self, g: GpuIdentity) -> dict[str, object]:
        m = self.model
        return {
            "name": m.name,
            "driver_version": "570.124.06",
            "cuda_version": "12.8",
            "nvml_version": "12.570.124.06",
            "pci_bus_id": f"00000000:{0x18 + g.index * 0x10:02X}:00.0",
            "vbios_version": "96.00.99.00.01",
            "mem_total_bytes": m.mem_total,
            "power_limit_w": m.power_limit_w,
            "clock_sm_max_mhz": m.sm_max,
            "clock_mem_max_mhz": m.mem_clock,
            "clock_graphics_max_mhz": m.sm_max,
            "pcie_max_gen": m.pcie_gen,
            "pcie_max_width": 16,
            "mig_mode": 0,
            "gpm_supported": int(m.gpm),
            "nvlink_links": m.nvlink_links,
            "process_access": "ok",
            "supported_metrics": ",".join(self._supported),
            "unsupported_metrics": ",".join(self._unsupported),
        }

    def _due(self, tier: str, now_ns: int, every: int) -> bool:
        """A tier is due when ``now`` falls in a different aligned bucket than its last reading."""
        bucket = now_ns // every
        if self._buckets[tier] == bucket:
            return False
        self._buckets[tier] = bucket
        return True


def _clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x
