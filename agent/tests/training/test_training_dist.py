"""Two ``torch.distributed`` (gloo) ranks with DDP: one run id, two ranks, communication time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from training_support import Agent

STEPS = 3


def worker(rank: int, world: int, init_file: str, sock: str, out: str) -> None:
    from gpulse.training import Run
    from gpulse.training.comm import attach_ddp
    from gpulse.training.step import StepRecord

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        run = Run(name="ddp", output_dir=out, socket_path=sock)  # no launcher id: rank 0 makes one
        attach_ddp(run, model)
        for _ in range(STEPS):
            with run.step(samples=4):
                with run.phase("forward"):
                    loss = model(torch.randn(4, 256)).square().mean()
                with run.phase("backward"):
                    loss.backward()  # the all-reduce runs here
                with run.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
        run.finish()
        assert run.stats()["errors"] == {}, run.stats()
        # training goes on after the run: its hooks are off (DDP keeps the comm hook, muted)
        again = Run(name="ddp-2", output_dir=out, socket_path=sock + ".none", write_report=False)
        attach_ddp(again, model)  # the wait probe; DDP takes one comm hook only, so no time in flight
        with again.step(samples=4):
            model(torch.randn(4, 256)).square().mean().backward()
        assert run.comm_timer.intervals == [] and run.comm_timer.probe.handles == []
        assert again.steps.last is not None
        last = StepRecord(*again.steps.last)
        assert last.comm_ns > 0 and last.inflight_ns is None
        again.finish()
        assert again.stats()["errors"] == {"comm_hook": 1}, again.stats()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_report_under_one_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPULSE_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    agent = Agent(tmp_path)
    try:
        mp.spawn(worker, args=(2, str(tmp_path / "init"), agent.path, str(tmp_path / "out")), nprocs=2, join=True)
        steps = agent.points("train_step")
        assert len(steps) == 2 * STEPS
        assert len({p.tags["run"] for p in steps}) == 1
        assert sorted((p.tags["rank"], p.fields["step"]) for p in steps) == [
            (r, s) for r in ("0", "1") for s in range(1, STEPS + 1)
        ]
        assert {p.tags["world_size"] for p in steps} == {"2"}
        for p in steps:
            # the wait for the all-reduce is inside backward; the time in flight covers the wait
            assert 0 < p.fields["comm_s"] <= p.fields["backward_s"]
            assert p.fields["comm_s"] <= p.fields["comm_in_flight_s"]
        runs = agent.points("train_run")
        assert sorted((r.tags["rank"], r.fields["event"]) for r in runs) == [
            ("0", "end"), ("0", "start"), ("1", "end"), ("1", "start"),
        ]  # fmt: skip
    finally:
        agent.close()
