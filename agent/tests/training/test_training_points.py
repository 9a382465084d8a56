"""What a step becomes on the way to the agent: plain numbers whatever the user handed over, one
field per name, and nothing lost when the agent is away (the background thread's cheap path, issue 13).

Against the real agent-side receiver (``training_support.Agent``), which checks every field."""

from __future__ import annotations

import logging
import random
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from training_support import Agent, recorded

from gpulse.channel.protocol import KIND_FLOAT, MAX_OPEN_FIELDS_PER_RUN, RECORD_FILE, Point, StepRows
from gpulse.training import Run
from gpulse.training.cuda import CudaDevice
from gpulse.training.errors import Guard
from gpulse.training.mfu import Mfu
from gpulse.training.points import PointMaker
from gpulse.training.report import ReportBuffer
from gpulse.training.step import QueuedStep, StepRecord, StepRecorder
from gpulse.training.worker import Worker


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
                assert run.client._bytes <= 20_000  # what the buffer counts against max_unacked_bytes, after each tick
        run.finish()
    assert sorted(p.fields["step"] for p in recorded(out / RECORD_FILE, "train_step")) == list(range(1, 301))
    assert run.stats()["errors"]["buffer_full"] >= 1
    said = [r.getMessage() for r in caplog.records if "buffer_full" in r.getMessage()]
    assert len(said) == 1 and str(out / RECORD_FILE) in said[0]


# -- a record's row, as the background thread makes it (PointMaker.step_row) ---------------------------

OFFSET = 1_764_547_836_000_000_000


def maker() -> PointMaker:
    guard = Guard()
    return PointMaker(guard, Mfu(guard, None, None, None), CudaDevice(guard))


def odd_record(rng: random.Random, i: int) -> StepRecord:
    """A step as integrations hand them over: mostly plain, now and then with a value of another type."""
    t0 = 1_000_000_000 + i * 1_100_000
    phases = tuple(x for n in rng.choice([(), ("forward", "backward", "optimizer"), ("forward", "forward"), ("data_copy",)]) for x in (n, rng.randrange(1, 10**6)))  # fmt: skip
    rec = StepRecord(
        rng.choice([i, i, float(i), 2**64]), t0, t0 + rng.choice([1_050_000, 0]), rng.choice([None, 3000]),
        rng.choice([None, 0, 32, Fraction(32), True, -4, 2.5]), rng.choice([None, 0, 65536, 2**70]), phases, None,
        rng.choice([None, (1, 2, 3, 4)]), rng.choice([None, 500]), rng.choice([None, 700]),
    )  # fmt: skip
    logs = rng.choice([None, {"loss": 0.5}, {"loss": 1, "lr": 1e-4}, {"loss": float("nan")}, {"x": "text"}])
    rec.logs = dict(logs) if logs else None
    return rec


def test_every_value_of_a_row_is_a_finite_number_of_the_kind_its_shape_says_whatever_the_record_held() -> None:
    rng = random.Random(7)
    pm = maker()
    for i in range(2000):
        rec = odd_record(rng, i)
        shape, row = pm.step_row(rec, OFFSET, None)
        assert len(row) == len(shape.names) + 1 and row[-1] == rec.t1_ns + OFFSET  # the timestamp last
        for name, kind, value in zip(shape.names, shape.kinds, row, strict=False):
            assert type(value) is (float if kind == KIND_FLOAT else int), (name, value)
            assert value - value == 0, (name, value)  # finite
        assert len(set(shape.names)) == len(shape.names)
    assert pm.guard.counts["not_an_integer"] > 0 and pm.guard.counts["nonfinite_value"] > 0


def layout_record(rng: random.Random, i: int) -> StepRecord:
    """A step of one of a few layouts (phases, logs, counts, memory, communication), now and then
    with a value that needs converting or leaving out, or a name over the run's budget."""
    rec = odd_record(rng, i) if rng.random() < 0.2 else plain(i, rng.choice([(), ("forward",), ("forward", "backward", "optimizer"), ("forward", "forward"), ("data copy", "data_copy")]))  # fmt: skip
    if rng.random() < 0.3:
        rec.memory, rec.comm_ns, rec.inflight_ns = (1, 2, 3, 4), rng.choice([None, 700]), rng.choice([None, 9])
    if rng.random() < 0.1:
        rec.t1_ns = rec.t0_ns  # no duration: no rates
    if rng.random() < 0.4:  # samples or tokens only
        rec.samples, rec.tokens = rng.choice([(None, rec.tokens), (rec.samples, None)])
    if rng.random() < 0.2:
        rec.logs = {
            **(rec.logs or {}),
            rng.choice(["lr", "grad norm", "grad_norm", f"over_{i % 7}"]): rng.choice([1e-4, 2.0]),
        }
    return rec


def test_a_step_s_row_is_the_one_its_fields_make_name_by_name_whichever_layouts_came_before() -> None:
    """``queued_row`` takes the shape of a layout it has seen from a cache; what it returns, and what
    it reports, is what ``step_row`` makes of the same steps name by name."""
    rng = random.Random(11)
    recs = [layout_record(rng, i) for i in range(3000)]
    cached, by_name = maker(), maker()
    for pm in (cached, by_name):  # the run's budget of open names all but used: over_* names are left out
        pm._names.update(f"log_taken_{n}" for n in range(MAX_OPEN_FIELDS_PER_RUN - 4))
    for i, rec in enumerate(recs):
        if i == len(recs) // 3:  # FLOPs per token known: tflops join the rows of steps with tokens
            cached.mfu.fixed = by_name.mfu.fixed = 6e9
        if i == 2 * len(recs) // 3:  # the GPU's peak found: mfu joins them too
            cached.mfu.peak = by_name.mfu.peak = 1e15
        got, want = cached.queued_row(as_queued(rec), OFFSET), by_name.step_row(rec, OFFSET, None)
        assert got[0].names == want[0].names and got[0].kinds == want[0].kinds
        assert got[1] == want[1] and list(map(type, got[1])) == list(map(type, want[1]))
    assert cached.guard.counts == by_name.guard.counts and cached.guard.counts["too_many_open_fields"] > 100
    assert len(cached._layouts) > 10  # most steps took a cached shape


