"""``metrics_report.json`` keeps seed 000's field names: the typed records write the same JSON keys.

``SEED_KEYS`` are the key paths of the report that the dict-built ``build_report`` (before the typed
records) wrote for :func:`seed_input`; lists are ``[]``, and the open-ended maps
(``phases_s``, ``throttle_reasons``, a finding's ``data``) count as one key each. A field added on
purpose goes into ``ADDED_KEYS`` with the change that adds it, so a rename or a lost field fails here.
"""

from __future__ import annotations

import json
from typing import Any

from test_report import T0, S, make_gpu, make_steps

from gpulse.report.model import build_report

#: fields added to the report since seed 000
ADDED_KEYS: set[str] = {
    # issue 13: the report says when it lacks ranks, and tells exposed communication, time in flight
    # and waiting for a straggler apart
    "partial",
    "partial_reason",
    "communication_in_flight_ratio",
    "wait_for_slower_ranks_ratio",
    "hints",
    "per_rank[].communication_in_flight_ratio",
    "per_rank[].wait_for_slower_ranks_s",
    "per_rank[].median_busy_time_s",
    # issue 27: the GPU events of the run's GPUs (XID, ECC, lost)
    "gpu_events",
    *(f"gpu_events[].{k}" for k in ("time_ns", "host", "gpu", "kind", "xid", "text", "uuid")),
    "sources.gpu_event",
    # issue 28: the host beside the GPUs (null here: the seed input has no host points)
    "host",
    "thresholds.loader_busy_ratio",
    "thresholds.loader_disk_sleep_ratio",
    "thresholds.loader_iowait_pct",
    "thresholds.free_core_min",
    # issue 28: the profiler windows rolling findings asked for (empty here: the seed input has none)
    "profiles",
}
#: keys whose values are open-ended maps: their own keys are data, not field names
OPEN_MAPS = ("phases_s", "throttle_reasons", "data")

SEED_KEYS = (
    "alloc_retries",
    "communication_time_ratio",
    "data_loading_time_ratio",
    "diagnosis",
    "diagnosis[].action",
    "diagnosis[].data",
    "diagnosis[].evidence",
    "diagnosis[].id",
    "diagnosis[].threshold",
    "diagnosis[].title",
    "end_time_ns",
    "energy_j_per_step",
    "energy_kwh",
    "events",
    "events[].kind",
    "events[].rank",
    "events[].step",
    "events[].text",
    "events[].time_ns",
    "gpu_avg_memory_used_percent",
    "gpu_avg_power_w",
    "gpu_avg_sm_active_percent",
    "gpu_avg_tensor_active_percent",
    "gpu_avg_utilization_percent",
    "gpu_max_utilization_percent",
    "gpu_memory_capacity_gb",
    "gpu_peak_memory_allocated_gb",
    "gpu_peak_memory_reserved_gb",
    "gpulse_report_version",
    "mfu",
    "not_evaluated",
    "per_gpu",
    "per_gpu[].avg_memory_used_percent",
    "per_gpu[].avg_power_w",
    "per_gpu[].avg_sm_active_percent",
    "per_gpu[].avg_sm_clock_mhz",
    "per_gpu[].avg_tensor_active_percent",
    "per_gpu[].avg_utilization_percent",
    "per_gpu[].energy_j",
    "per_gpu[].gpu",
    "per_gpu[].host",
    "per_gpu[].key",
    "per_gpu[].max_utilization_percent",
    "per_gpu[].memory_total_gb",
    "per_gpu[].model",
    "per_gpu[].peak_memory_used_gb",
    "per_gpu[].samples",
    "per_gpu[].throttle_reasons",
    "per_gpu[].throttle_time_ratio",
    "per_gpu[].throttle_time_s",
    "per_gpu[].uuid",
    "per_rank",
    "per_rank[].alloc_retries",
    "per_rank[].communication_time_ratio",
    "per_rank[].data_loading_time_ratio",
    "per_rank[].gpus",
    "per_rank[].host",
    "per_rank[].mean_step_time_s",
    "per_rank[].median_compute_time_s",
    "per_rank[].median_step_time_s",
    "per_rank[].peak_memory_allocated_gb",
    "per_rank[].rank",
    "per_rank[].samples_per_second",
    "per_rank[].slowdown_vs_median",
    "per_rank[].steps",
    "phases_s",
    "run",
    "run.config",
    "run.flops_per_token",
    "run.gpus",
    "run.hosts",
    "run.id",
    "run.mfu_formula",
    "run.name",
    "run.peak_flops",
    "run.ranks",
    "run.status",
    "run.world_size",
    "sources",
    "sources.gpu",
    "sources.train_event",
    "sources.train_run",
    "sources.train_step",
    "start_time_ns",
    "step_time_s",
    "step_time_s.max",
    "step_time_s.mean",
    "step_time_s.median",
    "step_time_s.p90",
    "tflops_per_gpu",
    "thresholds",
    "thresholds.communication_ratio",
    "thresholds.data_loading_ratio",
    "thresholds.fragmentation_memory_pct",
    "thresholds.fragmentation_retries",
    "thresholds.imbalance_factor",
    "thresholds.imbalance_min_util_pct",
    "thresholds.launch_bound_sm_active_pct",
    "thresholds.launch_bound_util_pct",
    "thresholds.starved_util_pct",
    "thresholds.throttle_ratio",
    "throttle_time_ratio",
    "throttle_time_s",
    "train_runtime",
    "train_samples",
    "train_samples_per_second",
    "train_steps",
    "train_steps_per_second",
    "train_tokens",
    "train_tokens_per_second",
)


