"""Multi-rank scenarios on CPU (gloo, two processes) with the ground truth measured around the loop.

Each scenario trains with gpulse, measures the truth with its own clocks, and reads what gpulse
said twice: rank 0's ``metrics_report.json`` and the merged report (``gpulse report --from-file``
over every rank's recording). The tests (``training/test_training_ranks.py``) assert on the
result; as a script it prints it, with any gpulse version, to compare before and after::

    python agent/tests/ranks_truth.py ddp-heavy-overlap            # one scenario, JSON
    python agent/tests/ranks_truth.py all --table                  # every scenario, a table

Truths:

* exposed communication = step time with gradient sync − step time under ``no_sync()``, measured
  pairwise step by step (:func:`sync_pairs`): plain differences of medians swing with the load of
  a shared machine;
* data wait = the time ``next()`` on the loader takes, around the loop;
* a straggler's slowdown = its own work per step (the compute and sleep before the all-reduce,
  timed around them; median) ÷ the other rank's; the real all-reduce = the pairwise sync − no_sync
  difference of the rank that waits least (it waits for no one);
* totals: samples of every rank ÷ the loop's wall time; HF and Lightning: their own counters.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORLD = 2
RUN_ID = "ranks-truth"

#: scenario -> model and loop settings (DDP on CPU)
DDP_SCENARIOS: dict[str, dict[str, Any]] = {
    # two buckets of one layer each: the last layer's all-reduce runs beside the first layer's
    # backward, the first layer's all-reduce after it
    "ddp-little-overlap": {"layers": 2, "width": 2048, "bucket_mb": 16, "batch": 32, "steps": 44, "pairs": True},
    # six buckets of one layer each: most of the all-reduce runs beside backward
    "ddp-heavy-overlap": {"layers": 6, "width": 1024, "bucket_mb": 4, "batch": 64, "steps": 44, "pairs": True},
    # rank 1 sleeps 80 ms per step beside the same compute as rank 0 (about 35 ms: a slowdown of about
    # 3, which a loaded machine lowers but keeps above 1.5, and a compute time long enough to compare
    # slowdowns); a tiny DDP model: the all-reduce is negligible (also when a loaded machine makes it
    # take a few ms); no attach_ddp
    "straggler": {"layers": 2, "width": 64, "bucket_mb": 25, "batch": 64, "steps": 32, "pairs": True,
                  "sleep_rank": 1, "sleep_s": 0.08, "attach": False, "compute_layers": 3, "compute_width": 2048},
    # a loader that takes 20 ms per batch, next() timed by gpulse (wrap_loader)
    "data-bound": {"layers": 2, "width": 512, "bucket_mb": 25, "batch": 32, "steps": 30, "pairs": False,
                   "load_s": 0.02},
    "not-data-bound": {"layers": 2, "width": 512, "bucket_mb": 25, "batch": 32, "steps": 30, "pairs": False,
                       "load_s": 0.0},
}  # fmt: skip
WARMUP = 4


# -- the DDP loop (one process per rank) ----------------------------------------------------------------
def ddp_rank(rank: int, init: str, out: str, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpulse.training import Run
    from gpulse.training.comm import attach_ddp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(cfg["width"], cfg["width"]) for _ in range(cfg["layers"])]
    model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=cfg["bucket_mb"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    extra = torch.nn.Sequential(*[torch.nn.Linear(cfg.get("compute_width", 8), cfg.get("compute_width", 8))
                                  for _ in range(cfg.get("compute_layers", 0))])  # fmt: skip
    loader = Batches(cfg["batch"], cfg["width"], cfg["steps"] + WARMUP, cfg.get("load_s", 0.0))
    it = iter(loader)
    sleep = cfg.get("sleep_s", 0.0) if rank == cfg.get("sleep_rank") else 0.0
    pairs = cfg.get("pairs", False)
    ex = torch.randn(cfg["batch"], cfg.get("compute_width", 8))

    def one_step(x: Any, sync: bool) -> float:
        """One step; returns the time of the rank's own work before the all-reduce."""
        ctx = contextlib.nullcontext() if sync else model.no_sync()
        with ctx:
            t0 = time.perf_counter()
            if extra:  # identical compute on every rank, outside DDP
                with torch.no_grad():
                    extra(ex)
            if sleep:
                time.sleep(sleep)
            loss = model(x).square().mean()
            work = time.perf_counter() - t0
            loss.backward()
        opt.step()
        opt.zero_grad()
        return work

    for _ in range(WARMUP):  # DDP rebuilds its buckets after the first step
        one_step(next(it), True)
    t_run = time.perf_counter()
    run = Run(name="ranks-truth", output_dir=out, socket_path=os.path.join(out, "no-agent.sock"))
    if cfg.get("attach", True):
        attach_ddp(run, model)
    rows = []
    for i, x in enumerate(run.wrap_loader(it)):  # gpulse times the wait for each batch
        t1 = time.perf_counter()
        sync = not pairs or i % 4 < 2  # sync, sync, no_sync, no_sync: see sync_pairs
        with run.step(samples=cfg["batch"]):
            work = one_step(x, sync)
        rows.append({"wait": loader.waits[-1], "step": time.perf_counter() - t1, "sync": sync, "work": work})
    wall = time.perf_counter() - t_run
    run.finish()
    Path(out, f"truth-{rank}.json").write_text(json.dumps({"rows": rows, "wall": wall, "batch": cfg["batch"]}))
    dist.destroy_process_group()


