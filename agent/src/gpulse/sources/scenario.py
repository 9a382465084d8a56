"""The demo scenario: a simulated 8-GPU node and an 8-rank training run over the last few hours.

``gpulse demo`` writes what the agent and the training library would have written, so every
dashboard, the downsampled History and the run report have something true-to-life to show:

* the GPUs come from the agent's own simulated source (:class:`gpulse.sources.simulated.SimulatedSource`),
  driven by the same :class:`Timeline` as the run, so GPU activity and step metrics tell one story;
* the run is a synchronous data-parallel job (one rank per GPU) whose steps are generated here with
  the schema's field names: a healthy phase, a data-loading bottleneck (GPUs starved, ``data_wait_s``
  up), a thermal-throttling episode (clocks down, every rank slower), one straggling GPU (its rank's
  compute 1.7x the others, the others wait in the all-reduce), checkpoints, an evaluation, and an XID
  event;
* the agent's own health points (``agent``) come at the agent's 10 s cadence.

Everything is a pure function of (seed, end time), so a test can regenerate and compare.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from dataclasses import dataclass, field

from gpulse.lineprotocol.encode import Encoder
from gpulse.schema import NVML_ERROR_KINDS

NS = 1_000_000_000
DEMO_HOST = "gpulse-demo"
DEMO_MODEL = "H100"
#: A Llama-3-8B-shaped model: parameters, layers, heads, head dim, sequence length.
MODEL_PARAMS = 8.03e9
LAYERS, HEADS, HEAD_DIM, SEQ_LEN = 32, 32, 128, 4096
#: Training FLOPs per token: 6N + 12·L·H·Q·T (the attention term), the formula train_run names.
FLOPS_PER_TOKEN = 6 * MODEL_PARAMS + 12 * LAYERS * HEADS * HEAD_DIM * SEQ_LEN
MFU_FORMULA = "6N+12LHQT per token (N=8.03e9, L=32, H=32, Q=128, T=4096)"
#: H100 SXM dense BF16 peak, the figure the training library uses for MFU.
PEAK_FLOPS = 989e12
MICRO_BATCH, GRAD_ACCUM = 4, 2
SAMPLES_PER_STEP = MICRO_BATCH * GRAD_ACCUM  # per rank
TOKENS_PER_STEP = SAMPLES_PER_STEP * SEQ_LEN  # per rank
GIB = 1 << 30

# Compute per step on a healthy GPU, split like a dense transformer step.
COMPUTE_S = 5.4
SPLIT = {"forward_s": 0.31, "backward_s": 0.61, "optimizer_s": 0.08}
COMM_S = 0.35  # the all-reduce that does not overlap with backward
OTHER_S = 0.04  # host work between the timed phases (the loop's own bookkeeping, logging)
DATA_WAIT_S = 0.05  # healthy: the loader keeps up
STARVED_DATA_WAIT_S = 8.0  # bottleneck: the loader cannot keep up
#: How much longer a rank's compute takes while an episode holds its GPU back.
SLOWDOWN = {"throttled": 1.35, "straggler": 1.7}
CHECKPOINT_S = 40.0  # time to write a checkpoint (between steps)
XID = (31, "GPU memory page fault (XID 31): an illegal address was accessed by the application")
NVLINK_EVERY_NS = 60 * NS
#: When episodes overlap, the GPU shows the first of these.
PRECEDENCE = ("starved", "throttled", "straggler")


@dataclass(frozen=True)
class Episode:
    """A stretch of the run where something goes wrong on some GPUs."""

    name: str  # the GPU phase during the episode: starved, throttled, straggler
    start_ns: int
    end_ns: int
    gpus: tuple[int, ...]
    what: str  # one line for the demo's output

    def covers(self, t_ns: int, gpu: int) -> bool:
        return self.start_ns <= t_ns < self.end_ns and gpu in self.gpus


@dataclass(frozen=True)
class Timeline:
    """When the run ran and what happened to which GPU; ``phase(t, gpu)`` drives the simulated source."""

    start_ns: int  # the demo window
    end_ns: int
    run_start_ns: int
    run_end_ns: int
    gpus: int
    episodes: tuple[Episode, ...]
    checkpoints_ns: tuple[int, ...]
    evals_ns: tuple[int, ...]
    xid_ns: int
    xid_gpu: int

    @classmethod
    def build(cls, end_ns: int, hours: float = 3.0, gpus: int = 8) -> Timeline:
        """The standard story, laid out as fractions of the run so any window length works.

        The episodes are long enough to cross the report's run-wide thresholds: the bottleneck takes
        ~30% of the run (data-loading ratio > 0.15), the straggler more than half of the steps (its
        median compute > 1.5x), the throttling > 10% of the GPU samples."""
        if gpus < 2:
            raise ValueError("the demo needs at least 2 GPUs (one of them straggles)")
        start = end_ns - int(hours * 3600 * NS)
        run_start = start + int(0.04 * (end_ns - start))
        run_end = end_ns - int(0.01 * (end_ns - start))
        span = run_end - run_start

        def at(frac: float) -> int:
            return run_start + int(frac * span)

        straggler = min(3, gpus - 1)
        everyone = tuple(range(gpus))
        episodes = (
            Episode("starved", at(0.10), at(0.40), everyone, "data-loading bottleneck: the loader cannot keep up"),
            Episode("straggler", at(0.42), run_end, (straggler,), f"GPU {straggler} power-capped: its rank straggles"),
            Episode("throttled", at(0.56), at(0.72), everyone, "thermal throttling: clocks held back by temperature"),
        )
        return cls(
            start_ns=start,
            end_ns=end_ns,
            run_start_ns=run_start,
            run_end_ns=run_end,
            gpus=gpus,
            episodes=episodes,
            checkpoints_ns=(at(0.08), at(0.5), at(0.75)),
            evals_ns=(at(0.45), at(0.9)),
            xid_ns=at(0.82),
            xid_gpu=min(6, gpus - 1),
        )

    def in_run(self, t_ns: int) -> bool:
        return self.run_start_ns <= t_ns < self.run_end_ns

    def phase(self, t_ns: int, gpu: int) -> str:
        """The GPU's phase at ``t_ns``: idle outside the run, else the first episode that applies, else busy."""
        if not self.in_run(t_ns):
            return "idle"
        active = {e.name for e in self.episodes if e.covers(t_ns, gpu)}
        return next((p for p in PRECEDENCE if p in active), "busy")

    def slowdown(self, t_ns: int, gpu: int) -> float:
        """How much longer the GPU's share of a step takes at ``t_ns`` (episodes multiply)."""
        f = 1.0
        for e in self.episodes:
            if e.name in SLOWDOWN and e.covers(t_ns, gpu):
                f *= SLOWDOWN[e.name]
        return f

    def starved(self, t_ns: int) -> bool:
        return any(e.name == "starved" and e.start_ns <= t_ns < e.end_ns for e in self.episodes)


