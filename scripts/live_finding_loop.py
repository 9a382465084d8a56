"""The training run of ``scripts/live-finding-demo.sh``: a small CPU model whose DataLoader turns slow
halfway and fast again, reporting to the agent at SOCKET through ``gpulse.training.Run``.

    python scripts/live_finding_loop.py OUT SOCKET [STEPS SLOW_FROM SLOW_UNTIL]

Two DataLoader workers; the items of the steps in [SLOW_FROM, SLOW_UNTIL) each burn
:data:`ITEM_CPU_S` of CPU in ``Dataset.__getitem__`` (CPU-bound workers), the others cost nothing;
each step's own work is :data:`STEP_S` (a sleep standing in for the GPU). It prints, with UTC
timestamps, when the loop reaches the change and when it is back to fast, and writes
``OUT/metrics_report.json`` at its end.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from gpulse.training import Run

STEP_S = 0.02
ITEM_CPU_S = 0.015
BATCH = 4
WORKERS = 2


def utc() -> str:
    return datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3] + " UTC"


class Items(torch.utils.data.Dataset):
    """Free items, but for those of the slow steps (chosen by index, so every worker agrees)."""

    def __init__(self, slow: range) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.slow:
            t0 = time.thread_time()
            while time.thread_time() - t0 < ITEM_CPU_S:  # CPU time, however busy the machine is
                pass
        return torch.full((16,), float(i))


def main(out: Path, socket: str, steps: int, slow_from: int, slow_until: int) -> None:
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(x: torch.Tensor) -> None:
        """A step's work: a tiny model's update, and a sleep that stands in for the GPU's time."""
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        time.sleep(STEP_S)

    run = Run(name="live-finding-demo", output_dir=out, socket_path=socket, quiet=True)
    items = Items(range(slow_from * BATCH, slow_until * BATCH))
    batches = iter(run.wrap_loader(torch.utils.data.DataLoader(items, batch_size=BATCH, num_workers=WORKERS)))
    print(f"{utc()}  training run {run.run_id}: {steps} steps, {WORKERS} DataLoader workers", flush=True)
    for step in range(steps):
        if step == slow_from:
            print(f"{utc()}  CHANGE at step {step}: Dataset.__getitem__ now burns {ITEM_CPU_S * 1e3:.0f} ms of "
                  f"CPU per item ({BATCH} items a step) -> the run turns data-bound", flush=True)  # fmt: skip
        if step == slow_until:
            print(f"{utc()}  CHANGE at step {step}: items are free again -> the run is fast again", flush=True)
        x = next(batches)
        with run.step(samples=len(x)):
            train(x)
    del batches
    run.finish()
    print(f"{utc()}  training run ended after {steps} steps; report {out / 'metrics_report.json'}", flush=True)


if __name__ == "__main__":
    numbers = [int(a) for a in sys.argv[3:6]] or [650, 100, 350]
    main(Path(sys.argv[1]), sys.argv[2], *numbers)
