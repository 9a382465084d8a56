"""Step-row plans: the common step takes one compiled function, and it never disagrees with the general path."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import pytest

from gpulse.training.cuda import CudaDevice
from gpulse.training.errors import Guard
from gpulse.training.mfu import Mfu
from gpulse.training.points import PointMaker
from gpulse.training.step import RECORD_FIELDS, StepRecord

OFFSET = 1_764_547_836_000_000_000


def maker() -> PointMaker:
    guard = Guard()
    return PointMaker(guard, Mfu(guard, None, None, None), CudaDevice(guard))


def record(rng: random.Random, i: int) -> StepRecord:
    """A step as integrations hand them over: mostly plain, now and then with a value of another type."""
    t0 = 1_000_000_000 + i * 1_100_000
    phases = tuple(x for n in rng.choice([(), ("forward", "backward", "optimizer"), ("forward", "forward"), ("data_copy",)]) for x in (n, rng.randrange(1, 10**6)))  # fmt: skip
    samples = rng.choice([None, 0, 32, 32, 32, Fraction(32), True, -4])
    tokens = rng.choice([None, 0, 65536, 65536, 2**70])
    rec = StepRecord(
        rng.choice([i, i, i, float(i), 2**64]), t0, t0 + rng.choice([1_050_000, 1_050_000, 0]),
        rng.choice([None, 3000, 3000]), samples, tokens, phases, None,
        rng.choice([None, (1, 2, 3, 4)]), rng.choice([None, None, 500]), rng.choice([None, 700]),
    )  # fmt: skip
    logs = rng.choice([None, {"loss": 0.5}, {"loss": 0.5}, {"loss": 1, "lr": 1e-4}, {"lr": 1e-4, "loss": 0.25}, {"loss": float("nan")}])  # fmt: skip
    rec.logs = dict(logs) if logs else None
    return rec


def test_every_step_gets_the_row_of_the_general_path_whatever_it_holds() -> None:
    rng = random.Random(7)
    fast, general = maker(), maker()
    for i in range(3000):
        rec = record(rng, i)
        assert same(fast.step_row(rec, OFFSET, None)) == same(general.general_row(rec, OFFSET, None)), vars_of(rec)
    assert fast._plans and any(p is not None for p in fast._plans.values())  # plans were made and used
    assert any(p is None for p in fast._plans.values())  # and refused where they would not give the same row


def test_a_run_of_alike_steps_takes_the_plan_and_not_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    pm = maker()
    calls = 0
    general = pm.general_row

    def counted(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return general(*args)

    monkeypatch.setattr(pm, "general_row", counted)
    rng = random.Random(1)
    recs = [StepRecord(i, i * 10**6, i * 10**6 + 900_000, 3000, 32, 65536, ("forward", rng.randrange(10**6)), None, None, None) for i in range(100)]  # fmt: skip
    rows = [pm.step_row(r, OFFSET, None) for r in recs]
    assert calls == 1  # the first step, whose row the plan had to match before it was used
    assert rows[5][1] == (5, 5 * 10**6 + OFFSET, 5 * 10**6 + 900_000 + OFFSET, 900_000, 3000, recs[5].phases[1],
                          32, 32 / 0.0009, 65536, 65536 / 0.0009, 5 * 10**6 + 900_000 + OFFSET)  # fmt: skip
    assert rows[5][0].names == ("step", "start_time_ns", "end_time_ns", "step_time_s", "data_wait_s", "forward_s",
                                "samples", "samples_per_s", "tokens", "tokens_per_s")  # fmt: skip


def test_steps_with_gpu_times_or_mfu_take_the_general_path() -> None:
    pm = maker()
    rec = StepRecord(1, 0, 10**6, None, 32, 65536, (), None, None, None)
    shape, row = pm.step_row(rec, OFFSET, {"forward": 0.25})
    assert row[shape.pos["forward_gpu_s"]] == 250_000_000 and not pm._plans  # no plan was even looked for
    pm.mfu.fixed = 6e9  # FLOPs per token known: tflops (and mfu) join the row
    shape, row = pm.step_row(StepRecord(2, 0, 10**6, None, 32, 65536, (), None, None, None), OFFSET, None)
    assert "tflops" in shape.names and row[shape.pos["tflops"]] == pytest.approx(6e9 * 65536 / 1e-3 / 1e12)


def same(shaped: tuple[Any, tuple[Any, ...]]) -> tuple[Any, ...]:
    """A shape and row as what they say: names, kinds, values and the values' types."""
    shape, row = shaped
    return shape.names, shape.kinds, row, tuple(map(type, row))


def vars_of(rec: StepRecord) -> dict[str, Any]:
    return {k: getattr(rec, k) for k in RECORD_FIELDS}
