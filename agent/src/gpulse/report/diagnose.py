"""The diagnosis: findings from a run report, each with its evidence, threshold and a concrete action.

Stdlib only (``Run.finish()`` runs it inside training). Every threshold lives in :data:`THRESHOLDS`
— the single table ``docs/report.md`` is rendered from (``python -m gpulse.report.diagnose``) and
``gpulse report --threshold name=value`` / ``build_report(thresholds=...)`` override.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpulse.influx.connection import ConfigError


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    unit: str
    doc: str


THRESHOLDS: dict[str, Threshold] = {
    t.name: t
    for t in (
        Threshold(
            "data_loading_ratio",
            0.15,
            "ratio",
            "data_loading_time_ratio above this: the input pipeline starves the GPU",
        ),
        Threshold("communication_ratio", 0.05, "ratio", "communication_time_ratio above this: exposed communication"),
        Threshold("starved_util_pct", 30.0, "%", "GPU busy (NVML util) below this ..."),
        Threshold(
            "starved_memory_pct", 80.0, "%", "... while its memory is fuller than this: a loaded GPU waiting for work"
        ),
        Threshold("launch_bound_util_pct", 80.0, "%", "NVML util at least this ..."),
        Threshold(
            "launch_bound_sm_active_pct",
            40.0,
            "%",
            "... while SM activity (GPM) is below this: busy but mostly idle SMs",
        ),
        Threshold(
            "imbalance_factor",
            1.5,
            "×",
            "a rank (compute time) or GPU (busy time) this many times worse than the median",
        ),
        Threshold(
            "imbalance_min_util_pct", 10.0, "%", "GPU imbalance is judged only when the median GPU is busier than this"
        ),
        Threshold(
            "throttle_ratio", 0.10, "ratio", "fraction of samples with clocks held back (power/thermal/hardware)"
        ),
        Threshold(
            "fragmentation_memory_pct",
            90.0,
            "%",
            "peak reserved (else allocated) memory at least this share of capacity ...",
        ),
        Threshold("fragmentation_retries", 1.0, "count", "... with at least this many caching-allocator retries"),
    )
}


def resolve_thresholds(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """The defaults with ``overrides`` applied; an unknown name is a :class:`ConfigError`."""
    out = {name: t.default for name, t in THRESHOLDS.items()}
    for name, value in (overrides or {}).items():
        if name not in THRESHOLDS:
            raise ConfigError(f"unknown threshold {name!r}; known: {', '.join(THRESHOLDS)}")
        out[name] = float(value)
    return out


def parse_threshold_args(items: list[str] | None) -> dict[str, float]:
    """``["name=value", ...]`` from ``--threshold`` into a dict, with clear errors."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--threshold takes name=value, not {item!r}")
        try:
            out[name.strip()] = float(raw)
        except ValueError:
            raise ConfigError(f"--threshold {name}: {raw!r} is not a number") from None
    resolve_thresholds(out)
    return out


