"""The first step's data wait is counted too (issue 13, item 7): with the HF Trainer and with
Lightning, the batch fetched for step 1 used to be in no step's ``data_wait_s``.

Ground truth comes from the dataset itself: every ``__getitem__`` records when it ran (Unix ns, the
clock of ``start_time_ns``), so the test knows which fetches fall inside step 1's wait. What the wait
must not hold is marked too: a callback sleeps ``MARK_S`` just before the loop starts fetching (the
framework's setup) and just after the step begins, so a wait that starts or ends in the wrong place
is longer than its loading by a whole mark, whatever the load of the machine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from test_training_lightning import Tiny
from training_support import Agent
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from gpulse.training.hf import GpulseCallback
from gpulse.training.lightning import GpulseLightningCallback

SEQ = 16
#: Per item: longer than the slack below, so that a fetch outside the wait never counts as inside.
FETCH_S = 0.03
#: Sleeps where a misplaced wait would begin or end. Half of one bounds the framework's own CPU work
#: in the wait (collation, the loader's look-ahead): a few ms on an idle machine, tens of ms on a
#: loaded one, where a bound relative to the loading ("at least 0.8 of the wait") failed; a mark is
#: far above either, so the bound holds under load and still catches a misplaced wait.
MARK_S = 0.4
#: The step's times reach the point through one perf_counter-to-Unix offset, read with two clock
#: calls, and the last fetch ends about 1 ms before the step begins: a little slack at both ends.
SLACK_NS = 5_000_000


class TimedItems(torch.utils.data.Dataset):
    """Items that take ``FETCH_S`` each to load, and remember when they were loaded."""

    def __init__(self, n: int, item) -> None:
        self.n = n
        self.item = item
        self.calls: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        t0 = time.time_ns()
        time.sleep(FETCH_S)
        self.calls.append((t0, time.time_ns()))
        return self.item(i)


def fetched_during_the_wait(data: TimedItems, step) -> float:
    """Seconds of ``__getitem__`` that ran inside ``step``'s data wait."""
    start = step.fields["start_time_ns"]
    since = start - step.fields["data_wait_s"] * 1e9
    return sum(t1 - t0 for t0, t1 in data.calls if t0 >= since - SLACK_NS and t1 <= start + SLACK_NS) / 1e9


def mostly_loading(step, fetched: float) -> bool:
    """The wait is the loading and the framework's own work around it, and holds neither mark."""
    return step.fields["data_wait_s"] - fetched < MARK_S / 2


class HfMarks(TrainerCallback):
    """Listed after gpulse's callback: setup before the epoch, and work at the step's start."""

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        time.sleep(MARK_S)

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        if state.global_step == 0:  # only step 1 is judged
            time.sleep(MARK_S)


class LightningMarks(pl.Callback):
    """Listed after gpulse's callback: setup before the epoch, and work at the step's start."""

    def on_train_start(self, trainer, pl_module) -> None:
        time.sleep(MARK_S)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0:  # only step 1 is judged
            time.sleep(MARK_S)


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    a = Agent(tmp_path)
    monkeypatch.setenv("GPULSE_SOCKET", a.path)
    yield a
    a.close()


def first_step(agent: Agent):
    return min(agent.points("train_step"), key=lambda p: p.fields["step"])


def test_the_trainer_s_first_step_waits_for_its_own_micro_batches(agent: Agent, tmp_path: Path) -> None:
    batch, accum = 2, 2

    def tokens(i: int) -> dict:
        ids = torch.randint(0, 100, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=SEQ))
    data = TimedItems(32, tokens)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=batch,
        gradient_accumulation_steps=accum, save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=data, callbacks=[GpulseCallback(), HfMarks()]).train()
    step = first_step(agent)
    assert step.fields["step"] == 1 and "data_wait_s" in step.fields
    fetched = fetched_during_the_wait(data, step)
    assert fetched >= batch * accum * FETCH_S  # all of step 1's items were loaded inside its wait
    assert mostly_loading(step, fetched), (step.fields["data_wait_s"], fetched)


def test_lightning_s_first_step_waits_for_the_batch_the_loop_fetches_before_it(agent: Agent, tmp_path: Path) -> None:
    """Lightning prefetches: batch 1 is loaded while the loop is set up, and each step's wait holds
    the next batch's loading, step 1's included."""
    batch = 4
    data = TimedItems(3 * batch, lambda i: (torch.randn(4), torch.randn(1)))
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, callbacks=[GpulseLightningCallback(), LightningMarks()],
        default_root_dir=str(tmp_path / "out"), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=batch))
    step = first_step(agent)
    assert step.fields["step"] == 1 and "data_wait_s" in step.fields
    fetched = fetched_during_the_wait(data, step)
    assert fetched >= batch * FETCH_S  # one whole batch was loaded inside step 1's wait
    assert mostly_loading(step, fetched), (step.fields["data_wait_s"], fetched)
