"""The simulated source: deterministic, phase-driven, model-aware GPUs (no fake needed: it is the real thing)."""

from __future__ import annotations

import pytest

from gpulse import schema
from gpulse.lineprotocol.encode import Encoder
from gpulse.sources.simulated import MODELS, SimulatedSource, default_scenario

S = 1_000_000_000
T0 = 1_750_000_000 * S  # a fixed instant: every assertion below is reproducible


def gpu(readings, index):
    rows = [r for r in readings if r.measurement == "gpu" and r.gpu == index]
    assert len(rows) == 1
    return rows[0].fields


def opened(n=2, **kw) -> SimulatedSource:
    src = SimulatedSource(n, **kw)
    src.open()
    return src


def test_same_seed_same_readings_and_another_seed_differs():
    a, b, c = opened(4, seed=7), opened(4, seed=7), opened(4, seed=8)
    for k in range(30):
        t = T0 + k * S
        ra, rb, rc = a.collect(t), b.collect(t), c.collect(t)
        assert ra == rb
    assert gpu(ra, 0) != gpu(rc, 0)
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus] != [g.uuid for g in c.gpus]


def test_values_depend_only_on_the_timestamp_not_on_call_order():
    times = [T0 + k * 3 * S for k in range(40)]
    forward, backward = opened(3, seed=1), opened(3, seed=1)
    fwd = {t: forward.collect(t) for t in times}
    bwd = {t: backward.collect(t) for t in reversed(times)}
    for t in times:
        for i in range(3):
            f, b = gpu(fwd[t], i), gpu(bwd[t], i)
            common = f.keys() & b.keys()
            assert "energy_mj" in common and "power_w" in common
            assert {k: f[k] for k in common} == {k: b[k] for k in common}


def test_counters_are_closed_form_integrals_that_match_power():
    busy = opened(1, scenario=lambda t, g: "busy")
    e0 = gpu(busy.collect(T0), 0)["energy_mj"]
    e1 = gpu(busy.collect(T0 + 100 * S), 0)["energy_mj"]
    avg_w = (e1 - e0) / 1000 / 100
    assert avg_w == pytest.approx(700 * 0.88, rel=0.01)  # H100 busy: 88 % of 700 W
    last = 0
    for k in range(0, 3600, 60):  # monotonic within a simulated driver load
        e = gpu(busy.collect(T0 + k * S), 0)["energy_mj"]
        assert e >= last
        last = e


def test_phases_look_like_what_they_are_called():
    phases = {0: "idle", 1: "busy", 2: "starved", 3: "throttled", 4: "straggler"}
    src = opened(5, scenario=lambda t, g: phases[g])
    src.collect(T0)
    r = src.collect(T0 + 10 * S)
    idle, busy, starved, throttled, straggler = (gpu(r, i) for i in range(5))
    m = MODELS["H100"]
    assert idle["util_gpu_pct"] == 0 and idle["clk_idle"] == 1 and idle["power_w"] < 100
    assert busy["util_gpu_pct"] > 90 and busy["sm_active_pct"] > 60 and busy["throttled"] == 0
    assert starved["mem_used_bytes"] > 0.9 * m.mem_total and starved["util_gpu_pct"] < 40
    assert starved["sm_active_pct"] < 25 and starved["pcie_rx_bytes_per_s"] > 3 * busy["pcie_rx_bytes_per_s"]
    assert throttled["throttled"] == 1 and throttled["clk_hw_thermal"] == 1 and throttled["temp_gpu_c"] > 80
    assert throttled["clock_sm_mhz"] < 0.8 * m.sm_max
    assert straggler["clk_sw_power_cap"] == 1 and straggler["clock_sm_mhz"] < busy["clock_sm_mhz"]
    t_a = throttled["throttle_thermal_us"]
    t_b = gpu(src.collect(T0 + 20 * S), 3)["throttle_thermal_us"]
    assert (t_b - t_a) / 10 == pytest.approx(900_000, rel=0.01)  # µs held back per second
    procs = {p.gpu for p in r if p.measurement == "gpu_process"}
    assert procs == {1, 2, 3, 4}  # nothing runs on the idle GPU