def _finding(fid: str, title: str, evidence: str, threshold: str, action: str, **data: Any) -> dict[str, Any]:
    return {"id": fid, "title": title, "evidence": evidence, "threshold": threshold, "action": action, "data": data}


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def diagnose(r: Mapping[str, Any], t: Mapping[str, float]) -> tuple[list[dict[str, Any]], list[str]]:
    """(findings, checks that could not be evaluated for lack of data)."""
    found: list[dict[str, Any]] = []
    skipped: list[str] = []
    gpus = r.get("per_gpu") or []
    ranks = r.get("per_rank") or []

    dl = r.get("data_loading_time_ratio")
    if dl is None:
        skipped.append("data_loading: no data_wait_s in the steps")
    elif dl > t["data_loading_ratio"]:
        ph = r.get("phases_s") or {}
        found.append(
            _finding(
                "data_loading",
                "Input pipeline bottleneck: training waits for data",
                f"{_pct(dl)} of step time is spent waiting for the next batch "
                f"(mean wait {ph.get('data_wait', 0):.4f} s per step vs {r['step_time_s']['mean'] or 0:.4f} s of compute).",
                f"data_loading_time_ratio > {t['data_loading_ratio']}",
                "Raise DataLoader num_workers (e.g. to the CPU cores per GPU), set persistent_workers=True and "
                "prefetch_factor=4, pin_memory=True; move decoding/tokenization/augmentation out of __getitem__ "
                "(pre-tokenize, cache) or onto the GPU.",
                ratio=dl,
            )
        )

    cr = r.get("communication_time_ratio")
    if cr is None:
        skipped.append("communication: no comm_s in the steps")
    elif cr > t["communication_ratio"]:
        found.append(
            _finding(
                "communication",
                "Exposed communication time",
                f"{_pct(cr)} of step time is communication that does not overlap with compute.",
                f"communication_time_ratio > {t['communication_ratio']}",
                "Overlap gradients with backward (DDP bucket_cap_mb 50-100, gradient_as_bucket_view=True, "
                "static_graph=True); use gradient accumulation with no_sync(); check NCCL picks NVLink/IB "
                "(NCCL_DEBUG=INFO, no NCCL_P2P_DISABLE/NCCL_IB_DISABLE); consider FSDP/ZeRO sharding settings.",
                ratio=cr,
            )
        )

    if not gpus:
        skipped.append("GPU checks (starved, launch-bound, GPU imbalance, throttling): no GPU samples for this run")
    else:
        starved = [
            g
            for g in gpus
            if g["avg_utilization_percent"] is not None
            and g["avg_memory_used_percent"] is not None
            and g["avg_utilization_percent"] < t["starved_util_pct"]
            and g["avg_memory_used_percent"] > t["starved_memory_pct"]
        ]
        if starved:
            found.append(
                _finding(
                    "gpu_starved",
                    "GPUs hold their memory but sit idle",
                    "; ".join(
                        f"{g['key']}: busy {g['avg_utilization_percent']:.0f}%, memory {g['avg_memory_used_percent']:.0f}% full"
                        for g in starved
                    ),
                    f"util < {t['starved_util_pct']:g}% while memory > {t['starved_memory_pct']:g}%",
                    "The GPU waits on something else: the input pipeline (see data loading), host-side work "
                    "between steps (logging, .item(), checkpointing), or other ranks. Profile one step with "
                    "torch.profiler to see the gaps.",
                    gpus=[g["key"] for g in starved],
                )
            )
        with_sm = [
            g for g in gpus if g["avg_sm_active_percent"] is not None and g["avg_utilization_percent"] is not None
        ]
        if not with_sm:
            skipped.append("launch_bound: no SM activity (GPM needs Hopper or later)")
        launch = [
            g
            for g in with_sm
            if g["avg_utilization_percent"] >= t["launch_bound_util_pct"]
            and g["avg_sm_active_percent"] < t["launch_bound_sm_active_pct"]
        ]
        if launch:
            found.append(
                _finding(
                    "launch_bound",
                    "GPU looks busy but its SMs are mostly idle",
                    "; ".join(
                        f"{g['key']}: NVML util {g['avg_utilization_percent']:.0f}% but SM active {g['avg_sm_active_percent']:.0f}%"
                        for g in launch
                    ),
                    f"util >= {t['launch_bound_util_pct']:g}% and SM active < {t['launch_bound_sm_active_pct']:g}%",
                    "Kernels are too small to fill the GPU (launch-bound): increase the micro-batch size, use "
                    "torch.compile or CUDA graphs to cut launch overhead, use fused attention "
                    "(attn_implementation='sdpa' or 'flash_attention_2') and fused optimizers (fused=True).",
                    gpus=[g["key"] for g in launch],
                )
            )
        busy = [g for g in gpus if g["avg_utilization_percent"] is not None]
        if len(busy) >= 2:
            med = statistics.median_high([g["avg_utilization_percent"] for g in busy])
            idle = [
                g
                for g in busy
                if med >= t["imbalance_min_util_pct"] and g["avg_utilization_percent"] * t["imbalance_factor"] < med
            ]
            if idle:
                found.append(
                    _finding(
                        "gpu_imbalance",
                        "Some GPUs work much less than the others",
                        "; ".join(
                            f"{g['key']}: busy {g['avg_utilization_percent']:.0f}% vs median {med:.0f}%" for g in idle
                        ),
                        f"GPU busy × {t['imbalance_factor']:g} < median GPU busy",
                        "Work is unevenly split: with device_map='auto' (naive pipeline) GPUs take turns — use "
                        "DDP/FSDP instead, or balance the layer split (max_memory per GPU); otherwise check that "
                        "every GPU got a rank and equal batch sizes.",
                        gpus=[g["key"] for g in idle],
                        median_util=med,
                    )
                )
        hot = [
            g for g in gpus if g["throttle_time_ratio"] is not None and g["throttle_time_ratio"] > t["throttle_ratio"]
        ]
        if hot:
            found.append(
                _finding(
                    "throttling",
                    "GPU clocks held back (power or thermal)",
                    "; ".join(
                        f"{g['key']}: throttled {_pct(g['throttle_time_ratio'])} of the time"
                        + (
                            f" ({', '.join(f'{k} {_pct(v)}' for k, v in g['throttle_reasons'].items())})"
                            if g["throttle_reasons"]
                            else ""
                        )
                        for g in hot
                    ),
                    f"throttled > {_pct(t['throttle_ratio'])} of samples",
                    "Check cooling and airflow (temp_gpu_c, fans), the power limit (nvidia-smi -q -d POWER; "
                    "power cap vs TDP), and rack power; hardware slowdown or power brake needs the vendor.",
                    gpus=[g["key"] for g in hot],
                )
            )

    timed = [x for x in ranks if x.get("slowdown_vs_median")]
    if len(timed) >= 2:
        slow = [x for x in timed if x["slowdown_vs_median"] > t["imbalance_factor"]]
        if slow:
            found.append(
                _finding(
                    "rank_imbalance",
                    "A straggler rank slows every step",
                    "; ".join(
                        f"rank {x['rank']} ({x.get('host') or '?'}{', ' + ','.join(x['gpus']) if x.get('gpus') else ''}): "
                        f"median compute {x['median_compute_time_s']:.4f} s = {x['slowdown_vs_median']:.2f}× the median rank"
                        for x in slow
                    ),
                    f"rank compute time > {t['imbalance_factor']:g}× median",
                    "Compare that rank's GPU (throttling, a slower model, PCIe link) and host (CPU contention, its "
                    "data loader); check uneven sequence lengths (bucket by length) or an uneven device_map split.",
                    ranks=[x["rank"] for x in slow],
                )
            )

    retries = int(r.get("alloc_retries") or 0)
    peak = r.get("gpu_peak_memory_reserved_gb") or r.get("gpu_peak_memory_allocated_gb")
    cap = r.get("gpu_memory_capacity_gb")
    if retries >= t["fragmentation_retries"] and (
        cap is None or (peak or 0) >= cap * t["fragmentation_memory_pct"] / 100
    ):
        near = f"peak {peak:.2f} GiB of {cap:.2f} GiB; " if peak and cap else ""
        found.append(
            _finding(
                "fragmentation",
                "Memory at capacity: the allocator flushes its cache and retries",
                f"{near}{retries} caching-allocator retries (each one frees cached blocks and synchronizes).",
                f"alloc_retries >= {t['fragmentation_retries']:g} and peak >= {t['fragmentation_memory_pct']:g}% of capacity",
                "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; lower the micro-batch or sequence length "
                "and use gradient accumulation; enable activation checkpointing; avoid varying tensor shapes "
                "(pad to buckets).",
                retries=retries,
                peak_gb=peak,
                capacity_gb=cap,
            )
        )
    return found, skipped


