"""A real distributed step's parts add up: two ranks on CPU (gloo, torchrun), a DDP model whose
forward, backward and optimizer are timed with ``run.phase``, the communication with ``attach_ddp``
and the batches with ``wrap_loader``. Every step of every rank, read back from the run's recording
and split by :func:`gpulse.report.phases.partition`, adds up to its step time within 1%: the
exposed communication wait lies inside the recorded backward phase (DDP waits for the all-reduce
before ``backward()`` returns), so it is shown once, and the named phases never exceed the step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict

import pytest

from gpulse.channel.recording import read_records
from gpulse.report.phases import OUTSIDE, partition

torch = pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gpulse.training import Run
    from gpulse.training.comm import attach_ddp

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def batches(n):
        for _ in range(n):
            time.sleep(0.005)
            yield torch.randn(64, 512)

    run = Run(name="step-parts", output_dir=sys.argv[1])
    attach_ddp(run, model)
    for x in run.wrap_loader(batches(24)):
        with run.step(samples=64):
            with run.phase("forward"):
                loss = model(x).square().mean()
                if rank == 1:
                    time.sleep(0.01)  # rank 0 waits for it in the all-reduce: comm_s holds that wait
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                opt.step()
                opt.zero_grad()
    run.finish()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def ddp_steps(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, list[dict]], dict]:
    tmp = tmp_path_factory.mktemp("parts")
    script = tmp / "ddp_parts.py"
    script.write_text(SCRIPT)
    out = tmp / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GPULSE_SOCKET": str(tmp / "no-agent.sock")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (recording,) = out.glob("gpulse-records.*")
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for _, _, p in read_records(recording):
        assert not isinstance(p, Exception), p
        if p.measurement == "train_step":
            row = {"time": p.ts, **p.tags, **p.fields}
            by_rank[int(row["rank"])].append(row)
    return dict(by_rank), json.loads((out / "metrics_report.json").read_text())


def test_every_step_of_every_rank_adds_up_to_its_step_time(ddp_steps: tuple[dict[int, list[dict]], dict]) -> None:
    by_rank, _ = ddp_steps
    assert sorted(by_rank) == [0, 1] and all(len(rows) == 24 for rows in by_rank.values())
    for rank, rows in by_rank.items():
        for row in rows:
            assert row["backward_s"] >= row["comm_s"] > 0, row  # the wait is inside backward
            p = partition([row])
            assert p.consistent, (rank, row)
            inside = sum(v for k, v in p.parts.items() if k not in OUTSIDE)
            assert inside == pytest.approx(row["step_time_s"], rel=0.01)
            assert p.parts["forward"] > 0 and p.parts["backward"] > 0 and p.parts["optimizer"] > 0
    # rank 0 waits for rank 1's sleep in the all-reduce: its comm part holds it, not its backward
    waits = [r["comm_s"] for r in by_rank[0][4:]]
    assert sorted(waits)[len(waits) // 2] > 0.005


def test_the_phases_cover_the_step_and_the_report_says_so(ddp_steps: tuple[dict[int, list[dict]], dict]) -> None:
    """'other' is what no phase covers: here only gpulse's own bookkeeping between the phases."""
    _, report = ddp_steps
    parts = report["phases_s"]
    assert set(parts) == {"data_wait", "forward", "backward", "comm", "optimizer", "other"}
    inside = sum(v for k, v in parts.items() if k not in OUTSIDE)
    assert inside == pytest.approx(report["step_time_s"]["mean"], rel=0.01)
    assert parts["other"] < 0.1 * report["step_time_s"]["mean"], parts
    assert not [h for h in report["hints"] if "exceed the step" in h]
    assert parts["data_wait"] > 0.004  # the loader's sleep, outside the step
