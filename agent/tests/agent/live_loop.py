"""Training loops for the rolling findings' proof (``test_live_findings.py``), each its own process
beside a real agent, reporting through the real training library and recording its own ground truth.

    python live_loop.py OUT SOCKET shift STEPS SLOW_FROM SLOW_UNTIL
    python live_loop.py OUT SOCKET healthy STEPS
    python live_loop.py OUT SOCKET straggler STEPS SLOW_FROM     (two gloo ranks, DDP)

``shift``: a DataLoader (``num_workers=0``) whose ``Dataset.__getitem__`` sleeps :data:`SLOW_ITEM_S`
per item for the steps in [SLOW_FROM, SLOW_UNTIL), else costs nothing; each step's own work is
:data:`STEP_S` of sleep (the "GPU"). ``straggler``: rank 1 sleeps :data:`STRAGGLE_S` more in its
forward from step SLOW_FROM on, before DDP's all-reduce. The truth (``OUT/truth.json``, one per
rank for ``straggler``): the run id, and the wall-clock time (ns) at which the change began and ended.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from gpulse.training import Run

STEP_S = 0.02
SLOW_ITEM_S = 0.015
BATCH = 4
STRAGGLE_S = 0.06


class Items(torch.utils.data.Dataset):
    """Items that cost nothing, except while ``slow`` is set: then each sleeps :data:`SLOW_ITEM_S`."""

    def __init__(self) -> None:
        self.slow = False

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.slow:
            time.sleep(SLOW_ITEM_S)
        return torch.full((16,), float(i))


def loader_loop(out: Path, socket: str, steps: int, slow_from: int, slow_until: int) -> None:
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    items = Items()
    run = Run(name="live-loader", output_dir=out, socket_path=socket)
    batches = iter(run.wrap_loader(torch.utils.data.DataLoader(items, batch_size=BATCH, num_workers=0)))
    truth: dict = {"run": run.run_id, "profile_requests": []}
    # the profiler window's call site (``training.profiling`` plugs in here): which raises asked for it
    run.worker.request_profile = lambda rule, _evidence: truth["profile_requests"].append(rule) or True
    for step in range(steps):
        if step == slow_from:
            truth["change_ns"] = time.time_ns()
            items.slow = True
        if step == slow_until:
            truth["back_ns"] = time.time_ns()
            items.slow = False
        x = next(batches)
        with run.step(samples=len(x)):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(STEP_S)
    truth["end_ns"] = time.time_ns()
    if "back_ns" in truth:  # the pace measured on each side of the change
        truth["slow_step_s"] = (truth["back_ns"] - truth["change_ns"]) / 1e9 / (slow_until - slow_from)
        truth["fast_step_s"] = (truth["end_ns"] - truth["back_ns"]) / 1e9 / (steps - slow_until)
    run.finish()
    out.mkdir(parents=True, exist_ok=True)
    (out / "truth.json").write_text(json.dumps(truth))


def ddp_rank(rank: int, out: str, socket: str, steps: int, slow_from: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpulse.training.comm import attach_ddp

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/init", rank=rank, world_size=2)
    model = DDP(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    run = Run(name="live-straggler", output_dir=out, socket_path=socket, write_report=False)
    attach_ddp(run, model)
    truth: dict = {"run": run.run_id, "rank": rank}
    x = torch.randn(BATCH, 16)
    for step in range(steps):
        if step == slow_from:
            truth["change_ns"] = time.time_ns()
        with run.step(samples=BATCH):
            time.sleep(STEP_S + (STRAGGLE_S if rank == 1 and step >= slow_from else 0.0))
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    truth["end_ns"] = time.time_ns()
    truth["slow_step_s"] = (truth["end_ns"] - truth["change_ns"]) / 1e9 / (steps - slow_from)
    run.finish()
    Path(out, f"truth-{rank}.json").write_text(json.dumps(truth))
    dist.destroy_process_group()


def main(out: Path, socket: str, mode: str, steps: int, *change: int) -> None:
    if mode == "straggler":
        import torch.multiprocessing as mp

        out.mkdir(parents=True, exist_ok=True)
        mp.spawn(ddp_rank, args=(str(out), socket, steps, change[0]), nprocs=2)
    elif mode == "shift":
        loader_loop(out, socket, steps, *change)
    else:
        loader_loop(out, socket, steps, steps, steps)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], *map(int, sys.argv[4:]))
