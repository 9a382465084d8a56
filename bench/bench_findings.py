"""10. Live findings' cost to training: the training thread's step with the agent judging rolling
findings against the same agent with ``--no-live-findings``, in the same run.

The rules run in the agent (``gpulse.agent.findings``), never on the training thread, so the ratio
should be 1: this shows it. A real agent (1 simulated GPU, 5 Hz, recording to a file) runs beside a
real training process (``gpulse.training.Run``, no profiler window: its cost is section 9's) whose
loader sleeps for each batch, so that the agent raises ``data_loading`` for it while it runs; its
rules are judged four times a second over a window of 30 steps or 2.5 s, far more often than the
default (every 5 s), so that any cost would show. The two agents alternate, each beside one run of
the same steps; the figure is the median wall time of the training thread's steps (the work inside
``run.step``, gpulse's step bookkeeping included), with the thread's CPU per step beside it. A run
beside the judging agent must have been told of a raised finding, and one beside the other of none.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from common import Table, agent_beside, alternate, scale

LIVE = ["--live-window-steps", "30", "--live-window-s", "2.5", "--live-every-s", "0.25"]
_TRAINER = r"""
import json, statistics, sys, time
import torch
from gpulse.training import Run

torch.set_num_threads(1)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)

class Slow(torch.utils.data.Dataset):  # the loader sleeps: the run is data-bound, a finding is raised
    def __len__(self):
        return 1 << 30
    def __getitem__(self, i):
        time.sleep(0.004)
        return i

run = Run(name="bench-findings", output_dir=sys.argv[2], socket_path=sys.argv[1], write_report=False,
          profile=False, quiet=True)
batches = iter(run.wrap_loader(torch.utils.data.DataLoader(Slow(), batch_size=1, num_workers=0)))
wall, cpu = [], []
for _ in range(int(sys.argv[3])):
    next(batches)
    t, c = time.perf_counter(), time.thread_time()
    with run.step(samples=64):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    wall.append(time.perf_counter() - t)
    cpu.append(time.thread_time() - c)
time.sleep(1.5)  # the last evaluation's word reaches the run
run.finish()
told = [f["rule"] for f in run.report.live_findings]
print(json.dumps({"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu), "told": told}))
"""


def _trained(tmp: Path, live: bool, steps: int) -> dict:
    """One agent (judging findings or not) beside one training run; the run's step figures."""
    sock = tmp / "agent.sock"
    args = ["--simulate", "1", "--interval", "0.2", "--record", str(tmp / "rec.lp")]
    args += ["--spool-dir", str(tmp / "spool"), *(LIVE if live else ["--no-live-findings"])]
    with agent_beside(sock, args, tmp / "agent.log") as env:
        done = subprocess.run(
            [sys.executable, "-c", _TRAINER, str(sock), str(tmp / "out"), str(steps)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if live:
        assert "data_loading" in result["told"], f"the agent raised no finding for the run: {result}"
    else:
        assert result["told"] == [], result
    return result


def run(table: Table) -> dict[str, float]:
    reps, steps = scale(3, 1), scale(1500, 900)
    on, off = alternate(reps, lambda tmp, live: _trained(tmp, live, steps))
    wall, wall0, cpu, cpu0 = (
        statistics.median(r[key] for r in runs) for key in ("wall_s", "cpu_s") for runs in (on, off)
    )
    ratio = table.pair(
        "training thread's step, agent judging live findings (ms)",
        wall * 1e3,
        wall0 * 1e3,
        "{:.3f}",
        "--no-live-findings",
        "1.0: the rules run in the agent",
    )
    table.pair("training thread's CPU per step, same runs (ms)", cpu * 1e3, cpu0 * 1e3, "{:.3f}", "--no-live-findings")
    return {"step_ratio_live_findings_on_vs_off": round(ratio, 3)}


if __name__ == "__main__":
    print(json.dumps(run(Table())))
