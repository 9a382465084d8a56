"""Step-row plans: the common step takes one plan, and it never disagrees with the general path.

Every test runs against both plans: the C one (``gpulse.training._rows.RowPlan``, built by
``agent/setup.py``) and its Python reference (``plans.PyRowPlan``), which a machine without a C
compiler uses.
"""

from __future__ import annotations

import gc
import random
import subprocess
import sys
from collections import deque
from fractions import Fraction
from typing import Any

import pytest
from training_support import compiled

from gpulse.channel.protocol import Point, StepRows
from gpulse.training import plans
from gpulse.training.cuda import CudaDevice
from gpulse.training.errors import Guard
from gpulse.training.mfu import Mfu
from gpulse.training.points import PointMaker
from gpulse.training.report import ReportBuffer
from gpulse.training.step import RECORD_FIELDS, StepRecord, StepRecorder
from gpulse.training.worker import Worker

OFFSET = 1_764_547_836_000_000_000


def _compiled() -> type:
    return compiled("_rows").RowPlan  # type: ignore[no-any-return]


@pytest.fixture(autouse=True, params=["c", "python"])
def row_plan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type:
    """The plan implementation every point maker of the test uses."""
    impl = plans.PyRowPlan if request.param == "python" else _compiled()
    monkeypatch.setattr(plans, "RowPlan", impl)
    return impl


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


