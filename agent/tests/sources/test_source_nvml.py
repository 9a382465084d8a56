"""The NVML source, specified against a fake libnvidia-ml (``support.fake_pynvml``).

The fake stands in for the NVIDIA driver seen through the real ``pynvml`` module: real exception
classes, constants and ctypes structures, scripted per GPU (H100 with GPM/NVLink/ECC, RTX 4090
without, MIG, lost GPUs, driver reloads, events). No test here needs a GPU.
"""

from __future__ import annotations

import inspect
import time

import pynvml
import pytest
from support.fake_pynvml import FakeGpu, FakeNvml, a100, fake_h100_node, h100, rtx4090

from gpulse import schema
from gpulse.lineprotocol.encode import Encoder
from gpulse.sources.base import Reading, SourceUnavailable
from gpulse.sources.nvml.source import NvmlSource
from gpulse.sources.processes import ContainerNamer, ProcessDescriber

S = 1_000_000_000
T0 = 1_750_000_000 * S
GPM_FIELDS = ("sm_active_pct", "tensor_active_pct", "dram_bw_pct", "nvlink_tx_bytes_per_s")
ECC_NVLINK_FIELDS = ("ecc_corrected_volatile", "remapped_rows_pending", "nvlink_tx_kib", "throttle_thermal_us")


def gpu_fields(readings: list[Reading], index: int) -> dict:
    rows = [r for r in readings if r.measurement == "gpu" and r.gpu == index]
    assert len(rows) == 1, f"expected one gpu reading for GPU {index}, got {len(rows)}"
    return rows[0].fields


def of(readings: list[Reading], measurement: str) -> list[Reading]:
    return [r for r in readings if r.measurement == measurement]