class Batches:
    """``n`` random batches, each taking ``load_s`` to "load"; ``waits`` holds how long each took
    (``num_workers=0``: the loop waits exactly that long)."""

    def __init__(self, batch: int, width: int, n: int, load_s: float) -> None:
        self.batch, self.width, self.n, self.load_s = batch, width, n, load_s
        self.waits: list[float] = []

    def __iter__(self) -> Any:
        import torch

        for _ in range(self.n):
            t0 = time.perf_counter()
            if self.load_s:
                time.sleep(self.load_s)
            x = torch.randn(self.batch, self.width)
            self.waits.append(time.perf_counter() - t0)
            yield x


def ddp_truth(out: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    ranks = [json.loads((out / f"truth-{r}.json").read_text()) for r in range(WORLD)]
    total = sum(row["wait"] + row["step"] for t in ranks for row in t["rows"])
    steps_total = sum(row["step"] for t in ranks for row in t["rows"])
    truth: dict[str, Any] = {
        "train_steps": cfg["steps"],
        "train_samples": sum(t["batch"] * len(t["rows"]) for t in ranks),
        "train_samples_per_second": sum(t["batch"] * len(t["rows"]) for t in ranks) / ranks[0]["wall"],
        "data_loading_time_ratio": sum(row["wait"] for t in ranks for row in t["rows"]) / total,
    }
    if cfg.get("pairs"):
        diffs = {
            r: [t["rows"][a]["step"] - t["rows"][b]["step"] for a, b in sync_pairs(t["rows"])]
            for r, t in enumerate(ranks)
        }
        # the truth: what gradient sync costs the steps (each rank's mean pair difference on each
        # of its sync steps), waiting for slower ranks included
        syncs = {r: sum(row["sync"] for row in t["rows"]) for r, t in enumerate(ranks)}
        mean = {r: statistics.fmean(d) for r, d in diffs.items()}
        truth["no_sync_difference_ratio"] = sum(mean[r] * syncs[r] for r in diffs) / steps_total
        # the rank that waits least waits for no one: its difference is the communication itself
        floor = min(mean.values())
        truth["communication_time_ratio"] = floor * sum(syncs.values()) / steps_total
        truth["wait_for_slower_ranks_ratio"] = truth["no_sync_difference_ratio"] - truth["communication_time_ratio"]
        truth["pair_diffs_s"] = diffs
        if "sleep_rank" in cfg:
            # each rank's own work per step: its compute (and sleep) before the all-reduce, timed around it
            work = {r: statistics.median(row["work"] for row in t["rows"]) for r, t in enumerate(ranks)}
            slow = cfg["sleep_rank"]
            fast = next(r for r in range(WORLD) if r != slow)
            truth["straggler_slowdown"] = work[slow] / work[fast]
    return truth


def sync_pairs(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(sync step, no_sync step) index pairs whose steps follow the same kind of step.

    The loop goes sync, sync, no_sync, no_sync, ... After a sync step the ranks start together and,
    on a loaded 2-core machine, compete for the cores; after a no_sync step they start apart. So a
    sync step after a sync step is compared with a no_sync step after a sync step (the 2nd and 3rd
    of each four), and a sync step after a no_sync step with a no_sync step after one (1st and 4th).
    """
    out = []
    for i in range(4, len(rows) - 3, 4):  # the first four follow the warm-up (sync) steps
        if rows[i]["sync"] and rows[i + 1]["sync"] and not rows[i + 2]["sync"] and not rows[i + 3]["sync"]:
            out += [(i + 1, i + 2), (i, i + 3)]
    return out


def run_ddp(name: str, out: Path) -> dict[str, Any]:
    import torch.multiprocessing as mp

    cfg = DDP_SCENARIOS[name]
    mp.spawn(ddp_rank, args=(str(out / "init"), str(out), cfg), nprocs=WORLD, join=True)
    result = {"scenario": name, "truth": ddp_truth(out, cfg), **reports(out, recording_in(out))}
    if cfg.get("pairs"):
        result["pairs"] = pairs(out, recording_in(out))
    return result


def pairs(out: Path, recording: Path) -> list[dict[str, float | None]]:
    """Pair by pair on every rank: the no_sync difference, and what gpulse measured in the sync step."""
    found = []
    for rank in range(WORLD):
        rows = json.loads((out / f"truth-{rank}.json").read_text())["rows"]
        waited = logged(recording, "comm_s", rank)
        in_flight = logged(recording, "comm_in_flight_s", rank)
        for a, b in sync_pairs(rows):  # row i is step i + 1
            found.append({"difference": rows[a]["step"] - rows[b]["step"],
                          "waited": waited.get(a + 1), "in_flight": in_flight.get(a + 1)})  # fmt: skip
    return found


# -- Hugging Face Trainer and Lightning under torchrun ----------------------------------------------------
#: HF's timer and the Run start and end at different callbacks (the Run's own setup before its first
#: step, HF's bookkeeping after the loop): a fixed 30 ms or so, more on a loaded machine, that the
#: 5 % of ``train_runtime`` must absorb; at 12 steps (0.7 s) it took 4.5 % of them under load
HF = {"max_steps": 48, "batch": 4, "accum": 2}
LIGHTNING = {"batches": 24, "batch": 8, "accum": 2}


def hf_rank(out: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from gpulse.training.hf import GpulseCallback

    torch.set_num_threads(1)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=256, n_positions=32))
    args = TrainingArguments(
        output_dir=out, max_steps=HF["max_steps"], per_device_train_batch_size=HF["batch"],
        gradient_accumulation_steps=HF["accum"], logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, ddp_backend="gloo", dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[GpulseCallback(name="hf-ddp")])
    result = trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        truth = {
            "train_steps": trainer.state.global_step,
            "train_samples": trainer.state.global_step * HF["batch"] * HF["accum"] * int(os.environ["WORLD_SIZE"]),
            "train_samples_per_second": result.metrics["train_samples_per_second"],
            "train_runtime": result.metrics["train_runtime"],
        }
        Path(out, "truth-0.json").write_text(json.dumps(truth))


def lightning_rank(out: str) -> None:
    import pytorch_lightning as pl
    import torch

    from gpulse.training.lightning import GpulseLightningCallback

    torch.set_num_threads(1)
    raw: list[float] = []
    span: list[float] = []

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            raw.append(float(loss))
            self.log("train_loss", loss, on_step=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def on_train_start(self) -> None:  # the training loop's wall time, as the user would time it
            span.append(time.perf_counter())

        def on_train_end(self) -> None:
            span.append(time.perf_counter())

    g = torch.Generator().manual_seed(0)
    n = LIGHTNING["batches"] * LIGHTNING["batch"] * WORLD
    data = torch.utils.data.TensorDataset(torch.randn(n, 64, generator=g), 30 * torch.randn(n, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=LIGHTNING["batch"])
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=WORLD, strategy="ddp", num_nodes=1,
        accumulate_grad_batches=LIGHTNING["accum"], callbacks=[GpulseLightningCallback(name="lightning-ddp")],
        default_root_dir=out, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Net(), loader)
    wall = span[1] - span[0]
    k = LIGHTNING["accum"]
    if trainer.global_rank == 0:
        truth = {
            "train_steps": trainer.global_step,
            "train_samples": LIGHTNING["batches"] * LIGHTNING["batch"] * WORLD,
            "train_samples_per_second": LIGHTNING["batches"] * LIGHTNING["batch"] * WORLD / wall,
            # the loss Lightning logged, per optimizer step: the mean of its micro-batches
            "step_loss": [statistics.fmean(raw[i : i + k]) for i in range(0, len(raw), k)],
        }
        Path(out, "truth-0.json").write_text(json.dumps(truth))


def run_torchrun(scenario: str, worker: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           __file__, worker, str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPULSE_SOCKET": str(out / "no-agent.sock")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{scenario} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    truth = json.loads((out / "truth-0.json").read_text())
    result = {"scenario": scenario, "truth": truth, **reports(out, recording_in(out))}
    if "step_loss" in truth:
        loss = logged(recording_in(out), "log_loss", 0)
        result["rank0"]["step_loss"] = [loss[k] for k in sorted(loss)]
    return result


def logged(recording: Path, field: str, rank: int) -> dict[int, float]:
    """A rank's ``field`` by step, from the recording: read by the gpulse version under test where it
    has a reader of its recording (steps kept as rows lines), else as plain line protocol (older ones)."""
    by_step: dict[int, float] = {}
    try:
        from gpulse.channel.recording import read_records
    except ImportError:
        for line in recording.read_text().splitlines():  # a minimal line-protocol reading
            if not line.startswith("train_step,") or f",rank={rank}," not in line.split(" ", 1)[0] + ",":
                continue
            fields = dict(kv.split("=", 1) for kv in line.split(" ")[1].split(","))
            if field in fields:
                by_step[int(fields["step"].rstrip("i"))] = float(fields[field])
        return by_step
    for _, _, p in read_records(recording):
        if getattr(p, "measurement", None) == "train_step" and p.tags.get("rank") == str(rank) and field in p.fields:
            by_step[p.fields["step"]] = p.fields[field]
    return by_step


def recording_in(out: Path) -> Path:
    """The run's recording file (``gpulse-records.lp`` in older versions, ``.rec`` since)."""
    (path,) = out.glob("gpulse-records.*")
    return path


# -- what gpulse said ------------------------------------------------------------------------------------
FIELDS = (
    "train_steps", "train_samples", "train_samples_per_second", "train_runtime", "data_loading_time_ratio",
    "communication_time_ratio", "communication_in_flight_ratio", "wait_for_slower_ranks_ratio", "partial",
)  # fmt: skip


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures compared with the truth (``None`` where a gpulse version has no such field)."""
    out = {k: doc.get(k) for k in FIELDS}
    out["ranks"] = doc.get("run", {}).get("ranks")
    out["world_size"] = doc.get("run", {}).get("world_size")
    out["findings"] = [f["id"] for f in doc.get("diagnosis", [])]
    out["evidence"] = {f["id"]: f["evidence"] for f in doc.get("diagnosis", [])}
    out["slowdown"] = {str(x["rank"]): x.get("slowdown_vs_median") for x in doc.get("per_rank", [])}
    out["hints"] = doc.get("hints")
    return out


def reports(out: Path, recording: Path) -> dict[str, Any]:
    """Rank 0's metrics_report.json, and ``gpulse report`` over every rank's recording."""
    rank0 = json.loads((out / "metrics_report.json").read_text())
    merged_dir = out / "merged"
    cmd = [sys.executable, "-m", "gpulse", "report", "--from-file", str(recording), "--out", str(merged_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"gpulse report failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    merged = json.loads((merged_dir / "metrics_report.json").read_text())
    return {"rank0": summary(rank0), "merged": summary(merged), "rank0_text": proc.stdout}


SCENARIOS = (*DDP_SCENARIOS, "hf-ddp-ga", "lightning-ga")


def run_scenario(name: str, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)  # a recording left by an earlier run would be merged in
    out.mkdir(parents=True)
    os.environ["GPULSE_RUN_ID"] = RUN_ID  # every rank, and every gpulse version, under one run id
    os.environ["GPULSE_SOCKET"] = str(out / "no-agent.sock")  # no agent: each rank records to the file
    if name in DDP_SCENARIOS:
        return run_ddp(name, out)
    return run_torchrun(name, {"hf-ddp-ga": "hf-rank", "lightning-ga": "lightning-rank"}[name], out)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list) and v and isinstance(v[0], float):
        return "[" + ", ".join(f"{x:.3f}" for x in v) + "]"
    return "n/a" if v is None else str(v)


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for res in results:
        lines += [f"## {res['scenario']}", "", "| figure | truth | rank 0's metrics_report.json | gpulse report (all ranks) |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        keys = [
            k for k in ("no_sync_difference_ratio", *FIELDS, "straggler_slowdown") if k in res["truth"] or k in FIELDS
        ]
        for k in keys:
            lines.append(
                f"| {k} | {_fmt(res['truth'].get(k))} | {_fmt(res['rank0'].get(k))} | {_fmt(res['merged'].get(k))} |"
            )
        if "step_loss" in res["truth"]:
            t, g = res["truth"]["step_loss"], res["rank0"].get("step_loss") or []
            lines.append(f"| loss, first steps | {_fmt(t[:3])} | {_fmt(g[:3])} | |")
            lines.append(f"| logged steps | {len(t)} | {len(g)} | |")
        for k in ("ranks", "findings", "slowdown"):
            lines.append(f"| {k} | | {_fmt(res['rank0'].get(k))} | {_fmt(res['merged'].get(k))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0].endswith("-rank"):
        {"hf-rank": hf_rank, "lightning-rank": lightning_rank}[argv[0]](argv[1])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("--out", help="working directory (default: a temporary one)")
    ap.add_argument("--table", action="store_true", help="a markdown table instead of JSON")
    args = ap.parse_args(argv)
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ranks-truth-"))
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    results = []
    for name in names:
        t0 = time.monotonic()
        res = run_scenario(name, base / name)
        res["seconds"] = round(time.monotonic() - t0, 1)
        res.pop("rank0_text", None)
        results.append(res)
        print(f"{name}: {res['seconds']} s", file=sys.stderr)
    print(table(results) if args.table else json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