@dataclass
class RunSummary:
    run: str
    ranks: int
    steps: int
    points: int
    lines: list[str] = field(default_factory=list, repr=False)


def run_id_for(end_ns: int) -> str:
    """A run id that names the demo and its end time (minute resolution), so re-runs do not merge."""
    import time

    return "demo-" + time.strftime("%Y%m%d-%H%M", time.gmtime(end_ns / NS))


def training_lines(
    tl: Timeline,
    run: str,
    uuids: list[str],
    *,
    host: str = DEMO_HOST,
    seed: int = 0,
    encoder: Encoder | None = None,
) -> RunSummary:
    """``train_run``/``train_step``/``train_event`` lines of a synchronous data-parallel run, one rank per GPU.

    A step's wall time is the slowest rank's compute plus the data wait and the all-reduce; faster
    ranks spend the difference waiting in the all-reduce (``comm_s``), as in DDP. A rank's step is
    forward + backward's compute + ``comm_s`` + optimizer + other, the parts of ``gpulse.report.phases``.
    """
    enc = encoder or Encoder()
    rng = random.Random(f"{seed}-train")
    world = tl.gpus
    user_tags = {"model": "llama3-8b"}
    series = [
        {
            m: enc.series(
                m,
                {
                    "host": host,
                    "run": run,
                    "rank": str(r),
                    "local_rank": str(r),
                    "world_size": str(world),
                    **user_tags,
                },
            )
            for m in ("train_step", "train_run", "train_event")
        }
        for r in range(world)
    ]
    lines: list[str] = []
    points = 0

    def emit(rank: int, measurement: str, fields: dict, ts: int) -> None:
        nonlocal points
        line = enc.line(series[rank][measurement], fields, ts)
        if line is not None:
            lines.append(line)
            points += 1

    config = json.dumps(
        {
            "model": "llama3-8b",
            "micro_batch": MICRO_BATCH,
            "grad_accum": GRAD_ACCUM,
            "seq_len": SEQ_LEN,
            "dtype": "bf16",
            "optimizer": "adamw",
            "lr": 3e-4,
        },
        separators=(",", ":"),
    )
    for r in range(world):
        emit(
            r,
            "train_run",
            {
                "event": "start",
                "status": "running",
                "name": "llama3-8b-sft (gpulse demo)",
                "config": config,
                "gpus": uuids[r],
                "mfu_formula": MFU_FORMULA,
                "peak_flops": PEAK_FLOPS,
                "flops_per_token": FLOPS_PER_TOKEN,
                "pid": 4100 + r,
            },
            tl.run_start_ns,
        )

    t = tl.run_start_ns
    step = 0
    retries = [0] * world
    pending_ckpt = list(tl.checkpoints_ns)
    pending_eval = list(tl.evals_ns)
    max_steps_guess = (tl.run_end_ns - tl.run_start_ns) / NS / (COMPUTE_S * 1.5 + COMM_S)
    step_ends: list[int] = []
    while True:
        data_wait = (STARVED_DATA_WAIT_S if tl.starved(t) else DATA_WAIT_S) * rng.uniform(0.85, 1.15)
        begin = t + int(data_wait * NS)
        compute = [COMPUTE_S * tl.slowdown(begin, r) * rng.uniform(0.98, 1.02) for r in range(world)]
        # the step itself (after the batch arrived): the slowest rank's compute plus the all-reduce,
        # and the loop's own work around the phases
        other = OTHER_S * rng.uniform(0.9, 1.1)
        step_time = max(compute) + COMM_S * rng.uniform(0.95, 1.05) + other
        end = begin + int(step_time * NS)
        if end >= tl.run_end_ns:
            break
        step += 1
        step_ends.append(end)
        progress = step / max(max_steps_guess, 1.0)
        loss = 1.55 + 1.4 * math.exp(-3.5 * progress) + rng.gauss(0, 0.03)
        lr = 3e-4 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        for r in range(world):
            comm = step_time - other - compute[r]  # faster ranks wait for the slowest in the all-reduce
            tflops = TOKENS_PER_STEP * FLOPS_PER_TOKEN / step_time / 1e12
            peak_mem = (61.5 + rng.uniform(-0.4, 0.4)) * GIB
            fields: dict[str, object] = {
                "step": step,
                "start_time_ns": begin,
                "end_time_ns": end,
                "step_time_s": step_time,
                "data_wait_s": data_wait,
                "comm_s": comm,
                "samples": SAMPLES_PER_STEP,
                "tokens": TOKENS_PER_STEP,
                "samples_per_s": SAMPLES_PER_STEP / step_time,
                "tokens_per_s": TOKENS_PER_STEP / step_time,
                "tflops": tflops,
                "mfu": tflops * 1e12 / PEAK_FLOPS,
                "mem_allocated_bytes": int((52.0 + rng.uniform(-0.2, 0.2)) * GIB),
                "mem_reserved_bytes": int(68 * GIB),
                "mem_peak_bytes": int(peak_mem),
                "alloc_retries": retries[r],
                "log_loss": loss + rng.gauss(0, 0.01),
                "log_lr": lr,
                "log_grad_norm": 0.9 + 0.3 * rng.random(),
            }
            for name, share in SPLIT.items():
                fields[name] = compute[r] * share
                fields[name.replace("_s", "_gpu_s")] = compute[r] * share * 0.97
            # as the training library records it: the backward phase ends when backward() returns,
            # after DDP's wait for the all-reduce (gpulse.training.comm), so it holds comm_s too
            fields["backward_s"] = compute[r] * SPLIT["backward_s"] + comm
            emit(r, "train_step", fields, end)
        t = end
        if pending_eval and t >= pending_eval[0]:
            pending_eval.pop(0)
            emit(0, "train_event", {"kind": "eval", "text": f"eval loss {loss + 0.05:.3f}", "step": step}, t)
        if pending_ckpt and t >= pending_ckpt[0]:
            pending_ckpt.pop(0)
            emit(0, "train_event", {"kind": "checkpoint", "text": f"saved checkpoint-{step}", "step": step}, t)
            t += int(CHECKPOINT_S * NS)
    for r in range(world):
        emit(
            r,
            "train_run",
            {
                "event": "end",
                "status": "finished",
                "name": "llama3-8b-sft (gpulse demo)",
                "steps": step,
                "duration_s": (t - tl.run_start_ns) / NS,
                "gpus": uuids[r],
                "pid": 4100 + r,
            },
            t,
        )
    found = finding_lines(tl, run, host, step_ends, enc)
    lines += found
    points += len(found)
    return RunSummary(run=run, ranks=world, steps=step, points=points, lines=lines)