def key_paths(value: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else k
            out.add(path)
            if k not in OPEN_MAPS:
                out |= key_paths(v, path)
    elif isinstance(value, list):
        for v in value:
            out |= key_paths(v, prefix + "[]")
    return out


def seed_input() -> tuple[list[dict[str, Any]], ...]:
    """Rows that fill every field: 3 ranks (one slow) with comm, retries and a custom phase; 2 GPUs,
    one idle and throttled; a run's start and end points; a checkpoint."""
    steps = make_steps(ranks=3, n=12, slow_rank=2)
    for r in steps:
        r.update(comm_s=0.02, comm_in_flight_s=0.03, alloc_retries=2, phase_loss_s=0.001, mem_reserved_bytes=79 * 2**30)
    gpu = make_gpu(n=20, gpus=2, util=(95.0, 20.0), throttled_every=2)
    for r in gpu:
        r.update(clk_sw_power_cap=1, tensor_active_pct=30.0, clock_sm_mhz=1700)
    runs = [
        {"time": T0, "run": "r1", "rank": "0", "host": "node1", "event": "start", "status": "running", "name": "exp",
         "world_size": 3, "mfu_formula": "6N", "peak_flops": 9.89e14, "config": '{"lr": 0.1}'},
        {"time": T0 + 5 * S, "run": "r1", "rank": "0", "host": "node1", "event": "end", "status": "finished",
         "duration_s": 5.0, "gpus": "GPU-0,GPU-1", "steps": 12, "flops_per_token": 1.0e9},
    ]  # fmt: skip
    events = [{"time": T0 + 2 * S, "run": "r1", "rank": "0", "kind": "checkpoint", "text": "saved", "step": 5}]
    return steps, gpu, runs, events


def test_the_json_has_exactly_seed_000_s_keys_plus_the_ones_added_on_purpose() -> None:
    xid = {"time": T0 + 3 * S, "host": "node1", "gpu": "1", "uuid": "GPU-1", "kind": "xid", "xid": 31, "text": "fault"}
    report = build_report(*seed_input(), gpu_events=[xid])
    doc = json.loads(json.dumps(report.to_json(), default=str))  # what json.dump writes to the file
    keys = key_paths(doc)
    assert sorted(keys - ADDED_KEYS) == sorted(SEED_KEYS)
    assert ADDED_KEYS <= keys
    # every rule of the diagnosis fired or said why not: the input reaches every field above
    assert {f["id"] for f in doc["diagnosis"]} == {
        "gpu_errors",
        "communication",
        "gpu_starved",
        "gpu_imbalance",
        "throttling",
        "rank_imbalance",
        "fragmentation",
    }
    # partial_reason is null for a report that covers every rank, as this one does
    assert doc["partial"] is False
    # host is null without the agent's host points (test_host_report.py fills it)
    assert all(v is not None for k, v in doc.items() if k not in ("not_evaluated", "partial_reason", "host")), [
        k for k, v in doc.items() if v is None
    ]