def test_the_default_schedule_throttles_the_noisy_gpu_only():
    phase = default_scenario(8)
    t = T0 - T0 % (1800 * S) + 1300 * S
    assert phase(t, 7) == "throttled"
    assert {phase(t, g) for g in range(7)} == {"busy"}
    assert phase(T0 - T0 % (1800 * S) + 10 * S, 0) == "idle"


@pytest.mark.parametrize("model", ["H100", "A100", "RTX4090"])
def test_gpu_info_lists_exactly_the_fields_the_model_produces(model):
    src = opened(2, model=model)
    seen: set[str] = set()
    info = None
    for k in range(0, 65):
        for r in src.collect(T0 + k * S):
            if r.measurement == "gpu":
                seen |= r.fields.keys()
            elif r.measurement == "gpu_info" and r.gpu == 0:
                info = r.fields
    assert info is not None and info["name"] == MODELS[model].name
    assert seen == set(info["supported_metrics"].split(","))
    assert seen.isdisjoint(info["unsupported_metrics"].split(","))
    assert seen <= schema.GPU.by_name.keys()


def test_model_capabilities():
    rtx, a100, h100 = opened(1, model="RTX4090"), opened(1, model="A100"), opened(1, model="h100")
    rtx_f = [gpu(rtx.collect(T0 + k * S), 0) for k in range(2)]
    a_r = [a100.collect(T0 + k * S) for k in range(2)]
    h_f = [gpu(h100.collect(T0 + k * S), 0) for k in range(2)]
    assert "fan_pct" in rtx_f[1] and not {"sm_active_pct", "ecc_corrected_volatile", "nvlink_tx_kib", "temp_mem_c"} & (
        rtx_f[0].keys() | rtx_f[1].keys()
    )
    assert "sm_active_pct" not in gpu(a_r[1], 0) and "nvlink_tx_kib" in gpu(a_r[0], 0)
    assert len([r for r in a_r[0] if r.measurement == "gpu_nvlink"]) == 12
    assert "sm_active_pct" not in h_f[0] and "sm_active_pct" in h_f[1]  # GPM needs two samples, as on NVML
    with pytest.raises(ValueError, match="unknown simulated model"):
        SimulatedSource(1, model="V100")


def test_an_injected_event_is_reported_once_with_its_own_timestamp():
    src = opened(2)
    src.inject_event(1, T0 + 5 * S + 123, "xid", xid=79, text="GPU has fallen off the bus")
    events = []
    for k in range(10):
        events += [r for r in src.collect(T0 + k * S) if r.measurement == "gpu_event"]
    assert len(events) == 1
    e = events[0]
    assert (e.gpu, e.ts_ns, e.fields["kind"], e.fields["xid"]) == (1, T0 + 5 * S + 123, "xid", 79)


def test_every_reading_encodes_against_the_schema():
    src = opened(8, model="H100", scenario=lambda t, g: ("busy", "idle", "starved", "throttled", "straggler")[g % 5])
    src.inject_event(0, T0, "xid", xid=48, text="DBE")
    enc = Encoder()
    lines = 0
    for k in range(0, 70, 5):
        for r in src.collect(T0 + k * S):
            tags = {"host": "n", "gpu": str(r.gpu), "uuid": "u", "model": "m", **(r.tags or {})}
            lines += enc.line(enc.series(r.measurement, tags), r.fields, r.ts_ns) is not None
    assert lines > 8 * 14
    assert enc.stats() == {
        "values_dropped_nonfinite": 0,
        "fields_dropped_unknown": 0,
        "values_dropped_bad": 0,
        "points_empty": 0,
    }


def test_the_simulated_source_honours_the_source_contract():
    src = SimulatedSource(3)
    assert src.collect(T0) == []  # not opened yet
    src.open()
    assert [g.index for g in src.gpus] == [0, 1, 2]
    first = src.collect(T0)
    assert len([r for r in first if r.measurement == "gpu_info"]) == 3
    assert all(r.ts_ns == T0 for r in first if r.measurement == "gpu")
    assert not [r for r in src.collect(T0 + S) if r.measurement == "gpu_info"]
    assert src.error_counts() == dict.fromkeys(schema.NVML_ERROR_KINDS, 0) and src.lost() == set()
    src.close()
