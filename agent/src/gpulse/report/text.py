"""The report as text for a terminal: the diagnosis first, then the numbers behind it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _fmt(v: Any, unit: str = "", digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def render_text(r: Mapping[str, Any]) -> str:
    run = r.get("run") or {}
    out = [f"gpulse report: run {run.get('id')} ({run.get('name') or 'unnamed'}, {run.get('status')})", ""]
    findings = r.get("diagnosis") or []
    out.append(f"DIAGNOSIS: {len(findings)} finding(s)" if findings else "DIAGNOSIS: no bottleneck found")
    for i, f in enumerate(findings, 1):
        out += [
            f"  {i}. [{f['id']}] {f['title']}",
            f"     evidence:  {f['evidence']}",
            f"     threshold: {f['threshold']}",
            f"     action:    {f['action']}",
        ]
    for note in r.get("not_evaluated") or []:
        out.append(f"  (not evaluated: {note})")
    st = r.get("step_time_s") or {}
    out += [
        "",
        "RUN",
        f"  runtime {_fmt(r.get('train_runtime'), ' s', 2)}, {r.get('train_steps')} steps, "
        f"world size {run.get('world_size')}, hosts {', '.join(run.get('hosts') or []) or 'n/a'}",
        f"  throughput: {_fmt(r.get('train_samples_per_second'), ' samples/s', 2)}, "
        f"{_fmt(r.get('train_steps_per_second'), ' steps/s', 3)}, {_fmt(r.get('train_tokens_per_second'), ' tokens/s', 1)}",
        f"  step time: mean {_fmt(st.get('mean'), ' s', 4)}, median {_fmt(st.get('median'), ' s', 4)}, "
        f"p90 {_fmt(st.get('p90'), ' s', 4)}, max {_fmt(st.get('max'), ' s', 4)}",
        f"  data loading {_pct(r.get('data_loading_time_ratio'))}, communication {_pct(r.get('communication_time_ratio'))}, "
        f"MFU {_pct(r.get('mfu'))}, {_fmt(r.get('tflops_per_gpu'), ' TFLOP/s per GPU', 1)}",
        "  phases (mean s/step): " + (", ".join(f"{k} {v:.4f}" for k, v in (r.get("phases_s") or {}).items()) or "n/a"),
        f"  memory: peak allocated {_fmt(r.get('gpu_peak_memory_allocated_gb'), ' GiB', 2)}, "
        f"reserved {_fmt(r.get('gpu_peak_memory_reserved_gb'), ' GiB', 2)}, allocator retries {r.get('alloc_retries')}",
        "",
        "GPUS",
        f"  util avg {_fmt(r.get('gpu_avg_utilization_percent'), '%', 1)} / max {_fmt(r.get('gpu_max_utilization_percent'), '%', 1)}, "
        f"SM active {_fmt(r.get('gpu_avg_sm_active_percent'), '%', 1)}, tensor active {_fmt(r.get('gpu_avg_tensor_active_percent'), '%', 1)}",
        f"  energy {_fmt(r.get('energy_kwh'), ' kWh', 4)} ({_fmt(r.get('energy_j_per_step'), ' J/step', 1)}), "
        f"throttled {_pct(r.get('throttle_time_ratio'))} of the time (worst GPU)",
    ]
    for g in r.get("per_gpu") or []:
        out.append(
            f"  {g['key']}: util {_fmt(g['avg_utilization_percent'], '%', 0)}, SM {_fmt(g['avg_sm_active_percent'], '%', 0)}, "
            f"mem {_fmt(g['avg_memory_used_percent'], '%', 0)}, power {_fmt(g['avg_power_w'], ' W', 0)}, "
            f"throttled {_pct(g['throttle_time_ratio'])}"
        )
    ranks = r.get("per_rank") or []
    if ranks:
        out += ["", "RANKS"]
        for x in ranks:
            out.append(
                f"  rank {x['rank']} ({x.get('host') or '?'}): {x['steps']} steps, median step {_fmt(x['median_step_time_s'], ' s', 4)}, "
                f"data loading {_pct(x['data_loading_time_ratio'])}, ×{_fmt(x.get('slowdown_vs_median'), '', 2)} vs median"
            )
    return "\n".join(out) + "\n"
