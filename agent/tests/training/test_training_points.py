"""What a step becomes on the way to the agent: plain numbers whatever the user handed over, one
field per name, and nothing lost when the agent is away (the background thread's cheap path, issue 13).

Against the real agent-side receiver (``training_support.Agent``), which checks every field."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from training_support import Agent, recorded

from gpulse.channel.protocol import RECORD_FILE
from gpulse.training import Run


@pytest.fixture
def agent(tmp_path: Path):
    a = Agent(tmp_path)
    yield a
    a.close()


def steps_of(agent: Agent) -> list:
    return sorted(agent.points("train_step"), key=lambda p: p.fields["step"])


def test_counts_of_any_integer_type_arrive_as_integers_and_what_is_not_a_number_is_named(
    agent: Agent, tmp_path: Path
) -> None:
    run = Run(name="types", output_dir=tmp_path, socket_path=agent.path, write_report=False)
    with run.step(samples=np.int64(8), tokens=torch.tensor(512), step=np.int32(1)):
        pass
    run.log(loss=np.float32(0.25), lr=torch.tensor(0.5))
    with run.step(samples=2.5, tokens=True, step=2.0):  # half a sample is no count; a bool is 1
        pass
    run.log(loss=float("nan"), acc=float("inf"), lr=0.125)
    run.finish()
    first, second = steps_of(agent)
    assert first.fields["samples"] == 8 and first.fields["tokens"] == 512 and first.fields["step"] == 1
    assert first.fields["log_loss"] == 0.25 and first.fields["log_lr"] == 0.5
    assert first.fields["samples_per_s"] == pytest.approx(8 / first.fields["step_time_s"])
    assert "samples" not in second.fields and "samples_per_s" not in second.fields
    assert second.fields["tokens"] == 1 and second.fields["step"] == 2
    assert second.fields["log_lr"] == 0.125 and "log_loss" not in second.fields and "log_acc" not in second.fields
    errors = run.stats()["errors"]
    assert errors["not_an_integer"] == 1 and errors["nonfinite_value"] == 2
    assert agent.receiver.stats()["records_rejected"] == 0  # the agent refused nothing


def test_a_phase_entered_twice_is_one_field_with_both_times_and_names_that_clean_alike_are_one_field(
    agent: Agent, tmp_path: Path
) -> None:
    run = Run(name="twice", output_dir=tmp_path, socket_path=agent.path, write_report=False)
    t0 = time.perf_counter()
    with run.step():
        for _ in range(2):
            with run.phase("forward"):
                time.sleep(0.02)
            with run.phase("backward"):
                pass
    elapsed = time.perf_counter() - t0
    run.log(**{"grad norm": 1.0, "grad_norm": 2.0})  # both clean to log_grad_norm: the last one is kept
    run.finish()
    (step,) = steps_of(agent)
    assert 0.04 <= step.fields["forward_s"] <= elapsed
    assert step.fields["log_grad_norm"] == 2.0


def test_with_the_agent_away_the_buffer_holds_at_most_its_bytes_and_every_step_reaches_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Unsent points are counted by a bound on their size until they are encoded (the agent is away:
    they may never need JSON); the bound keeps the buffer within ``max_unacked_bytes``."""
    out = tmp_path / "out"
    run = Run(
        name="away", output_dir=out, socket_path=str(tmp_path / "none" / "agent.sock"), write_report=False,
        max_unacked_bytes=20_000, ack_timeout=60,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="gpulse.training"):
        for i in range(300):
            with run.step(samples=4):
                pass
            run.log(loss=1.0 / (i + 1))
            if i % 50 == 0:
                time.sleep(0.6)  # a tick of the background thread
                assert run.client.pending_bytes <= 20_000  # the bound held after each tick
        run.finish()
    assert sorted(p.fields["step"] for p in recorded(out / RECORD_FILE, "train_step")) == list(range(1, 301))
    assert run.stats()["errors"]["buffer_full"] >= 1
    said = [r.getMessage() for r in caplog.records if "buffer_full" in r.getMessage()]
    assert len(said) == 1 and str(out / RECORD_FILE) in said[0]
