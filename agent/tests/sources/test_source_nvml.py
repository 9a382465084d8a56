"""The NVML source, specified against the driver's C library stand-in (``support.fake_pynvml``).

The real ``pynvml`` runs unchanged: only the functions it resolves in ``libnvidia-ml.so`` are the
stand-in's, so every wrapper, struct, buffer protocol and error mapping of the bindings is part of
each test. GPUs are recorded H100/H200/A100 profiles (plus a hand-written RTX 4090) on a virtual
clock that the stand-in and the source share; every test ends with the stand-in's leak and misuse
check. No test here needs a GPU.
"""

from __future__ import annotations

import io
import logging
import re
import time
from pathlib import Path

import pynvml
import pytest
from support.fake_pynvml import FakeGpu, FakeNvml, a100, busy, fake_h100_node, h100, h200, mig_h200, rtx4090

from gpulse import schema
from gpulse.lineprotocol.encode import Encoder
from gpulse.sources.base import Reading, SourceUnavailable
from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml.mig import InstanceProfile, profile_name
from gpulse.sources.nvml.source import NvmlSource
from gpulse.sources.processes import ContainerNamer, ProcessDescriber

S = 1_000_000_000
T0 = 1_750_000_000 * S
GPM_FIELDS = ("sm_active_pct", "tensor_active_pct", "dram_bw_pct", "nvlink_tx_bytes_per_s")
ECC_NVLINK_FIELDS = ("ecc_corrected_volatile", "remapped_rows_pending", "nvlink_tx_kib", "throttle_thermal_us")


def gpu_fields(readings: list[Reading], index: int, mig: str | None = None) -> dict:
    rows = [r for r in readings if r.measurement == "gpu" and r.gpu == index and (r.tags or {}).get("mig") == mig]
    assert len(rows) == 1, f"expected one gpu reading for GPU {index} mig={mig}, got {len(rows)}"
    return rows[0].fields


def of(readings: list[Reading], measurement: str) -> list[Reading]:
    return [r for r in readings if r.measurement == measurement]


class Node:
    """Stand-in GPUs and an NvmlSource sharing one virtual clock (``cycle(t)`` moves it to T0 + t s)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], tmp_path: Path, fake_kw: dict, **kw):
        self.now = T0
        self.fake = FakeNvml.install(monkeypatch, gpus=gpus, clock_ns=lambda: self.now, **fake_kw)
        kw.setdefault("events", False)
        kw.setdefault(
            "describer", ProcessDescriber(proc_root=str(tmp_path), namer=ContainerNamer(client_factory=lambda: None))
        )
        self.src = NvmlSource(clock_ns=lambda: self.now, **kw)

    def cycle(self, t_s: float) -> list[Reading]:
        self.now = T0 + round(t_s * S)
        return self.src.collect(self.now)


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Makes opened nodes; closes them afterwards and fails on leaked NVML allocations or misuse."""
    made: list[Node] = []

    def make(gpus: list[FakeGpu], fake_kw: dict | None = None, open: bool = True, **kw) -> Node:
        n = Node(monkeypatch, gpus, tmp_path, fake_kw or {}, **kw)
        made.append(n)
        if open:
            n.src.open()
        return n

    yield make
    for n in made:
        n.src.close()
        n.fake.check()


# -- the stand-in itself ---------------------------------------------------------------------------
def test_every_c_function_of_the_stand_in_is_one_the_real_bindings_look_up():
    source = Path(pynvml.__file__).read_text()
    looked_up = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', source))
    exported = {name.removeprefix("c_") for name in dir(FakeNvml) if name.startswith("c_nvml")}
    assert exported and exported <= looked_up, exported - looked_up


def test_the_stand_in_fails_a_test_that_leaks_a_gpm_sample(monkeypatch):
    fake = FakeNvml.install(monkeypatch, gpus=[h100(0)])
    pynvml.nvmlInit()
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(AssertionError, match="1 GPM sample"):
        fake.check()
    pynvml.nvmlGpmSampleFree(sample)
    pynvml.nvmlShutdown()
    fake.check()


def test_recorded_profiles_carry_the_captured_values():
    g = h100(0)
    assert (g.name, g.uuid, g.mem_total, g.power_limit_mw) == (
        "NVIDIA H100 80GB HBM3",
        "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1",
        81559 << 20,
        700_000,
    )
    assert h100(3).uuid != g.uuid and h200(0).mem_total == 143771 << 20 and a100(0).max_clocks == (1410, 1410, 1593)