def test_the_c_plan_is_built_and_used_where_gpulse_is_installed() -> None:
    _compiled()
    used = subprocess.run(
        [sys.executable, "-c", "from gpulse.training import plans; print(plans.RowPlan.__module__)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert used.stdout.strip() == "gpulse.training._rows"  # the module's own choice, without this file's fixture


def plain(i: int, phases: tuple[str, ...] = ("forward", "backward", "optimizer"), **logs: Any) -> StepRecord:
    """A step as a plain loop makes them: int counts, a float loss."""
    t0 = 10**9 + i * 1_100_000
    rec = StepRecord(i, t0, t0 + 1_050_000, 2500 + i, 32, 65536,
                     tuple(x for n, p in zip(phases, range(len(phases)), strict=True) for x in (n, 1000 * i + p)),
                     None, None, None)  # fmt: skip
    rec.logs = dict(logs or {"loss": 0.5 + i})
    return rec


def test_take_gives_the_rows_step_row_gives_and_stops_at_the_first_step_it_does_not_fit(row_plan: type) -> None:
    pm, general = maker(), maker()
    pm.step_row(plain(0), OFFSET, None)  # the plan of this layout, made and checked
    odd = plain(7, ("forward",))  # another layout
    queue: deque[Any] = deque([*(plain(i) for i in range(1, 7)), odd, plain(8)])
    shape, rows = pm.take(queue, 100, OFFSET)
    assert [same((shape, r)) for r in rows] == [same(general.general_row(plain(i), OFFSET, None)) for i in range(1, 7)]
    assert queue[0] is odd and len(queue) == 2  # left where it was, for the general path
    assert pm.take(queue, 100, OFFSET) is None
    if row_plan is not plans.PyRowPlan:  # rows of numbers, which no collection need traverse (Python's wait for one)
        assert not any(gc.is_tracked(r) for r in rows)


def test_take_takes_at_most_n_and_leaves_points_and_steps_waiting_for_gpu_events() -> None:
    pm = maker()
    pm.step_row(plain(0), OFFSET, None)
    gpu = plain(3)
    gpu.gpu_pairs = [("forward", object(), object())]
    point = Point("train_event", 1, {}, {"kind": "x"})
    queue: deque[Any] = deque([plain(1), plain(2), gpu, plain(4), point, plain(5)])
    assert len(pm.take(queue, 1, OFFSET)[1]) == 1 and len(queue) == 5
    assert len(pm.take(queue, 9, OFFSET)[1]) == 1 and queue[0] is gpu
    queue.popleft()
    assert len(pm.take(queue, 9, OFFSET)[1]) == 1 and queue[0] is point
    assert pm.take(queue, 0, OFFSET) is None  # nothing asked for, nothing taken


def test_an_error_inside_the_plan_stops_take_and_leaves_the_step_at_the_head() -> None:
    """What raises inside a plan (here the run's MFU state) is the general path's to meet and report:
    take neither raises nor loses the step."""

    class FlakyMfu:
        model = None
        reads = 0

        @property
        def fixed(self) -> None:
            self.reads += 1
            if self.reads == 3:
                raise RuntimeError("read failed")
            return None

    mfu = FlakyMfu()
    plan = plans.RowPlan(plans.Layout.of(plain(0)), mfu)
    queue: deque[Any] = deque(plain(i) for i in range(1, 6))
    third = queue[2]
    assert [r[0] for r in plan.take(queue, 9, OFFSET)] == [1, 2]
    assert queue[0] is third and len(queue) == 3
    assert [r[0] for r in plan.take(queue, 9, OFFSET)] == [3, 4, 5]  # read again: it fits now


class _Client:
    """What the worker hands the client, in order: ("rows", first step, last step) or ("point", kind)."""

    def __init__(self) -> None:
        self.got: list[tuple[Any, ...]] = []

    def submit_rows(self, batch: StepRows, now: float) -> None:
        self.got.append(("rows", batch.rows[0][0], batch.rows[-1][0], batch.shape.names))

    def submit(self, point: Point) -> None:
        self.got.append(("point", point.fields["kind"]))


def test_the_worker_hands_steps_and_points_over_in_the_queue_s_order_a_shape_at_a_time() -> None:
    guard = Guard()
    steps = StepRecorder(guard)
    client = _Client()
    pm = PointMaker(guard, Mfu(guard, None, None, None), steps.cuda)
    worker = Worker(steps, client, pm, ReportBuffer(100), {"run": "r"}, guard, 1.0)  # type: ignore[arg-type]
    q = steps.queue
    q.extend([plain(1), plain(2), plain(3), Point("train_event", 1, {}, {"kind": "a"}), plain(4), plain(5, ("forward",)),
              plain(6, ("forward",)), plain(7), plain(8)])  # fmt: skip
    assert worker._drain(final=False) is False
    long_, short = pm.general_row(plain(1), 0, None)[0].names, pm.general_row(plain(5, ("forward",)), 0, None)[0].names
    assert client.got == [("rows", 1, 3, long_), ("point", "a"), ("rows", 4, 4, long_), ("rows", 5, 6, short),
                          ("rows", 7, 8, long_)]  # fmt: skip
    assert worker.steps_sent == 8 and worker.report._seen == 8


def test_a_slice_is_at_most_slice_records_whichever_way_they_are_made(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpulse.training.worker as worker_module

    monkeypatch.setattr(worker_module, "SLICE", 5)
    guard = Guard()
    steps = StepRecorder(guard)
    pm = PointMaker(guard, Mfu(guard, None, None, None), steps.cuda)
    worker = Worker(steps, _Client(), pm, ReportBuffer(100), {"run": "r"}, guard, 1.0)  # type: ignore[arg-type]
    steps.queue.extend(plain(i) for i in range(1, 13))
    assert worker._drain(final=False) is True and len(steps.queue) == 7  # one by step_row, then four by take
    assert worker._drain(final=False) is True and len(steps.queue) == 2
    assert worker._drain(final=False) is False and worker.steps_sent == 12


def test_the_c_plan_and_the_python_plan_give_the_same_row_or_the_c_one_leaves_it_to_the_general_path() -> None:
    """The C plan is stricter in a few cases (documented in _rows.c), never different; plain steps it takes."""
    rng = random.Random(11)
    c_plan = _compiled()
    mfu = Mfu(Guard(), None, None, None)
    took = 0
    for i in range(3000):
        rec = record(rng, i)
        try:
            layout = plans.Layout.of(rec)
        except Exception:
            continue
        py = plans.PyRowPlan(layout, mfu)
        try:
            expected = py(rec, OFFSET)
        except Exception:
            expected = "raised"
        got = c_plan(layout, mfu)(rec, OFFSET)
        if got is not None:
            took += 1
            assert expected != "raised" and (got, tuple(map(type, got))) == (expected, tuple(map(type, expected))), (
                vars_of(rec)
            )
    assert took > 500  # the plain ones, which are most of them
    for i in range(1, 50):
        rec = plain(i)
        assert c_plan(plans.Layout.of(rec), mfu)(rec, OFFSET) == plans.PyRowPlan(plans.Layout.of(rec), mfu)(rec, OFFSET)


def same(shaped: tuple[Any, tuple[Any, ...]]) -> tuple[Any, ...]:
    """A shape and row as what they say: names, kinds, values and the values' types."""
    shape, row = shaped
    return shape.names, shape.kinds, row, tuple(map(type, row))


def vars_of(rec: StepRecord) -> dict[str, Any]:
    return {k: getattr(rec, k) for k in RECORD_FIELDS}