#: The rule the agent's rolling diagnosis raises for an episode, and its evidence in the demo.
FINDINGS = {
    "starved": (
        "data_loading",
        "Data loading is the bottleneck",
        "ranks waited for data in most of the window's steps",
    ),
    "straggler": (
        "rank_imbalance",
        "One rank is slower than the others",
        "one rank's steps take longer than the median",
    ),
}
#: How long a rule must hold (and then stop holding) before the agent raises (clears) it: one window.
FINDING_WINDOW_S = 120


def finding_lines(tl: Timeline, run: str, host: str, step_ends: list[int], enc: Encoder) -> list[str]:
    """``train_finding`` lines as the agent's rolling diagnosis (``gpulse.report.live``) writes them
    for the demo's episodes: raised a window after an episode starts, cleared a window after it ends
    (or ended with the run)."""
    out: list[str] = []
    if not step_ends:
        return out

    def step_at(t: int) -> int:
        return max(1, bisect.bisect_right(step_ends, t))

    window = FINDING_WINDOW_S * NS
    for e in tl.episodes:
        if e.name not in FINDINGS:
            continue
        rule, title, evidence = FINDINGS[e.name]
        series = enc.series("train_finding", {"host": host, "run": run, "rule": rule})
        raised = e.start_ns + window
        if raised >= step_ends[-1]:
            continue
        first = step_at(e.start_ns)
        common = {"title": title, "evidence": evidence, "action": "", "threshold": "", "first_step": first}
        out.append(enc.line(series, {**common, "state": "raised", "open": 1, "last_step": step_at(raised)}, raised))
        cleared = e.end_ns + window
        state = "cleared" if cleared < step_ends[-1] else "ended"
        end = cleared if state == "cleared" else step_ends[-1]
        out.append(enc.line(series, {**common, "state": state, "open": 0, "last_step": step_at(e.end_ns)}, end))
    return [line for line in out if line]