@pytest.fixture
def source_factory(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """Installs the fake with the given GPUs and yields opened sources; closes them afterwards."""
    made: list[NvmlSource] = []

    def make(gpus: list[FakeGpu], **kw) -> tuple[FakeNvml, NvmlSource]:
        fake = FakeNvml.install(monkeypatch, gpus=gpus)
        kw.setdefault("events", False)
        kw.setdefault(
            "describer", ProcessDescriber(proc_root=str(tmp_path), namer=ContainerNamer(client_factory=lambda: None))
        )
        src = NvmlSource(**kw)
        made.append(src)
        src.open()
        return fake, src

    yield make
    for s in made:
        s.close()


def test_the_fake_has_the_real_pynvml_signatures(monkeypatch):
    real = {name: inspect.signature(getattr(pynvml, name)) for name in FakeNvml.FUNCTIONS}
    fake = FakeNvml.install(monkeypatch, gpus=[h100(0)])
    for name, sig in real.items():
        got = inspect.signature(getattr(fake, name))
        assert list(got.parameters) == list(sig.parameters), name


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


def test_consumer_gpu_without_gpm_ecc_nvlink_leaves_those_fields_absent_never_zero(source_factory):
    _fake, src = source_factory([rtx4090(0)])
    first = src.collect(T0)
    second = src.collect(T0 + S)
    for readings in (first, second):
        f = gpu_fields(readings, 0)
        for name in GPM_FIELDS + ECC_NVLINK_FIELDS + ("temp_mem_c",):
            assert name not in f
        assert f["fan_pct"] == 30
    assert of(first, "gpu_nvlink") == []
    info = of(first, "gpu_info")[0].fields
    assert info["gpm_supported"] == 0 and info["nvlink_links"] == 0
    assert "ecc_corrected_volatile" in info["unsupported_metrics"].split(",")
    assert "fan_pct" in info["supported_metrics"].split(",")
    assert src.error_counts() == dict.fromkeys(schema.NVML_ERROR_KINDS, 0)


def test_hopper_gpm_needs_two_samples_then_reports_every_cycle(source_factory):
    fake, src = source_factory([h100(0)])
    first = gpu_fields(src.collect(T0), 0)
    assert not any(name in first for name in GPM_FIELDS)
    fake.gpus[0].gpm_values[2] = 88.25
    second = gpu_fields(src.collect(T0 + S), 0)
    assert second["sm_active_pct"] == 88.25
    assert second["nvlink_tx_bytes_per_s"] == 110_000.0 * 1048576  # MiB/s -> B/s
    assert second["gpm_pcie_rx_bytes_per_s"] == 2400.0 * 1048576
    # the two buffers alternate: the fake refuses a metrics request on the same sample twice
    third = gpu_fields(src.collect(T0 + 2 * S), 0)
    assert third["sm_active_pct"] == 88.25
    assert fake.calls["nvmlGpmSampleAlloc"] == 2


def test_gpm_is_skipped_when_cycles_come_faster_than_100_ms(source_factory):
    _fake, src = source_factory([h100(0)])
    src.collect(T0)
    fast = gpu_fields(src.collect(T0 + 50_000_000), 0)
    assert "sm_active_pct" not in fast
    later = gpu_fields(src.collect(T0 + 150_000_000), 0)
    assert "sm_active_pct" in later


def test_a_gpm_metric_that_says_not_supported_is_dropped_and_gpu_info_is_written_again(source_factory):
    fake, src = source_factory([h100(0)])
    del fake.gpus[0].gpm_values[11]  # FP64_UTIL
    src.collect(T0)
    second = src.collect(T0 + S)
    f = gpu_fields(second, 0)
    assert "fp64_active_pct" not in f and f["fp32_active_pct"] == 11.0
    infos = of(second, "gpu_info")
    assert len(infos) == 1 and "fp64_active_pct" in infos[0].fields["unsupported_metrics"].split(",")
    assert src.error_counts()["other"] == 1
    third = src.collect(T0 + 2 * S)
    assert of(third, "gpu_info") == [] and "fp64_active_pct" not in gpu_fields(third, 0)
    assert src.error_counts()["other"] == 1  # dropped for good, not counted again


def test_mig_mode_reports_what_the_parent_gpu_still_answers(source_factory):
    _fake, src = source_factory([h100(0, mig=True, compute_procs=[(4242, 1 << 30)])])
    first = src.collect(T0)
    f = gpu_fields(src.collect(T0 + S), 0)
    assert "util_gpu_pct" not in f and "sm_active_pct" not in f
    assert f["mem_used_bytes"] == 0 and f["power_w"] == 70.0
    info = of(first, "gpu_info")[0].fields
    assert info["mig_mode"] == 1 and info["gpm_supported"] == 0
    proc = of(first, "gpu_process")[0].fields
    assert proc["pid"] == 4242 and "sm_util_pct" not in proc


def test_unsupported_field_values_fall_back_to_calls_or_stay_absent(source_factory):
    fake, src = source_factory([h100(0, unsupported={186, 82}, power_mw=123_456)])
    f = gpu_fields(src.collect(T0), 0)
    assert f["power_w"] == pytest.approx(123.456)  # nvmlDeviceGetPowerUsage fallback
    assert "temp_mem_c" not in f
    assert fake.calls["nvmlDeviceGetPowerUsage"] >= 2  # probe + cycle


def test_old_drivers_without_the_v2_memory_call_fall_back_to_v1(source_factory):
    fake, src = source_factory([a100(0, memory_v2=False, mem_used=1000)])
    f = gpu_fields(src.collect(T0), 0)
    assert f["mem_used_bytes"] == 1000 + fake.gpus[0].mem_reserved  # v1 counts reserved as used
    assert "mem_reserved_bytes" not in f


def test_v2_memory_excludes_driver_reserved_memory(source_factory):
    fake, src = source_factory([h100(0, mem_used=5 << 30)])
    f = gpu_fields(src.collect(T0), 0)
    g = fake.gpus[0]
    assert f["mem_used_bytes"] == 5 << 30 and f["mem_reserved_bytes"] == g.mem_reserved
    assert f["mem_used_bytes"] + f["mem_free_bytes"] + f["mem_reserved_bytes"] == g.mem_total


def test_clock_event_reasons_are_a_bitmask_plus_decoded_flags(source_factory):
    fake, src = source_factory([h100(0, reasons=0x4 | 0x40)])
    f = gpu_fields(src.collect(T0), 0)
    assert f["clock_event_reasons"] == 0x44
    assert f["clk_sw_power_cap"] == 1 and f["clk_hw_thermal"] == 1 and f["clk_idle"] == 0
    assert f["throttled"] == 1
    fake.gpus[0].reasons = 0x1
    f = gpu_fields(src.collect(T0 + S), 0)
    assert f["clk_idle"] == 1 and f["throttled"] == 0


def test_slow_tiers_appear_only_when_due(source_factory):
    _fake, src = source_factory([h100(0)], medium_interval_s=10, slow_interval_s=60)
    seen = {}
    for k in range(0, 61):
        readings = src.collect(T0 + k * S)
        f = gpu_fields(readings, 0)
        seen[k] = ("throttle_power_us" in f, "ecc_corrected_volatile" in f, len(of(readings, "gpu_nvlink")))
        assert "util_gpu_pct" in f and "energy_mj" in f
    assert [k for k, v in seen.items() if v[0]] == [0, 10, 20, 30, 40, 50, 60]
    assert [k for k, v in seen.items() if v[1]] == [0, 60]
    assert {v[2] for k, v in seen.items() if v[0]} == {18}
    assert all(v[2] == 0 for v in seen.values() if not v[0])


def test_nvlink_counters_per_link_and_their_total(source_factory):
    g = h100(0)
    g.nvlink_down = {17}
    _fake, src = source_factory([g])
    readings = src.collect(T0)
    links = of(readings, "gpu_nvlink")
    assert sorted(int(r.tags["link"]) for r in links) == list(range(18))
    by_link = {int(r.tags["link"]): r.fields for r in links}
    assert by_link[3] == {"tx_kib": 4_000_000, "rx_kib": 3_600_000, "active": 1}
    assert by_link[17]["active"] == 0
    f = gpu_fields(readings, 0)
    assert f["nvlink_tx_kib"] == sum(v["tx_kib"] for v in by_link.values())


def test_a_lost_gpu_is_marked_once_and_the_others_keep_going(source_factory):
    fake, src = source_factory(fake_h100_node(3))
    src.collect(T0)
    fake.lose(1)
    readings = src.collect(T0 + S)
    assert {r.gpu for r in of(readings, "gpu")} == {0, 2}
    events = of(readings, "gpu_event")
    assert [(e.gpu, e.fields["kind"]) for e in events] == [(1, "gpu_lost")]
    assert src.lost() == {1}
    assert src.error_counts()["gpu_is_lost"] == 1
    for k in range(2, 5):
        later = src.collect(T0 + k * S)
        assert {r.gpu for r in of(later, "gpu")} == {0, 2}
        assert of(later, "gpu_event") == []
    assert src.error_counts()["gpu_is_lost"] == 1  # no more calls on a lost GPU


def test_at_probe_time_not_supported_drops_a_metric_but_a_transient_error_does_not(monkeypatch):
    g = h100(0)
    g.fail["nvmlDeviceGetClockInfo"] = [pynvml.NVML_ERROR_NOT_SUPPORTED]  # the SM clock is probed first
    g.fail["nvmlDeviceGetPerformanceState"] = [pynvml.NVML_ERROR_TIMEOUT]
    FakeNvml.install(monkeypatch, gpus=[g])
    src = NvmlSource(events=False)
    try:
        src.open()
        readings = src.collect(T0)
        f = gpu_fields(readings, 0)
        assert "clock_sm_mhz" not in f and f["clock_mem_mhz"] == 1593
        assert f["pstate"] == 0
        info = of(readings, "gpu_info")[0].fields
        assert "clock_sm_mhz" in info["unsupported_metrics"].split(",")
        assert "pstate" in info["supported_metrics"].split(",")
        assert src.error_counts()["timeout"] == 1
    finally:
        src.close()


def test_errors_during_a_cycle_are_counted_by_kind(source_factory):
    fake, src = source_factory([h100(0)])
    g = fake.gpus[0]
    g.fail["nvmlDeviceGetClockInfo"] = [pynvml.NVML_ERROR_UNKNOWN]
    g.fail["nvmlDeviceGetPerformanceState"] = [pynvml.NVML_ERROR_NO_PERMISSION]
    g.fail["nvmlDeviceGetPcieThroughput"] = [pynvml.NVML_ERROR_TIMEOUT]
    g.fail["nvmlDeviceGetEncoderUtilization"] = [pynvml.NVML_ERROR_INSUFFICIENT_POWER]
    f = gpu_fields(src.collect(T0), 0)
    assert "clock_sm_mhz" not in f and "pstate" not in f and "enc_util_pct" not in f
    assert "pcie_tx_bytes_per_s" not in f
    assert f["clock_graphics_mhz"] == 345 and f["pcie_rx_bytes_per_s"] == 2000 * 1024  # the others still read
    c = src.error_counts()
    assert (c["unknown"], c["no_permission"], c["timeout"], c["other"]) == (1, 1, 1, 1)
    f = gpu_fields(src.collect(T0 + S), 0)
    assert "pstate" in f and "clock_sm_mhz" in f


def test_driver_reload_reinitialises_with_backoff_and_writes_gpu_info_again(source_factory):
    fake, src = source_factory([h100(0), h100(1)], reinit_backoff_s=(1.0, 8.0))
    assert len(of(src.collect(T0), "gpu_info")) == 2
    fake.driver_unload()
    assert of(src.collect(T0 + S), "gpu") == []  # every GPU fails: enter re-init
    inits = fake.calls["nvmlInit"]
    tries = []
    for k in range(2, 30):
        readings = src.collect(T0 + k * S)
        if fake.calls["nvmlInit"] > inits:
            tries.append(k)
            inits = fake.calls["nvmlInit"]
        assert of(readings, "gpu") == []
    assert tries[:4] == [2, 4, 8, 16]  # 1 s, 2 s, 4 s, 8 s (capped)
    assert tries[4] == 24
    assert src.error_counts()["driver_not_loaded"] >= 5
    fake.driver_load()
    k = 32
    readings = src.collect(T0 + k * S)
    assert len(of(readings, "gpu_info")) == 2 and len(of(readings, "gpu")) == 2
    assert src.reinits == 1 and src.lost() == set()
    assert len(of(src.collect(T0 + (k + 1) * S), "gpu_info")) == 0


def test_a_driver_reload_between_cycles_is_noticed_through_stale_handles(source_factory):
    fake, src = source_factory([h100(0)], reinit_backoff_s=(1.0, 60.0))
    src.collect(T0)
    fake.driver_unload()
    fake.driver_load()  # handles from before are stale: calls answer Uninitialized
    assert of(src.collect(T0 + S), "gpu") == []
    readings = src.collect(T0 + 2 * S)
    assert len(of(readings, "gpu")) == 1 and len(of(readings, "gpu_info")) == 1


def test_per_process_utilisation_uses_a_stored_timestamp_cursor(source_factory, tmp_path):
    g = h100(0, compute_procs=[(4100, 10 << 30), (4200, None)], graphics_procs=[(4100, 9 << 30)])
    now_us = T0 // 1000
    g.proc_samples = [
        (4100, now_us - 10_000_000, 99, 99),  # older than the first window: ignored
        (4100, now_us - 1_000_000, 50, 20),
        (4100, now_us - 500_000, 70, 30),
        (0, now_us - 400_000, 37100, 100),  # garbage row around a zombie context
    ]
    _fake, src = source_factory([g], process_interval_s=5)
    first = of(src.collect(T0), "gpu_process")
    assert [p.fields["pid"] for p in first] == [4100, 4200]
    assert [p.ts_ns for p in first] == [T0, T0 + 1]  # none overwrites another
    p0, p1 = (p.fields for p in first)
    assert (p0["sm_util_pct"], p0["mem_util_pct"]) == (60.0, 25.0)
    assert p0["mem_used_bytes"] == 10 << 30
    assert "mem_used_bytes" not in p1 and (p1["sm_util_pct"], p1["mem_util_pct"]) == (0.0, 0.0)
    # next sample: only rows newer than the cursor count; a value above 100 is clamped
    g.proc_samples.append((4100, now_us + 1_000_000, 250, 10))
    second = of(src.collect(T0 + 5 * S), "gpu_process")
    assert second[0].fields["sm_util_pct"] == 100.0 and second[0].fields["mem_util_pct"] == 10.0
    # nothing newer: NotFound means idle, 0 rather than a gap
    third = of(src.collect(T0 + 10 * S), "gpu_process")
    assert third[0].fields["sm_util_pct"] == 0.0
    assert src.error_counts()["not_found"] == 0


def test_process_command_user_and_container_come_from_proc(source_factory, tmp_path):
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
    _fake, src = source_factory([h100(0, compute_procs=[(4100, 1 << 30)])], describer=describer)
    p = of(src.collect(T0), "gpu_process")[0].fields
    assert (p["command"], p["user"], p["container"]) == ("python train.py --lr 0.1", "root", "trainer-1")


def test_an_xid_event_arrives_through_the_event_thread(source_factory):
    fake, src = source_factory([h100(0), rtx4090(1)], events=True, event_wait_ms=50)
    src.collect(T0)
    before = time.time_ns()
    assert fake.emit_event(1, pynvml.nvmlEventTypeXidCriticalError, 79)
    assert fake.emit_event(0, pynvml.nvmlEventTypeDoubleBitEccError, 0)
    assert not fake.emit_event(1, pynvml.nvmlEventTypeDoubleBitEccError, 0)  # never registered on a 4090
    events: list[Reading] = []
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        events += of(src.collect(T0 + S), "gpu_event")
    kinds = sorted((e.gpu, e.fields["kind"], e.fields["xid"]) for e in events)
    assert kinds == [(0, "ecc_double_bit", 0), (1, "xid", 79)]
    xid = next(e for e in events if e.fields["kind"] == "xid")
    assert "fallen off the bus" in xid.fields["text"] and xid.ts_ns >= before
    assert src.error_counts()["timeout"] == 0  # waiting without an event is normal


def test_close_stops_the_event_thread_quickly(source_factory):
    fake, src = source_factory([h100(0)], events=True, event_wait_ms=100)
    t = time.monotonic()
    src.close()
    assert time.monotonic() - t < 1.5
    assert fake._event_sets == {}  # the set was freed


def test_the_hot_path_does_no_probing(source_factory):
    fake, src = source_factory(fake_h100_node(8))
    src.collect(T0)
    src.collect(T0 + S)
    fake.calls.clear()
    src.collect(T0 + 2 * S)  # a fast-tier-only cycle
    probes = (
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlGpmQueryDeviceSupport",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetNvLinkState",
        "nvmlGpmSampleAlloc",
        "nvmlDeviceGetFanSpeed",
    )
    assert not any(fake.calls[p] for p in probes)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 8  # one batch per GPU
    assert fake.calls["nvmlGpmMetricsGet"] == 8
    assert not fake.missing


def test_every_reading_encodes_against_the_schema_and_lands_in_influxdb(source_factory, influxdb, tmp_path):
    fake, src = source_factory(
        [h100(0, compute_procs=[(4100, 1 << 30)]), rtx4090(1), a100(2)], events=True, event_wait_ms=50
    )
    readings = src.collect(T0)
    fake.emit_event(0, pynvml.nvmlEventTypeXidCriticalError, 48)
    time.sleep(0.3)
    readings += src.collect(T0 + S)
    enc = Encoder()
    ident = {g.index: g for g in src.gpus}
    lines = []
    for r in readings:
        g = ident[r.gpu]
        tags = {"host": "node1", "gpu": str(g.index), "uuid": g.uuid, "model": g.model, **(r.tags or {})}
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
    field_keys = {r["fieldKey"]: r["fieldType"] for r in influxdb.rows("SHOW FIELD KEYS FROM gpu")}
    for name, ftype in field_keys.items():
        declared = schema.GPU.by_name[name].type
        assert ftype == {"float": "float", "int": "integer", "str": "string", "bool": "boolean"}[declared], name


def test_a_field_that_answers_success_with_an_implausible_value_is_not_trusted(source_factory):
    # a renumbered field id answers SUCCESS with nonsense: check values, not only nvmlReturn
    _fake, src = source_factory([a100(0, temp_mem=0)])
    readings = src.collect(T0)
    assert "temp_mem_c" not in gpu_fields(readings, 0)
    assert "temp_mem_c" in of(readings, "gpu_info")[0].fields["unsupported_metrics"].split(",")


def test_a_gpu_already_lost_at_start_is_left_out_and_the_others_are_sampled(monkeypatch):
    gpus = fake_h100_node(3)
    gpus[1].lost = True
    FakeNvml.install(monkeypatch, gpus=gpus)
    src = NvmlSource(events=False)
    try:
        assert [g.index for g in src.open()] == [0, 2]
        assert src.lost() == {1}
        assert {r.gpu for r in of(src.collect(T0), "gpu")} == {0, 2}
        assert src.error_counts()["gpu_is_lost"] == 1
    finally:
        src.close()


def test_a_lost_gpu_that_answers_after_a_driver_reload_is_reported_recovered(source_factory):
    fake, src = source_factory(fake_h100_node(2), reinit_backoff_s=(1.0, 1.0))
    src.collect(T0)
    fake.lose(1)
    src.collect(T0 + S)
    fake.driver_unload()
    src.collect(T0 + 2 * S)
    fake.gpus[1].lost = False  # the GPU was reset while the driver reloaded
    fake.driver_load()
    readings = src.collect(T0 + 3 * S)
    assert [(e.gpu, e.fields["kind"]) for e in of(readings, "gpu_event")] == [(1, "gpu_recovered")]
    assert src.lost() == set() and {r.gpu for r in of(readings, "gpu")} == {0, 1}