# -- start-up --------------------------------------------------------------------------------------
def test_no_driver_raises_source_unavailable_with_a_clear_message(monkeypatch):
    FakeNvml.install(monkeypatch, gpus=[], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(SourceUnavailable, match=r"libnvidia-ml.*--simulate"):
        NvmlSource().open()
    FakeNvml.install(monkeypatch, gpus=[], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(SourceUnavailable, match="driver is not loaded"):
        NvmlSource().open()


def test_a_machine_with_a_driver_but_no_gpu_is_unavailable(monkeypatch):
    FakeNvml.install(monkeypatch, gpus=[])
    with pytest.raises(SourceUnavailable, match="no GPUs"):
        NvmlSource().open()


def test_process_calls_missing_from_an_old_driver_leave_processes_out_instead_of_escaping_open(node):
    """pynvml's unversioned process wrappers raise NVMLLibraryMismatchError (not an NVMLError)."""
    symbols = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"}
    n = node([busy(h100(0))], fake_kw={"missing_symbols": symbols})
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    readings = n.cycle(0)
    assert of(readings, "gpu_process") == []
    assert of(readings, "gpu_info")[0].fields["process_access"] == "not_supported"
    assert gpu_fields(readings, 0)["util_gpu_pct"] == 99
    assert E.code_of(pynvml.NVMLLibraryMismatchError("x")) == -1  # no context: "other"


def test_consumer_gpu_without_gpm_ecc_nvlink_leaves_those_fields_absent_never_zero(node):
    n = node([rtx4090(0)])
    first, second = n.cycle(0), n.cycle(1)
    for readings in (first, second):
        f = gpu_fields(readings, 0)
        for name in GPM_FIELDS + ECC_NVLINK_FIELDS + ("temp_mem_c",):
            assert name not in f
        assert f["fan_pct"] == 30
    assert of(first, "gpu_nvlink") == []
    info = of(first, "gpu_info")[0].fields
    assert info["gpm_supported"] == 0 and info["nvlink_links"] == 0 and info["process_access"] == "ok"
    assert "ecc_corrected_volatile" in info["unsupported_metrics"].split(",")
    assert "fan_pct" in info["supported_metrics"].split(",")
    assert n.src.error_counts() == dict.fromkeys(schema.NVML_ERROR_KINDS, 0)


# -- GPM -------------------------------------------------------------------------------------------
def test_hopper_gpm_needs_two_samples_then_reports_every_cycle(node):
    n = node([h100(0)])
    first = gpu_fields(n.cycle(0), 0)
    assert not any(name in first for name in GPM_FIELDS)
    n.fake.gpus[0].gpm_values[2] = 88.25
    second = gpu_fields(n.cycle(1), 0)
    assert second["sm_active_pct"] == 88.25
    assert second["nvlink_tx_bytes_per_s"] == 110_000.0 * 1048576  # MiB/s -> B/s
    assert second["gpm_pcie_rx_bytes_per_s"] == 2400.0 * 1048576
    # the two buffers alternate: the stand-in refuses a metrics request on the same sample twice
    assert gpu_fields(n.cycle(2), 0)["sm_active_pct"] == 88.25
    assert n.fake.calls["nvmlGpmSampleAlloc"] == 2


def test_gpm_samples_are_never_taken_100_ms_or_less_apart(node):
    n = node([h100(0)])
    n.cycle(0)
    assert "sm_active_pct" not in gpu_fields(n.cycle(0.05), 0)
    assert "sm_active_pct" not in gpu_fields(n.cycle(0.1), 0)  # "greater than 100ms"
    assert "sm_active_pct" in gpu_fields(n.cycle(0.2), 0)
    assert n.fake.misuse == []


def test_a_gpm_metric_that_says_not_supported_is_dropped_and_gpu_info_is_written_again(node):
    n = node([h100(0)])
    del n.fake.gpus[0].gpm_values[11]  # FP64_UTIL
    n.cycle(0)
    second = n.cycle(1)
    f = gpu_fields(second, 0)
    assert "fp64_active_pct" not in f and f["fp32_active_pct"] == 11.0
    infos = of(second, "gpu_info")
    assert len(infos) == 1 and "fp64_active_pct" in infos[0].fields["unsupported_metrics"].split(",")
    assert n.src.error_counts()["other"] == 1
    third = n.cycle(2)
    assert of(third, "gpu_info") == [] and "fp64_active_pct" not in gpu_fields(third, 0)
    assert n.src.error_counts()["other"] == 1  # dropped for good, not counted again


def test_a_gpm_probe_that_fails_frees_its_samples(node):
    g = h100(0)
    g.fail["nvmlGpmSampleGet"] = [pynvml.NVML_ERROR_UNKNOWN]
    n = node([g])
    assert of(n.cycle(0), "gpu_info")[0].fields["gpm_supported"] == 0
    assert n.fake.calls["nvmlGpmSampleAlloc"] == 2 and n.fake.gpm_samples_live == 0


# -- MIG -------------------------------------------------------------------------------------------
def test_mig_devices_are_sampled_each_with_its_profile_and_index(node, caplog):
    g = mig_h200(0, layout=("2g.35gb", "1g.18gb", "1g.18gb"))
    g.mig_devices[1].mem_used, g.mig_devices[1].procs = 9 << 30, [(5150, 9 << 30)]
    with caplog.at_level(logging.WARNING):
        n = node([g])
    assert "GPU 0: process list needs privileges" in caplog.text
    first = n.cycle(0)
    parent = gpu_fields(first, 0)
    for name in ("util_gpu_pct", "sm_active_pct", "mem_used_bytes"):  # a non-root agent: none of these
        assert name not in parent
    assert parent["power_w"] == 74.58 and parent["temp_gpu_c"] == 28
    tags = sorted((r.tags or {}).get("mig") for r in of(first, "gpu") if r.tags)
    assert tags == ["1g.18gb/1", "1g.18gb/2", "2g.35gb/0"]
    one = gpu_fields(first, 0, "1g.18gb/1")
    assert one["mem_used_bytes"] == 9 << 30 and one["mem_total_bytes"] == (143771 // 8) << 20
    second = n.cycle(1)
    gpm = [gpu_fields(second, 0, t)["sm_active_pct"] for t in ("2g.35gb/0", "1g.18gb/1")]
    assert gpm == pytest.approx([71.5 / 3, 71.5 * 2 / 3])  # per GPU instance (nvmlGpmMigSampleGet)
    procs = of(first, "gpu_process")
    assert [(p.fields["pid"], p.tags) for p in procs] == [(5150, {"mig": "1g.18gb/1"})]
    assert "sm_util_pct" not in procs[0].fields  # per-process utilisation: not on MIG
    infos = {(r.tags or {}).get("mig"): r.fields for r in of(first, "gpu_info")}
    assert infos[None]["mig_mode"] == 1 and infos[None]["mig_devices"] == 3
    assert infos[None]["process_access"] == "no_permission"
    assert infos["1g.18gb/1"]["mig_gpu_instance"] == 3 and infos["1g.18gb/1"]["mig_uuid"].startswith("MIG-")
    assert {"mem_used_bytes", "sm_active_pct"} <= set(infos["1g.18gb/1"]["supported_metrics"].split(","))
    assert "util_gpu_pct" in infos["1g.18gb/1"]["unsupported_metrics"].split(",")
    assert n.fake.calls["nvmlGpmSampleGet"] == 0 and n.fake.calls["nvmlGpmMigSampleGet"] >= 6


def test_a_root_agent_also_reads_the_mig_parents_aggregate_memory(node):
    g = mig_h200(0, layout=("1g.18gb",))
    g.mig_devices[0].mem_used = 4 << 30
    n = node([g], fake_kw={"root": True})
    readings = n.cycle(0)
    assert gpu_fields(readings, 0)["mem_used_bytes"] == 4 << 30
    assert of(readings, "gpu_info")[0].fields["process_access"] == "ok"


def test_mig_profile_names_follow_the_drivers_instance_profiles():
    profiles = [
        InstanceProfile(1, 17971, "1g.18gb"),
        InstanceProfile(1, 35942, "1g.35gb"),
        InstanceProfile(2, 35942, "2g.35gb"),
    ]
    assert profile_name(1, 1, 17971, profiles) == "1g.18gb"
    assert profile_name(1, 1, 35900, profiles) == "1g.35gb"
    assert profile_name(2, 1, 35942, profiles) == "1c.2g.35gb"
    assert profile_name(3, 3, 71885, []) == "3g.70gb"  # no table: an approximation in the same form


# -- fields and calls ------------------------------------------------------------------------------
def test_unsupported_field_values_fall_back_to_calls_or_stay_absent(node):
    n = node([h100(0, unsupported={186, 82}, power_mw=123_456)])
    f = gpu_fields(n.cycle(0), 0)
    assert f["power_w"] == pytest.approx(123.456)  # nvmlDeviceGetPowerUsage fallback
    assert "temp_mem_c" not in f
    assert n.fake.calls["nvmlDeviceGetPowerUsage"] >= 2  # probe + cycle


def test_old_drivers_without_the_v2_memory_call_fall_back_to_v1(node):
    n = node([a100(0, memory_v2=False, mem_used=1000)])
    f = gpu_fields(n.cycle(0), 0)
    assert f["mem_used_bytes"] == 1000 + n.fake.gpus[0].mem_reserved  # v1 counts reserved as used
    assert "mem_reserved_bytes" not in f


def test_v2_memory_excludes_driver_reserved_memory(node):
    n = node([h100(0, mem_used=5 << 30)])
    f = gpu_fields(n.cycle(0), 0)
    g = n.fake.gpus[0]
    assert f["mem_used_bytes"] == 5 << 30 and f["mem_reserved_bytes"] == 454 << 20  # as captured
    assert f["mem_used_bytes"] + f["mem_free_bytes"] + f["mem_reserved_bytes"] == g.mem_total


def test_clock_event_reasons_are_a_bitmask_plus_decoded_flags(node):
    n = node([h100(0, reasons=0x4 | 0x40)])
    f = gpu_fields(n.cycle(0), 0)
    assert f["clock_event_reasons"] == 0x44
    assert f["clk_sw_power_cap"] == 1 and f["clk_hw_thermal"] == 1 and f["clk_idle"] == 0
    assert f["throttled"] == 1
    n.fake.gpus[0].reasons = 0x1
    f = gpu_fields(n.cycle(1), 0)
    assert f["clk_idle"] == 1 and f["throttled"] == 0


def test_pcie_throughput_is_the_byte_counters_rate_over_the_cycle_without_waiting(node):
    n = node([busy(h100(0))])
    assert "pcie_tx_bytes_per_s" not in gpu_fields(n.cycle(0), 0)  # a rate needs two reads
    f = gpu_fields(n.cycle(1), 0)
    assert f["pcie_tx_bytes_per_s"] == pytest.approx(2.0e9) and f["pcie_rx_bytes_per_s"] == pytest.approx(1.0e9)
    assert n.fake.calls["nvmlDeviceGetPcieThroughput"] == 0 and not n.fake.waits
    n.fake.gpus[0].pcie_bytes[0] = 0.0  # the counter wrapped: no value rather than a negative one
    assert "pcie_tx_bytes_per_s" not in gpu_fields(n.cycle(2), 0)


def test_without_pcie_counters_the_20_ms_window_is_read_off_the_sampling_thread(node):
    n = node([busy(a100(0))], medium_interval_s=0.2)
    deadline = time.monotonic() + 5
    seen: dict = {}
    t = 0.0
    while "pcie_tx_bytes_per_s" not in seen and time.monotonic() < deadline:
        t += 0.25
        seen = gpu_fields(n.cycle(t), 0)
        time.sleep(0.05)
    assert seen["pcie_tx_bytes_per_s"] == pytest.approx(2.0e9, rel=0.01)
    waiting = set(n.fake.waits)
    assert waiting == {"gpulse-nvml-window"}, waiting


def test_a_gpu_without_the_pcie_window_call_withdraws_the_fields(node):
    g = a100(0, unsupported={"nvmlDeviceGetPcieThroughput"})
    n = node([g], medium_interval_s=0.2)
    assert "pcie_tx_bytes_per_s" in of(n.cycle(0), "gpu_info")[0].fields["supported_metrics"]
    deadline, t, infos = time.monotonic() + 5, 0.0, []
    while not infos and time.monotonic() < deadline:
        t += 0.25
        infos = of(n.cycle(t), "gpu_info")
        time.sleep(0.02)
    assert "pcie_tx_bytes_per_s" in infos[0].fields["unsupported_metrics"].split(",")
    assert n.src.error_counts()["other"] == 0


def test_slow_tiers_appear_only_when_due_in_the_same_field_values_call(node):
    n = node([h100(0)], medium_interval_s=10, slow_interval_s=60)
    seen = {}
    for k in range(0, 61):
        before = n.fake.calls["nvmlDeviceGetFieldValues"]
        readings = n.cycle(k)
        assert n.fake.calls["nvmlDeviceGetFieldValues"] - before == 1
        f = gpu_fields(readings, 0)
        seen[k] = ("throttle_power_us" in f, "ecc_corrected_volatile" in f, len(of(readings, "gpu_nvlink")))
        assert "util_gpu_pct" in f and "energy_mj" in f
    assert [k for k, v in seen.items() if v[0]] == [0, 10, 20, 30, 40, 50, 60]
    assert [k for k, v in seen.items() if v[1]] == [0, 60]
    assert {v[2] for k, v in seen.items() if v[0]} == {18}
    assert all(v[2] == 0 for v in seen.values() if not v[0])
    assert n.fake.calls["nvmlDeviceGetNvLinkState"] == 0


def test_nvlink_counters_per_link_and_the_all_links_total(node, caplog):
    g = h100(0)
    g.nvlink_down = {17}
    n = node([g])
    readings = n.cycle(0)
    links = of(readings, "gpu_nvlink")
    assert sorted(int(r.tags["link"]) for r in links) == list(range(18))
    by_link = {int(r.tags["link"]): r.fields for r in links}
    assert by_link[3] == {"tx_kib": 4_000_000, "rx_kib": 3_600_000, "active": 1}
    assert by_link[17]["active"] == 0
    f = gpu_fields(readings, 0)
    assert f["nvlink_tx_kib"] == sum(v["tx_kib"] for v in by_link.values())
    assert "differ from the sum" not in caplog.text
    g.nvlink_aggregate_skew = 10**9  # the driver's all-links answer disagrees with its links
    with caplog.at_level(logging.WARNING):
        f = gpu_fields(n.cycle(10), 0)
    assert f["nvlink_tx_kib"] == sum(v["tx_kib"] for v in by_link.values()) + 10**9
    assert "differ from the sum of its links" in caplog.text


def test_without_the_all_links_scope_the_total_is_the_sum_of_the_links(node):
    n = node([h100(0, nvlink_aggregate=False)])
    readings = n.cycle(0)
    total = sum(r.fields["tx_kib"] for r in of(readings, "gpu_nvlink"))
    assert gpu_fields(readings, 0)["nvlink_tx_kib"] == total


def test_the_hot_path_does_no_probing_and_no_waiting(node):
    n = node(fake_h100_node(8))
    n.cycle(0)
    n.cycle(1)
    n.fake.calls.clear()
    n.cycle(2)  # a fast-tier-only cycle
    probes = (
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetName",
        "nvmlGpmQueryDeviceSupport",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetNvLinkState",
        "nvmlGpmSampleAlloc",
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetPcieThroughput",
    )
    assert not any(n.fake.calls[p] for p in probes)
    assert n.fake.calls["nvmlDeviceGetFieldValues"] == 8  # one batch per GPU
    assert n.fake.calls["nvmlGpmMetricsGet"] == 8
    assert sum(n.fake.calls.values()) / 8 == 13  # C calls per GPU in a fast cycle
    assert not n.fake.missing and not n.fake.waits


# -- faults ----------------------------------------------------------------------------------------
def test_a_lost_gpu_is_marked_once_and_the_others_keep_going(node):
    n = node(fake_h100_node(3))
    n.cycle(0)
    n.fake.lose(1)
    readings = n.cycle(1)
    assert {r.gpu for r in of(readings, "gpu")} == {0, 2}
    events = of(readings, "gpu_event")
    assert [(e.gpu, e.fields["kind"]) for e in events] == [(1, "gpu_lost")]
    assert n.src.lost() == {1}
    assert n.src.error_counts()["gpu_is_lost"] == 1
    for k in range(2, 5):
        later = n.cycle(k)
        assert {r.gpu for r in of(later, "gpu")} == {0, 2}
        assert of(later, "gpu_event") == []
    assert n.src.error_counts()["gpu_is_lost"] == 1  # no more calls on a lost GPU


def test_at_probe_time_not_supported_drops_a_metric_but_a_transient_error_does_not(node):
    g = h100(0)
    g.fail["nvmlDeviceGetClockInfo"] = [pynvml.NVML_ERROR_NOT_SUPPORTED]  # the SM clock is probed first
    g.fail["nvmlDeviceGetPerformanceState"] = [pynvml.NVML_ERROR_TIMEOUT]
    n = node([g])
    readings = n.cycle(0)
    f = gpu_fields(readings, 0)
    assert "clock_sm_mhz" not in f and f["clock_mem_mhz"] == 2619
    assert f["pstate"] == 0
    info = of(readings, "gpu_info")[0].fields
    assert "clock_sm_mhz" in info["unsupported_metrics"].split(",")
    assert "pstate" in info["supported_metrics"].split(",")
    assert n.src.error_counts()["timeout"] == 1


def test_errors_during_a_cycle_are_counted_by_kind(node):
    n = node([h100(0)])
    g = n.fake.gpus[0]
    g.fail["nvmlDeviceGetClockInfo"] = [pynvml.NVML_ERROR_UNKNOWN]
    g.fail["nvmlDeviceGetPerformanceState"] = [pynvml.NVML_ERROR_NO_PERMISSION]
    g.fail["nvmlDeviceGetTemperatureV"] = [pynvml.NVML_ERROR_TIMEOUT]
    g.fail["nvmlDeviceGetEncoderUtilization"] = [pynvml.NVML_ERROR_INSUFFICIENT_POWER]
    f = gpu_fields(n.cycle(0), 0)
    assert "clock_sm_mhz" not in f and "pstate" not in f and "enc_util_pct" not in f and "temp_gpu_c" not in f
    assert f["clock_graphics_mhz"] == 345 and f["dec_util_pct"] == 0  # the others still read
    c = n.src.error_counts()
    assert (c["unknown"], c["no_permission"], c["timeout"], c["other"]) == (1, 1, 1, 1)
    f = gpu_fields(n.cycle(1), 0)
    assert "pstate" in f and "clock_sm_mhz" in f


def test_driver_reload_reinitialises_with_backoff_and_writes_gpu_info_again(node):
    n = node([h100(0), h100(1)], reinit_backoff_s=(1.0, 8.0))
    assert len(of(n.cycle(0), "gpu_info")) == 2
    n.fake.driver_unload()
    assert of(n.cycle(1), "gpu") == []  # every GPU fails: enter re-init
    assert n.fake.gpm_samples_live == 0  # freed although the driver is gone
    inits = n.fake.calls["nvmlInitWithFlags"]
    tries = []
    for k in range(2, 30):
        readings = n.cycle(k)
        if n.fake.calls["nvmlInitWithFlags"] > inits:
            tries.append(k)
            inits = n.fake.calls["nvmlInitWithFlags"]
        assert of(readings, "gpu") == []
    assert tries[:4] == [2, 4, 8, 16]  # 1 s, 2 s, 4 s, 8 s (capped)
    assert tries[4] == 24
    assert n.src.error_counts()["driver_not_loaded"] >= 5
    n.fake.driver_load()
    readings = n.cycle(32)
    assert len(of(readings, "gpu_info")) == 2 and len(of(readings, "gpu")) == 2
    assert n.src.reinits == 1 and n.src.lost() == set() and n.src.fatal() is None
    assert len(of(n.cycle(33), "gpu_info")) == 0


def test_a_driver_reload_between_cycles_is_noticed_through_stale_handles(node):
    n = node([h100(0)], reinit_backoff_s=(1.0, 60.0))
    n.cycle(0)
    n.fake.driver_unload()
    n.fake.driver_load()  # handles from before are stale: calls answer Uninitialized
    assert of(n.cycle(1), "gpu") == []
    readings = n.cycle(2)
    assert len(of(readings, "gpu")) == 1 and len(of(readings, "gpu_info")) == 1


def test_a_driver_upgrade_cannot_be_recovered_in_process_and_the_source_says_so(node):
    n = node([h100(0)], reinit_backoff_s=(1.0, 1.0))
    n.cycle(0)
    n.fake.upgrade_driver("580.65.06")  # the module is new; this process keeps the old library
    assert of(n.cycle(1), "gpu") == [] and n.src.fatal() is None
    n.cycle(2)
    assert n.src.fatal() is not None and "restart" in n.src.fatal()
    assert n.src.error_counts()["lib_rm_version_mismatch"] >= 2
    calls = sum(n.fake.calls.values())
    assert n.cycle(5) == [] and sum(n.fake.calls.values()) == calls  # no more tries: nothing can change


def test_after_a_driver_upgrade_the_agent_exits_non_zero_with_the_reason(monkeypatch, tmp_path):
    """The agent loop stops cleanly (summary written) and exits 1 for its service manager."""
    from gpulse.agent.config import load_config
    from gpulse.agent.loop import EXIT_FAILURE, Agent
    from gpulse.cli.commands import agent as cmd

    fake = FakeNvml.install(monkeypatch, gpus=[h100(0)])
    parser = __import__("argparse").ArgumentParser()
    cmd.add_arguments(parser)
    args = parser.parse_args(["--record", str(tmp_path / "r.lp"), "--no-socket", "--interval", "0.1",
                              "--duration", "20", "--spool-dir", str(tmp_path / "spool"), "--host", "n",
                              "--summary-file", str(tmp_path / "summary.json")])  # fmt: skip
    source = NvmlSource(events=False, reinit_backoff_s=(0.1, 0.1))
    out = io.StringIO()
    agent = Agent(load_config(args), source=source, stream=out, tty=False)
    t = __import__("threading").Timer(0.5, fake.upgrade_driver, args=("580.65.06",))
    t.start()
    started = time.monotonic()
    rc = agent.run()
    t.join()
    assert rc == EXIT_FAILURE and time.monotonic() - started < 10
    assert "gpulse agent: NVML reports an NVML/RM version mismatch" in out.getvalue()
    assert __import__("json").loads((tmp_path / "summary.json").read_text())["reason"] == "GPU source failed"
    fake.check()


def test_a_gpu_already_lost_at_start_is_left_out_and_the_others_are_sampled(node):
    gpus = fake_h100_node(3)
    gpus[1].lost = True
    n = node(gpus, open=False)
    assert [g.index for g in n.src.open()] == [0, 2]
    assert n.src.lost() == {1}
    assert {r.gpu for r in of(n.cycle(0), "gpu")} == {0, 2}
    assert n.src.error_counts()["gpu_is_lost"] == 1


def test_a_lost_gpu_that_answers_after_a_driver_reload_is_reported_recovered(node):
    n = node(fake_h100_node(2), reinit_backoff_s=(1.0, 1.0))
    n.cycle(0)
    n.fake.lose(1)
    n.cycle(1)
    n.fake.driver_unload()
    n.cycle(2)
    n.fake.gpus[1].lost = False  # the GPU was reset while the driver reloaded
    n.fake.driver_load()
    readings = n.cycle(3)
    assert [(e.gpu, e.fields["kind"]) for e in of(readings, "gpu_event")] == [(1, "gpu_recovered")]
    assert n.src.lost() == set() and {r.gpu for r in of(readings, "gpu")} == {0, 1}


def test_a_field_that_answers_success_with_an_implausible_value_is_not_trusted(node):
    n = node([a100(0, temp_mem=0)])  # check values, not only nvmlReturn
    readings = n.cycle(0)
    assert "temp_mem_c" not in gpu_fields(readings, 0)
    assert "temp_mem_c" in of(readings, "gpu_info")[0].fields["unsupported_metrics"].split(",")


# -- processes -------------------------------------------------------------------------------------
def test_per_process_utilisation_is_the_drivers_one_sample_per_busy_process(node):
    g = h100(0, compute_procs=[(4100, 10 << 30), (4200, None)], graphics_procs=[(4100, 9 << 30)])
    g.proc_util = {4100: (60, 25), 4200: (0, 0)}
    n = node([g], process_interval_s=5)
    first = of(n.cycle(0), "gpu_process")
    assert [p.fields["pid"] for p in first] == [4100, 4200]
    assert [p.ts_ns for p in first] == [T0, T0 + 1]  # none overwrites another
    p0, p1 = (p.fields for p in first)
    assert (p0["sm_util_pct"], p0["mem_util_pct"]) == (60.0, 25.0)
    assert p0["mem_used_bytes"] == 10 << 30
    assert "mem_used_bytes" not in p1 and (p1["sm_util_pct"], p1["mem_util_pct"]) == (0.0, 0.0)
    g.proc_util = {4100: (250, 10), 0: (37100, 100)}  # a value above 100 is clamped; pid 0 is garbage
    second = of(n.cycle(5), "gpu_process")
    assert [(p.fields["pid"], p.fields["sm_util_pct"], p.fields["mem_util_pct"]) for p in second] == [
        (4100, 100.0, 10.0),
        (4200, 0.0, 0.0),
    ]
    g.proc_util = {}  # nothing busy: NotFound means idle, 0 rather than a gap
    third = of(n.cycle(10), "gpu_process")
    assert third[0].fields["sm_util_pct"] == 0.0
    assert n.src.error_counts()["not_found"] == 0


def test_process_command_user_and_container_come_from_proc(node, tmp_path):
    cid = "ab" * 32
    proc = tmp_path / "4100"
    proc.mkdir()
    (proc / "stat").write_text("4100 (python) S 1 4100 4100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0")
    (proc / "cmdline").write_bytes(b"python\0train.py\0--lr\x000.1\0")
    (proc / "status").write_text("Name:\tpython\nUid:\t0\t0\t0\t0\n")
    (proc / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")

    class Containers:
        def get(self, container_id):
            return type("C", (), {"name": "trainer-1"})()

    client = type("Client", (), {"containers": Containers()})()
    describer = ProcessDescriber(proc_root=str(tmp_path), namer=ContainerNamer(client_factory=lambda: client))
    n = node([h100(0, compute_procs=[(4100, 1 << 30)])], describer=describer)
    p = of(n.cycle(0), "gpu_process")[0].fields
    assert (p["command"], p["user"], p["container"]) == ("python train.py --lr 0.1", "root", "trainer-1")


# -- events ----------------------------------------------------------------------------------------
def test_an_xid_event_arrives_through_the_event_thread(node):
    n = node([h100(0), rtx4090(1)], events=True, event_wait_ms=50)
    n.cycle(0)
    before = time.time_ns()
    assert n.fake.emit_event(1, pynvml.nvmlEventTypeXidCriticalError, 79)
    assert n.fake.emit_event(0, pynvml.nvmlEventTypeDoubleBitEccError, 0)
    assert not n.fake.emit_event(1, pynvml.nvmlEventTypeDoubleBitEccError, 0)  # never registered on a 4090
    events: list[Reading] = []
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        events += of(n.cycle(1), "gpu_event")
    kinds = sorted((e.gpu, e.fields["kind"], e.fields["xid"]) for e in events)
    assert kinds == [(0, "ecc_double_bit", 0), (1, "xid", 79)]
    xid = next(e for e in events if e.fields["kind"] == "xid")
    assert "fallen off the bus" in xid.fields["text"] and xid.ts_ns >= before
    assert n.src.error_counts()["timeout"] == 0  # waiting without an event is normal


def test_close_stops_the_event_thread_quickly_and_frees_the_set(node):
    n = node([h100(0)], events=True, event_wait_ms=100)
    t = time.monotonic()
    n.src.close()
    assert time.monotonic() - t < 1.5
    n.fake.check()  # the event set and the GPM samples were freed


# -- end to end ------------------------------------------------------------------------------------
def test_every_reading_encodes_against_the_schema_and_lands_in_influxdb(node, influxdb):
    gpus = [h100(0, compute_procs=[(4100, 1 << 30)]), rtx4090(1), a100(2), mig_h200(3)]
    gpus[3].mig_devices[0].procs = [(5150, 1 << 30)]
    n = node(gpus, events=True, event_wait_ms=50)
    readings = n.cycle(0)
    n.fake.emit_event(0, pynvml.nvmlEventTypeXidCriticalError, 48)
    time.sleep(0.3)
    readings += n.cycle(1)
    enc = Encoder()
    ident = {g.index: g for g in n.src.gpus}
    lines = []
    for r in readings:
        g = ident[r.gpu]
        tags = {"host": "node1", "gpu": str(g.index), "uuid": g.uuid, "model": g.model, **(r.tags or {})}
        assert set(tags) <= set(schema.MEASUREMENTS[r.measurement].all_tags)
        line = enc.line(enc.series(r.measurement, tags), r.fields, r.ts_ns)
        assert line is not None
        lines.append(line)
    assert enc.unknown_fields_dropped == 0 and enc.bad_values_dropped == 0 and enc.nonfinite_dropped == 0
    influxdb.write("".join(lines))
    for m in ("gpu", "gpu_info", "gpu_process", "gpu_event", "gpu_nvlink"):
        expected = len(of(readings, m))
        assert expected > 0, m
        rows = influxdb.rows(f'SELECT * FROM "{m}"')
        assert len(rows) == expected, m
    h100_row = influxdb.rows(
        f"SELECT sm_active_pct, ecc_corrected_aggregate FROM gpu WHERE gpu = '0' AND time = {T0 + S}"
    )
    assert h100_row[0]["sm_active_pct"] == 71.5
    mig_rows = influxdb.rows(f"SELECT mem_total_bytes FROM gpu WHERE mig = '2g.35gb/0' AND time = {T0}")
    assert mig_rows[0]["mem_total_bytes"] == (143771 * 2 // 8) << 20
    field_keys = {r["fieldKey"]: r["fieldType"] for r in influxdb.rows("SHOW FIELD KEYS FROM gpu")}
    for name, ftype in field_keys.items():
        declared = schema.GPU.by_name[name].type
        assert ftype == {"float": "float", "int": "integer", "str": "string", "bool": "boolean"}[declared], name