def gpu_lines(
    tl: Timeline,
    run: str,
    *,
    host: str = DEMO_HOST,
    model: str = DEMO_MODEL,
    seed: int = 0,
    interval_s: float = 10.0,
    encoder: Encoder | None = None,
) -> tuple[list[str], list[str]]:
    """The node's GPU points over the window at ``interval_s``; returns (lines, uuids).

    Samples taken while the run ran carry the ``run`` tag, as the agent tags a registered run's GPUs.
    """
    from gpulse.sources.simulated import SimulatedSource

    enc = encoder or Encoder()
    src = SimulatedSource(tl.gpus, model=model, seed=seed, scenario=tl.phase)
    idents = src.open()
    uuids = [g.uuid for g in idents]
    by_index = {g.index: g for g in idents}
    src.inject_event(tl.xid_gpu, tl.xid_ns, "xid", xid=XID[0], text=XID[1])
    lines: list[str] = []
    step = int(interval_s * NS)
    t = tl.start_ns - tl.start_ns % step + step
    try:
        while t <= tl.end_ns:
            tags_run = run if tl.in_run(t) else None
            for reading in src.collect(t):
                if reading.measurement == "gpu_nvlink" and t % NVLINK_EVERY_NS:
                    continue  # per-link counters once a minute: 18 links x 8 GPUs adds up fast
                g = by_index[reading.gpu]
                tags = {"host": host, "gpu": str(g.index), "uuid": g.uuid, "model": g.model}
                if reading.tags:
                    tags.update(reading.tags)
                if tags_run and reading.measurement in ("gpu", "gpu_process"):
                    tags["run"] = tags_run
                line = enc.line(enc.series(reading.measurement, tags), reading.fields, reading.ts_ns)
                if line is not None:
                    lines.append(line)
            t += step
    finally:
        src.close()
    return lines, uuids


