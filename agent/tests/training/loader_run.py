"""A small training loop whose DataLoader is slow in one chosen way, run by ``test_host_loading.py`` as
its own process beside a real agent (its own process so that a test can put it in a cgroup).

    python loader_run.py OUT SOCKET WORKERS STEPS cpu
    python loader_run.py OUT SOCKET WORKERS STEPS disk DEVICE SIZE

``cpu``: each item costs :data:`ITEM_CPU_S` of CPU time (a busy loop on the thread's CPU clock, so the
cost is the same however contended the host is). ``disk``: each item is one ``O_DIRECT`` read from
DEVICE (a throttled test disk). The ground truth goes to ``OUT/truth.json``: the loop's wall time, the
CPU its workers used (the kernel's ``RUSAGE_CHILDREN`` once they ended) and its own CPU.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import torch
from support.slow_items import slow_item

from gpulse.training import Run

ITEM_CPU_S = 0.02
BATCH = 4


class Items(torch.utils.data.Dataset):
    def __init__(self, device: str | None, size: int) -> None:
        self.device = device
        self.size = size

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        slow_item(i, ITEM_CPU_S, self.device, self.size)
        return torch.full((16,), float(i))


def idle_ticks() -> tuple[int, int]:
    """(idle + iowait, all) clock ticks of every CPU so far (proc(5), the ``cpu`` line; guest time is in user)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return ticks[3] + ticks[4], sum(ticks)


def main(out: Path, socket: str, workers: int, steps: int, case: str, *disk: str) -> None:
    device, size = (disk[0], int(disk[1])) if case == "disk" else (None, 0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = Run(name=f"loader-{case}-{workers}", output_dir=out, socket_path=socket, write_report=False)
    loader = torch.utils.data.DataLoader(Items(device, size), batch_size=BATCH, num_workers=workers)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    idle0 = idle_ticks()
    t0 = time.monotonic()
    batches = iter(run.wrap_loader(loader))
    for _ in range(steps):
        x = next(batches)
        with run.step(samples=len(x)):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    wall = time.monotonic() - t0
    idle1 = idle_ticks()
    del batches  # ends the workers (joined), so that RUSAGE_CHILDREN counts them
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    run.finish()
    truth = {
        "run": run.run_id,
        "wall_s": wall,
        "workers_cpu_s": children.ru_utime + children.ru_stime,
        "main_cpu_s": own.ru_utime + own.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
        # CPUs idle (idle + iowait) over the loop, in cores, from /proc/stat's own counters
        "host_idle_cores": os.cpu_count() * (idle1[0] - idle0[0]) / (idle1[1] - idle0[1]),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "truth.json").write_text(json.dumps(truth))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