DOC_INTRO = """# Run report and diagnosis

`run.finish()` writes `metrics_report.json` into the run's output directory, and
`gpulse report --run ID` builds the same report from InfluxDB (or `--from-file` a recording),
prints it (diagnosis first), writes `metrics_report.json` to `--out`, and with `--html` a
self-contained `metrics_report.html` (inline SVG plots; opens without a server).

```
gpulse report --run exp1 --url http://127.0.0.1:8086 --api v1 --bucket gpulse --html --out reports/
gpulse report --from-file out/gpulse-records.lp --threshold data_loading_ratio=0.25
```

## Main fields

| field | meaning |
| --- | --- |
| `train_runtime` | run duration, s (from the run's start/end points, else the steps' span) |
| `train_samples_per_second`, `train_steps_per_second`, `train_tokens_per_second` | totals over all ranks / runtime |
| `data_loading_time_ratio` | Σ data wait / Σ (data wait + step time), all ranks |
| `communication_time_ratio` | Σ comm / Σ step time (only where comm time is measured) |
| `mfu`, `tflops_per_gpu` | step-time-weighted means of the per-step values (formula in `run.mfu_formula`) |
| `gpu_peak_memory_allocated_gb` | peak CUDA memory allocated by any rank, GiB (2^30 B) |
| `gpu_avg_utilization_percent`, `gpu_max_utilization_percent` | NVML util over the run's GPU samples |
| `gpu_avg_sm_active_percent`, `gpu_avg_tensor_active_percent` | GPM activity (Hopper+), where known |
| `energy_kwh`, `energy_j_per_step` | from the GPU energy counters (else power × time) |
| `throttle_time_ratio`, `throttle_time_s` | worst GPU: share / seconds of samples with clocks held back |
| `per_gpu`, `per_rank` | the spread: one entry per GPU and per rank (`slowdown_vs_median` per rank) |
| `diagnosis` | findings: `id`, `title`, `evidence` (numbers), `threshold`, `action` |
| `not_evaluated` | checks skipped for lack of data (e.g. no GPU samples) |

GPU samples of a run are the `gpu` points tagged `run=<id>` (the agent tags the GPUs a run
registered), else the GPUs of the run's hosts during the run's time window.

## Diagnosis thresholds

Override any of them with `--threshold name=value` (repeatable) or `build_report(..., thresholds={...})`.

| name | default | unit | meaning |
| --- | --- | --- | --- |
"""


def render_markdown() -> str:
    """``docs/report.md``, from :data:`THRESHOLDS` (a test keeps the file equal to this)."""
    rows = [f"| `{t.name}` | {t.default:g} | {t.unit} | {t.doc} |" for t in THRESHOLDS.values()]
    return DOC_INTRO + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