def test_a_plain_step_s_row_holds_its_times_counts_rates_and_phases_in_order() -> None:
    rec = StepRecord(5, 5 * 10**6, 5 * 10**6 + 900_000, 3000, 32, 65536, ("forward", 1234))
    shape, row = maker().step_row(rec, OFFSET, None)
    assert shape.names == ("step", "start_time_ns", "end_time_ns", "step_time_s", "data_wait_s", "forward_s",
                           "samples", "samples_per_s", "tokens", "tokens_per_s")  # fmt: skip
    assert row == (5, 5 * 10**6 + OFFSET, 5 * 10**6 + 900_000 + OFFSET, 900_000, 3000, 1234,
                   32, 32 / 0.0009, 65536, 65536 / 0.0009, 5 * 10**6 + 900_000 + OFFSET)  # fmt: skip


def test_gpu_times_and_mfu_join_the_row_when_known() -> None:
    pm = maker()
    rec = StepRecord(1, 0, 10**6, None, 32, 65536, ())
    shape, row = pm.step_row(rec, OFFSET, {"forward": 0.25})
    assert row[shape.pos["forward_gpu_s"]] == 250_000_000
    pm.mfu.fixed = 6e9  # FLOPs per token known: tflops (and mfu) join the row
    shape, row = pm.step_row(StepRecord(2, 0, 10**6, None, 32, 65536, ()), OFFSET, None)
    assert "tflops" in shape.names and row[shape.pos["tflops"]] == pytest.approx(6e9 * 65536 / 1e-3 / 1e12)


def plain(i: int, phases: tuple[str, ...] = ("forward", "backward", "optimizer")) -> StepRecord:
    """A step as a plain loop makes them: int counts, a float loss."""
    t0 = 10**9 + i * 1_100_000
    rec = StepRecord(i, t0, t0 + 1_050_000, 2500 + i, 32, 65536,
                     tuple(x for n, p in zip(phases, range(len(phases)), strict=True) for x in (n, 1000 * i + p)))  # fmt: skip
    rec.logs = {"loss": 0.5 + i}
    return rec


def as_queued(rec: StepRecord) -> QueuedStep:
    """``rec`` as the training thread queues a step: its fields but the logs, and its logs."""
    fields = (rec.step, rec.t0_ns, rec.t1_ns, rec.wait_ns, rec.samples, rec.tokens, rec.phases, rec.gpu_pairs,
              rec.memory, rec.comm_ns, rec.inflight_ns)  # fmt: skip
    return fields, rec.logs


class _Client:
    """What the worker hands the client, in order: ("rows", first step, last step, names) or ("point", kind)."""

    def __init__(self) -> None:
        self.got: list[tuple[Any, ...]] = []

    def submit_rows(self, batch: StepRows, now: float) -> None:
        self.got.append(("rows", batch.rows[0][0], batch.rows[-1][0], batch.shape.names))

    def submit(self, point: Point) -> None:
        self.got.append(("point", point.fields["kind"]))


def worker_of(steps: StepRecorder) -> Worker:
    guard = steps.guard
    pm = PointMaker(guard, Mfu(guard, None, None, None), steps.cuda)
    return Worker(steps, _Client(), pm, ReportBuffer(100), {"run": "r"}, guard, 1.0)  # type: ignore[arg-type]


def test_the_worker_hands_steps_and_points_over_in_the_queue_s_order_a_shape_at_a_time() -> None:
    steps = StepRecorder(Guard())
    worker = worker_of(steps)
    point = Point("train_event", 1, {}, {"kind": "a"})
    steps.queue.extend([*map(as_queued, [plain(1), plain(2), plain(3)]), point,
                        *map(as_queued, [plain(4), plain(5, ("forward",)), plain(6, ("forward",)), plain(7), plain(8)])])  # fmt: skip
    assert worker._drain(final=False) is False
    pm = worker.points
    long_, short = pm.step_row(plain(1), 0, None)[0].names, pm.step_row(plain(5, ("forward",)), 0, None)[0].names
    assert worker.client.got == [("rows", 1, 3, long_), ("point", "a"), ("rows", 4, 4, long_), ("rows", 5, 6, short),
                                 ("rows", 7, 8, long_)]  # fmt: skip
    assert worker.steps_sent == 8 and worker.report._seen == 8


def test_a_slice_is_at_most_slice_records(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpulse.training.worker as worker_module

    monkeypatch.setattr(worker_module, "SLICE", 5)
    steps = StepRecorder(Guard())
    worker = worker_of(steps)
    steps.queue.extend(as_queued(plain(i)) for i in range(1, 13))
    assert worker._drain(final=False) is True and len(steps.queue) == 7
    assert worker._drain(final=False) is True and len(steps.queue) == 2
    assert worker._drain(final=False) is False and worker.steps_sent == 12
