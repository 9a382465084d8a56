"""``docs/report.md``: what a run report holds, and the diagnosis rules and thresholds of
:mod:`gpulse.report.diagnose`, listed from its registry.

``make generate`` writes it; ``agent/tests/docs/`` fails when the file differs. Run as
``python -m gpulse.docs.report``.
"""

from __future__ import annotations

from gpulse.report.diagnose import RULES, THRESHOLDS

DOC_INTRO = """# Run report and diagnosis

`run.finish()` writes `metrics_report.json` into the run's output directory (in a distributed run,
rank 0 writes it for every rank: each rank hands its points over through the process group's
key-value store at `finish()`; a rank that cannot makes the report `partial`, with the reason), and
`gpulse report --run ID` builds the same report from InfluxDB (or `--from-file` a recording),
prints it (diagnosis first), writes `metrics_report.json` to `--out`, and with `--html` a
self-contained `metrics_report.html` (inline SVG plots; opens without a server).

```
gpulse report --run exp1 --url http://127.0.0.1:8086 --api v1 --bucket gpulse --html --out reports/
gpulse report --from-file out/gpulse-records.rec --threshold data_loading_ratio=0.25
```

A recording without a training run (`gpulse agent --record node.lp`) gives a **node report**
instead: `node_report.json` (and `node_report.html`) with each GPU's utilisation, memory, power,
energy and throttling, the GPU events (XID, ECC, lost), and the rules that need only GPU samples.

## Main fields

| field | meaning |
| --- | --- |
| `train_runtime` | run duration, s (from the run's start/end points, else the steps' span) |
| `train_samples_per_second`, `train_steps_per_second`, `train_tokens_per_second` | totals over all ranks / runtime |
| `phases_s` | the parts of a step, mean seconds per step over every rank's steps (see below) |
| `data_loading_time_ratio` | Σ data wait / Σ (data wait + step time), all ranks |
| `communication_time_ratio` | exposed communication: time steps wait for it after backward's compute, less waiting for slower ranks, / Σ step time (only where it is measured) |
| `communication_in_flight_ratio` | time any collective was in flight or waited for / Σ step time (DDP comm hook: `attach_ddp`) |
| `wait_for_slower_ranks_ratio` | time ranks waited at the collective for slower ranks (a straggler) / Σ step time |
| `partial`, `partial_reason` | the report lacks ranks of the run, and why (rank 0 gathers every rank's points at `finish()`) |
| `mfu`, `tflops_per_gpu` | step-time-weighted means of the per-step values (formula in `run.mfu_formula`) |
| `gpu_peak_memory_allocated_gb` | peak CUDA memory allocated by any rank, GiB (2^30 B) |
| `gpu_avg_utilization_percent`, `gpu_max_utilization_percent` | NVML util over the run's GPU samples |
| `gpu_avg_sm_active_percent`, `gpu_avg_tensor_active_percent` | GPM activity (Hopper+), where known |
| `energy_kwh`, `energy_j_per_step` | from the GPU energy counters (else power × time) |
| `throttle_time_ratio`, `throttle_time_s` | worst GPU: share / seconds of samples with clocks held back |
| `per_gpu`, `per_rank` | the spread: one entry per GPU and per rank (`slowdown_vs_median` per rank) |
| `gpu_events` | XID, ECC and GPU-lost events of the run's GPUs during the run |
| `hints` | what a distributed run did not measure, and the call that measures it |
| `host` | the host beside the run's GPUs, from the agent's `host` and `host_process` points: cores free, the training processes' and DataLoader workers' CPU and their shares on a CPU and blocked on disk (null without them); the `data_loading` finding names its case from it |
| `diagnosis` | findings: `id`, `title`, `evidence` (numbers), `threshold`, `action` |
| `not_evaluated` | checks skipped for lack of data (e.g. no GPU samples) |
| `profiles` | the profiler windows the findings raised while the run was going asked for (`gpulse.training.profiling`), from the run's `train_event` points of kind `profile`: `rule`, `evidence`, `rank`, `path` (the gzipped Chrome trace), `steps`, `summary` (`top_ops` by self time, `comm_ms` vs `compute_ms`, `dataloader_wait_ms`, `window_ms`), `pyspy` (null where `pyspy_path` holds the DataLoader workers' stacks or the rule asks for none; else `none: ` and why no dump was taken, or, where its file could not be written, `not saved to a file: ` and the dump itself, cut), `pyspy_path` (the dump's file beside the trace), `error`; the text and HTML reports show each |
| `live_findings` | `metrics_report.json` only: the findings the agent's rolling diagnosis raised while the run was going (`rule`, `state` raised/cleared, `first_step`, `last_step` it held, `evidence`, `action`, `time_ns`, `host`), as the agent told rank 0's process; empty without an agent |

## The parts of a step

One definition, in `gpulse.report.phases`, used by `phases_s`, the text report, the HTML "Step time
by part" chart and the Training run dashboard's "Step time by phase" panel. A step, as the bars show
it, is the wait for its batch followed by the step itself (`step_time_s`, from the batch in hand to
the step's end). Its parts:

| part | from | |
| --- | --- | --- |
| `data_wait` | `data_wait_s` | before the step: the training loop blocked on the next batch |
| `forward` | `forward_s` | |
| `backward` | `backward_s` − `comm_s` | backward's compute: the backward phase ends when `backward()` returns, after DDP's (or FSDP's) wait for the gradient collectives, so the recorded phase holds that wait |
| `comm` | `comm_s` | exposed communication: the wait after backward's compute; on a rank that reached the collective first it includes waiting for slower ranks |
| `optimizer` | `optimizer_s` | |
| custom | `phase_<name>_s` | each custom phase by its name |
| `other` | `step_time_s` − the named parts inside the step | what no phase covers (framework work between the phases, logging, ...) |

A part a run does not measure is absent (0 in the sums); without a timed backward phase `comm` is a
part of its own. The parts inside the step add up to `step_time_s`: when the named parts exceed it
(overlapping phases, or a wait measured outside the backward phase) the phases were measured
wrongly, `other` is 0 and `hints` says by how much. The summary's "communication waited for" is
`comm`'s share of the step, the mean of what the bars show; it splits into
`communication_time_ratio` (the communication itself) and `wait_for_slower_ranks_ratio`.

A GPU is a run's only when one of its ranks uses it: the `gpu` points tagged `run=<id>` (the agent
tags the GPUs a run registered), else, over the run's time window, the GPUs its ranks report
(`train_run.gpus`) and those NVML lists one of its processes on (`gpu_process.pid` equal to a
rank's `train_run.pid`, same host; PIDs as the host sees them, so a rank in a container is found by
the devices it reports). A CPU-only run is credited no GPU, whatever the agent beside it samples:
its GPU figures are empty, as in the `metrics_report.json` the training process writes.
`gpu_events` lists the XID, ECC and GPU-lost events of the run's GPUs during the run; the
`gpu_errors` finding names them, and a finding about a GPU that logged one says so.
Findings name a GPU as the tables do, with the start of its uuid: `GPU 3 (GPU-1d0b…)`, the worst
first, the others by name only (every one is in the finding's `data`).

The HTML report plots every GPU and every rank: up to 16 as one line each, more as a heat strip
(one row per GPU or rank, colour = value) with the median and the 10th-90th percentile band.
Throughput is what the user got: tokens (or samples) per second of wall time, data waits included.

## Diagnosis thresholds

Override any of them with `--threshold name=value` (repeatable) or `build_report(..., thresholds={...})`.

| name | default | unit | meaning |
| --- | --- | --- | --- |
"""


def render_markdown() -> str:
    """``docs/report.md``: the intro, then the thresholds and the rules, each in registry order."""
    rows = [f"| `{t.name}` | {t.default:g} | {t.unit} | {t.doc} |" for t in THRESHOLDS.values()]
    rules = [
        f"| `{r.id}` | {r.title} | {', '.join(f'`{t}`' for t in r.thresholds)} | "
        f"{'run and node' if r.gpus_only else 'run'} | {r.action} |"
        for r in RULES.values()
    ]
    head = [
        "",
        "## Rules",
        "",
        "Each finding comes from one rule (`gpulse.report.diagnose`), listed in this order.",
        "",
        "| id | finding | thresholds | reports | action |",
        "| --- | --- | --- | --- | --- |",
    ]
    return DOC_INTRO + "\n".join(rows + head + rules) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