def agent_lines(
    tl: Timeline,
    gpu_line_count: int,
    train_line_count: int,
    *,
    host: str = DEMO_HOST,
    gpus: int = 8,
    seed: int = 0,
    encoder: Encoder | None = None,
) -> list[str]:
    """The agent's own health every 10 s: counters that add up to what the demo wrote.

    A short database outage in the middle shows the spool filling and draining on the Agent health
    dashboard, as the real agent's delivery does when InfluxDB restarts.
    """
    enc = encoder or Encoder()
    rng = random.Random(f"{seed}-agent")
    s = enc.series("agent", {"host": host})
    every = 10 * NS
    n = max(1, (tl.end_ns - tl.start_ns) // every)
    per_tick = (gpu_line_count + train_line_count) / n
    outage = (tl.start_ns + int(0.55 * (tl.end_ns - tl.start_ns)), tl.start_ns + int(0.57 * (tl.end_ns - tl.start_ns)))
    lines: list[str] = []
    written = spooled = replayed = 0.0
    spool = 0.0
    t = tl.start_ns - tl.start_ns % every + every
    k = 0
    last_write = t
    while t <= tl.end_ns:
        k += 1
        down = outage[0] <= t < outage[1]
        if down:
            spooled += per_tick
            spool += per_tick * 420
        else:
            written += per_tick
            if spool > 0:
                drained = min(spool, per_tick * 420 * 6)
                spool -= drained
                replayed += drained / 420
                written += drained / 420
            last_write = t
        fields = {
            "samples": k * 10,
            "cycles_skipped": 0,
            "cycle_ms": 2.1 + rng.random() * 0.8,
            "gpus": gpus,
            "gpus_lost": 0,
            "lines_written": int(written),
            "lines_spooled": int(spooled),
            "lines_replayed": int(replayed),
            "lines_dropped": 0,
            "lines_rejected": 0,
            "values_dropped_nonfinite": 0,
            "spool_bytes": int(spool),
            "buffer_lines": int(rng.uniform(0, 40)),
            "write_latency_ms": 4.0 + rng.random() * 6.0,
            "last_write_age_s": (t - last_write) / NS + rng.random(),
            "records_received": int(train_line_count * min(1.0, k / n)),
            "records_rejected": 0,
            "runs_registered": 1 if tl.in_run(t) else 0,
            "live_runs_evicted": 0,
            "host_processes_skipped": 0,
            "training_processes_evicted": 0,
            "uptime_s": k * 10.0,
        }
        for kind in NVML_ERROR_KINDS:
            fields[f"nvml_errors_{kind}"] = 0
        if t >= tl.xid_ns:  # the faulting GPU answered a few calls late around its XID
            fields["nvml_errors_timeout"] = 3
        line = enc.line(s, fields, t)
        if line is not None:
            lines.append(line)
        t += every
    return lines
