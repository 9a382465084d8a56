"""PyTorch Lightning with ``GpulseLightningCallback``, on CPU."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from training_support import Agent

from gpulse.training.lightning import GpulseLightningCallback

BATCHES = 5


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SlowPairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8 * BATCHES

    def __getitem__(self, i: int):
        time.sleep(0.002)
        return torch.randn(4), torch.randn(1)


def test_the_lightning_callback_sends_every_batch_with_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = Agent(tmp_path)
    monkeypatch.setenv("GPULSE_SOCKET", agent.path)
    try:
        callback = GpulseLightningCallback(tags={"framework": "lightning"})
        trainer = pl.Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            callbacks=[callback],
            default_root_dir=str(tmp_path / "out"),
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Tiny(), torch.utils.data.DataLoader(SlowPairs(), batch_size=8))
        steps = sorted(agent.points("train_step"), key=lambda p: p.fields["step"])
        assert [p.fields["step"] for p in steps] == list(range(1, BATCHES + 1))
        for p in steps:
            f = p.fields
            assert p.tags["framework"] == "lightning" and p.tags["run"] == callback.run.run_id
            assert 0 < f["forward_s"] < f["step_time_s"]
            assert 0 < f["backward_s"] < f["step_time_s"]
            assert 0 < f["optimizer_s"] < f["step_time_s"]
            assert f["samples"] == 8
            assert f["log_loss"] >= 0
        # the loop fetches the next batch (8 x 2 ms) between one batch's end and the next one's start
        assert all(p.fields["data_wait_s"] > 0.012 for p in steps[1:])
        runs = agent.points("train_run")
        assert [(r.fields["event"], r.fields["status"]) for r in runs] == [("start", "running"), ("end", "finished")]
        assert callback.run.stats()["errors"] == {}
    finally:
        agent.close()


class Recorded(Tiny):
    """Keeps each batch's loss as ``training_step`` returns it (what ``self.log`` would show)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.raw.append(float(loss.detach()))
        return loss


class SlowerPairs(SlowPairs):
    def __getitem__(self, i: int):
        time.sleep(0.004)
        return torch.randn(4), 10 * torch.randn(1)


def test_with_gradient_accumulation_a_step_is_an_optimizer_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accumulate_grad_batches=2: one step per trainer.global_step, its two batches' samples, the mean
    of their losses as training_step returned them, and the fetch between them counted once, as data wait."""
    agent = Agent(tmp_path)
    monkeypatch.setenv("GPULSE_SOCKET", agent.path)
    try:
        module = Recorded()
        trainer = pl.Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            accumulate_grad_batches=2,
            callbacks=[GpulseLightningCallback()],
            default_root_dir=str(tmp_path / "out"),
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, torch.utils.data.DataLoader(SlowerPairs(), batch_size=8))
        steps = sorted(agent.points("train_step"), key=lambda p: p.fields["step"])
        assert trainer.global_step == 3 and len(module.raw) == 5  # 5 batches: 2 + 2, and 1 stepped at the epoch end
        assert [p.fields["step"] for p in steps] == [1, 2, 3]
        assert [p.fields["samples"] for p in steps] == [16, 16, 8]
        expected = [(module.raw[0] + module.raw[1]) / 2, (module.raw[2] + module.raw[3]) / 2, module.raw[4]]
        assert [p.fields["log_loss"] for p in steps] == pytest.approx(expected, rel=1e-6)
        for prev, p in itertools.pairwise(steps):
            f = p.fields
            assert f["data_wait_s"] > 2 * 8 * 0.004 if f["samples"] == 16 else f["data_wait_s"] > 8 * 0.004
            # the fetch inside the step is data wait, not step time: wait + step = the time since the last step
            since = (f["end_time_ns"] - prev.fields["end_time_ns"]) / 1e9
            assert f["data_wait_s"] + f["step_time_s"] == pytest.approx(since, abs=0.01)
    finally:
        agent.close()


#: A real fit without an agent, in its own process: what it prints, stdout and stderr in one stream.
FIT = """
import sys, torch, pytorch_lightning as pl
from test_training_lightning import Tiny, SlowPairs
from gpulse.training.lightning import GpulseLightningCallback
out = sys.argv[1]
callback = GpulseLightningCallback(socket_path=out + "/no-agent.sock")
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, callbacks=[callback], default_root_dir=out,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False)
trainer.fit(Tiny(), torch.utils.data.DataLoader(SlowPairs(), batch_size=8))
"""


def test_the_run_summary_comes_once_after_lightnings_own_last_words(tmp_path: Path, clean_env: dict[str, str]) -> None:
    here = Path(__file__).parent
    path = os.pathsep.join([str(here), str(here.parent), clean_env.get("PYTHONPATH", "")])
    env = {**clean_env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(
        [sys.executable, "-c", FIT, str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()
    ours = [i for i, line in enumerate(lines) if re.match(r"gpulse: run Tiny-\S+ finished: 5 steps in ", line)]
    assert len(ours) == 1, res.stdout
    stopped = lines.index("`Trainer.fit` stopped: `max_epochs=1` reached.")
    assert stopped < ours[0]
    assert f"  report: {tmp_path / 'metrics_report.json'}" in lines[ours[0] :]
