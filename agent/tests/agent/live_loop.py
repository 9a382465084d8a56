"""Training loops for the rolling findings' proof (``test_live_findings.py``), each its own process
beside a real agent, reporting through the real training library and recording its own ground truth.

    python live_loop.py OUT SOCKET shift STEPS SLOW_FROM SLOW_UNTIL
    python live_loop.py OUT SOCKET io STEPS SLOW_FROM SLOW_UNTIL DEVICE SIZE
    python live_loop.py OUT SOCKET healthy STEPS
    python live_loop.py OUT SOCKET straggler STEPS SLOW_FROM     (two gloo ranks, DDP)

``shift`` and ``io``: a DataLoader with :data:`WORKERS` workers whose ``Dataset.__getitem__`` is slow
for the items of the steps in [SLOW_FROM, SLOW_UNTIL) and costs nothing otherwise: ``shift`` burns
:data:`ITEM_CPU_S` of CPU per item (a busy loop on the thread's CPU clock), ``io`` makes one
``O_DIRECT`` read from DEVICE (a throttled test disk) per item. Each step's own work is
:data:`LOADER_STEP_S` of sleep (the "GPU"). ``straggler``: rank 1 sleeps :data:`STRAGGLE_S` more in its forward from step
SLOW_FROM on, before DDP's all-reduce. The truth (``OUT/truth.json``, one per rank for ``straggler``):
the run id, and the wall-clock time (ns) at which the change began and ended: for the loader, when a
worker began the first slow item and the first fast one after them (the workers fetch ahead of the
step loop, so this is before the loop meets them).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from support.slow_items import slow_item

from gpulse.training import Run

STEP_S = 0.02
#: the loader loops' step: long enough that, fast, two workers keep ahead of it on a crowded machine
LOADER_STEP_S = 0.05
ITEM_CPU_S = 0.04
BATCH = 4
WORKERS = 2
#: batches each worker may have ready ahead of the loop (torch's default is 2)
PREFETCH = 4
STRAGGLE_S = 0.06


class Items(torch.utils.data.Dataset):
    """Items that cost nothing, except those of the slow steps (by index, so that every worker
    process agrees): each burns CPU, or reads a block of ``device``. The first slow item and the first
    fast one after them stamp the time they began in ``out`` (``slow_ns``, ``fast_ns``)."""

    def __init__(self, out: Path, slow: range, device: str | None = None, size: int = 0) -> None:
        self.out, self.slow, self.device, self.size = out, slow, device, size
        self.stamped: set[str] = set()

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.slow:
            self._stamp("slow_ns")
            slow_item(i, ITEM_CPU_S, self.device, self.size)
        elif i >= self.slow.stop and self.slow:
            self._stamp("fast_ns")
        return torch.full((16,), float(i))

    def _stamp(self, name: str) -> None:
        """The time now into ``out/name``, by the first process to get there (``O_EXCL``)."""
        if name in self.stamped:
            return
        self.stamped.add(name)
        now = time.time_ns()
        try:
            fd = os.open(self.out / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return
        os.write(fd, str(now).encode())
        os.close(fd)


def loader_loop(out: Path, socket: str, steps: int, slow_from: int, slow_until: int, disk: list[str]) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    device, size = (disk[0], int(disk[1])) if disk else (None, 0)
    items = Items(out, range(slow_from * BATCH, slow_until * BATCH), device, size)
    run = Run(name="live-loader", output_dir=out, socket_path=socket)
    loader = torch.utils.data.DataLoader(items, batch_size=BATCH, num_workers=WORKERS, prefetch_factor=PREFETCH)
    batches = iter(run.wrap_loader(loader))
    truth: dict = {"run": run.run_id, "profile_requests": []}
    # the profiler window's call site (``training.profiling`` plugs in here): which raises asked for it
    run.worker.request_profile = lambda rule, _evidence: truth["profile_requests"].append(rule) or True
    for step in range(steps):
        if step == slow_from:
            truth["loop_change_ns"] = time.time_ns()
        if step == slow_until:
            truth["loop_back_ns"] = time.time_ns()
        x = next(batches)
        with run.step(samples=len(x)):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(LOADER_STEP_S)
    truth["end_ns"] = time.time_ns()
    del batches  # the workers end
    if "loop_back_ns" in truth:  # the pace the loop measured on each side of the change
        truth["slow_step_s"] = (truth["loop_back_ns"] - truth["loop_change_ns"]) / 1e9 / (slow_until - slow_from)
        truth["fast_step_s"] = (truth["end_ns"] - truth["loop_back_ns"]) / 1e9 / (steps - slow_until)
        truth["change_ns"] = int((out / "slow_ns").read_text())
        truth["back_ns"] = int((out / "fast_ns").read_text())
    run.finish()
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


def main(out: Path, socket: str, mode: str, steps: int, change: list[int], disk: list[str]) -> None:
    if mode == "straggler":
        import torch.multiprocessing as mp

        out.mkdir(parents=True, exist_ok=True)
        mp.spawn(ddp_rank, args=(str(out), socket, steps, change[0]), nprocs=2)
    elif mode in ("shift", "io"):
        loader_loop(out, socket, steps, change[0], change[1], disk)
    else:
        loader_loop(out, socket, steps, steps, steps, [])


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]), args[1], args[2], int(args[3]), [int(a) for a in args[4:6]], args[6:])
