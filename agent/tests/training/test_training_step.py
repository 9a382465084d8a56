"""The training thread's step recorder: what ``run.step()``, ``run.phase()``, ``wrap_loader`` and
``run.log()`` make of a step, before the background thread sees it (``gpulse.training.step``)."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulse.training import Run
from gpulse.training.errors import Guard
from gpulse.training.step import Phase, StepRecord, StepRecorder, timed_iter


def recorder(max_queue: int = 1000) -> StepRecorder:
    return StepRecorder(Guard(), max_queue)


def last(steps: StepRecorder) -> StepRecord:
    """The finished step still open for ``run.log()``, as its record will read (logs not yet attached)."""
    assert steps.last is not None
    return StepRecord(*steps.last)


def queued(steps: StepRecorder) -> list[StepRecord]:
    """The steps handed over to the worker, as the worker reads them."""
    return [StepRecord.queued(item) for item in steps.queue]


def test_a_phase_inside_a_step_adds_its_name_and_duration() -> None:
    steps = recorder()
    phase = Phase(steps, "forward")
    steps.in_step = True
    with phase as entered:
        time.sleep(0.002)
    assert entered is phase
    assert steps.phase_times[0] == "forward"
    assert 2_000_000 <= steps.phase_times[1] < 1_000_000_000 and len(steps.phase_times) == 2


def test_a_phase_outside_a_step_adds_nothing() -> None:
    steps = recorder()
    with Phase(steps, "forward"):
        pass
    assert steps.phase_times == ()


def test_a_phase_run_twice_in_a_step_appears_twice_in_order() -> None:
    steps = recorder()
    fwd, bwd = Phase(steps, "forward"), Phase(steps, "backward")
    steps.in_step = True
    for ph in (fwd, bwd, fwd):
        with ph:
            pass
    assert steps.phase_times[::2] == ("forward", "backward", "forward")
    assert all(isinstance(ns, int) and ns >= 0 for ns in steps.phase_times[1::2])


def test_an_exception_in_a_phase_goes_on_to_the_loop_with_the_phase_timed() -> None:
    steps = recorder()
    steps.in_step = True
    with pytest.raises(KeyError), Phase(steps, "forward"):
        raise KeyError("boom")
    assert steps.phase_times[0] == "forward"


def test_the_timed_loader_adds_each_wait_and_yields_every_batch_in_order() -> None:
    def slow() -> Iterator[int]:
        for i in range(3):
            time.sleep(0.002)
            yield i

    steps = recorder()
    assert list(timed_iter(steps, slow())) == [0, 1, 2]
    assert 6_000_000 <= steps.wait_ns < 1_000_000_000
    steps.wait_ns = 0
    assert list(timed_iter(steps, [])) == []
    assert steps.wait_ns == 0


def test_the_loader_s_own_error_goes_on_to_the_loop() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise OSError("disk gone")

    it = timed_iter(recorder(), broken())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)


def test_a_step_becomes_a_record_of_its_counts_times_phases_and_data_wait() -> None:
    steps = recorder()
    steps.wait_known, steps.wait_ns = True, 5_000
    with steps.prepare(samples=32, tokens=64) as entered:
        assert entered is steps and steps.in_step
        with steps.phase("forward"):
            time.sleep(0.002)
    rec = last(steps)
    assert (rec.step, rec.samples, rec.tokens, rec.wait_ns, rec.logs) == (1, 32, 64, 5_000, None)
    assert rec.phases[0] == "forward" and 2_000_000 <= rec.phases[1] <= rec.t1_ns - rec.t0_ns
    assert (rec.gpu_pairs, rec.memory, rec.comm_ns, rec.inflight_ns) == (None, None, None, None)
    assert not steps.in_step and steps.wait_ns == 0 and steps.phase_times == () and not steps.queue


def test_a_step_without_phases_or_a_timed_loader_has_neither() -> None:
    steps = recorder()
    with steps.prepare():
        pass
    assert (last(steps).phases, last(steps).wait_ns, last(steps).samples) == ((), None, None)


def test_the_next_step_hands_the_last_one_over_with_what_was_logged_after_it() -> None:
    steps = recorder()
    with steps.prepare():
        pass
    steps.log(loss=1.5)
    steps.log(acc=0.5, loss=1.25)  # a later value of the same name wins
    with steps.prepare():
        pass
    (first,) = queued(steps)
    assert first.step == 1 and first.logs == {"loss": 1.25, "acc": 0.5}
    assert last(steps).step == 2 and not steps.logs
    steps.prepare()  # what finish() does
    assert [r.step for r in queued(steps)] == [1, 2] and queued(steps)[1].logs is None
    steps.prepare()  # nothing left: nothing happens
    assert len(steps.queue) == 2


def test_steps_count_on_from_a_number_given_and_keep_one_they_cannot_count_from() -> None:
    """A given step number is kept as given (the worker checks it); counting goes on from an int64."""
    steps = recorder()
    for given in (None, 10, None, 2.5, None, 2**64, None):
        with steps.prepare(step=given):
            pass
    steps.prepare()
    assert [r.step for r in queued(steps)] == [1, 10, 11, 2.5, 13, 2**64, 15]


def test_a_step_that_raises_is_forgotten_and_the_exception_goes_on_to_the_loop() -> None:
    steps = recorder()
    heard: list[type] = []
    steps.on_error = lambda et, ev: heard.append(et)
    with pytest.raises(ValueError, match="bad batch"), steps.prepare(samples=1):
        with steps.phase("forward"):
            raise ValueError("bad batch")
    assert heard == [ValueError] and steps.last is None and not steps.in_step and steps.phase_times == ()
    with steps.prepare():
        pass
    assert (last(steps).step, last(steps).phases) == (1, ())


def test_beyond_max_queue_steps_are_counted_not_kept_and_reported_once() -> None:
    steps = recorder(max_queue=2)
    for _ in range(5):
        with steps.prepare():
            pass
    steps.prepare()
    assert [r.step for r in queued(steps)] == [1, 2] and steps.not_kept == 3
    assert steps.guard.counts["queue_full"] == 1


def test_what_integrations_add_runs_only_once_they_added_something() -> None:
    class Counting(StepRecorder):
        closings = 0

        def _closing(self) -> None:
            Counting.closings += 1
            super()._closing()

    steps = Counting(Guard(), 10)
    with steps.prepare():
        pass
    assert Counting.closings == 0  # a plain step checks one flag, nothing more
    heard: list[str] = []
    steps.on_step_end(lambda: heard.append("hook"))
    steps.add_comm(7)
    with steps.prepare():
        pass
    assert Counting.closings == 1 and heard == ["hook"] and last(steps).comm_ns == 7


def test_cuda_is_looked_for_at_the_start_at_step_16_then_at_doubling_intervals() -> None:
    seen: list[int] = []

    class Counting(StepRecorder):
        def check_cuda(self) -> None:
            seen.append(self.step_no)
            super().check_cuda()

    steps = Counting(Guard(), 10_000)
    for _ in range(3000):
        with steps.prepare():
            pass
    assert seen == [0, 16, 32, 64, 128, 256, 512, 1024, 2048]


def test_step_and_log_take_what_the_run_s_methods_take() -> None:
    steps = recorder()
    assert steps.prepare(32, 64, 7) is steps
    assert (steps.step_samples, steps.step_tokens, steps.step_number) == (32, 64, 7)
    for bad in (lambda: steps.log(0.5), lambda: steps.prepare(sample=3), lambda: steps.prepare(1, 2, 3, 4),
                lambda: steps.prepare(1, samples=2)):  # fmt: skip
        with pytest.raises(TypeError):
            bad()
    assert (steps.step_samples, steps.step_tokens, steps.step_number) == (32, 64, 7)


def test_a_record_holds_what_it_was_made_with_and_takes_what_integrations_add() -> None:
    rec = StepRecord(3, 10, 20, None, 32, None, ("forward", 5))
    assert (rec.step, rec.t0_ns, rec.t1_ns, rec.wait_ns, rec.samples, rec.tokens, rec.phases) == (
        3, 10, 20, None, 32, None, ("forward", 5),
    )  # fmt: skip
    assert (rec.gpu_pairs, rec.memory, rec.comm_ns, rec.inflight_ns, rec.logs) == (None, None, None, None, None)
    rec.logs, rec.comm_ns, rec.gpu_pairs = {"loss": 1.0}, 4, [("forward", 1, 2)]
    assert (rec.logs, rec.comm_ns, rec.gpu_pairs) == ({"loss": 1.0}, 4, [("forward", 1, 2)])
    assert StepRecord(1, 0, 1, 0, 1, 1, (), None, None, None, 9).inflight_ns == 9
    queued_step = ((1, 0, 1, None, None, None, (), None, (1, 2, 3, 4), None, None), {"loss": 0.5})
    assert (StepRecord.queued(queued_step).memory, StepRecord.queued(queued_step).logs) == ((1, 2, 3, 4), {"loss": 0.5})
    with pytest.raises(AttributeError):
        rec.other = 1  # type: ignore[attr-defined]  # slotted: a misspelt field is an error, not a new one


def test_a_recorder_its_phases_and_its_loader_are_freed_by_the_garbage_collector() -> None:
    """The recorder holds its phases and each phase holds the recorder: a cycle the collector frees."""
    steps = recorder()
    steps.phase("forward")
    it = timed_iter(steps, [1, 2])
    next(it)  # a running generator holds the recorder
    steps.step_end_hooks.append(it.__next__)  # and the recorder holds it: a cycle through the iterator too
    gone = weakref.ref(steps)
    del steps, it
    gc.collect()
    assert gone() is None


def test_a_recorder_whose_queued_step_logged_the_recorder_itself_is_freed() -> None:
    """A cycle through a record (its logs) and the recorder (its queue)."""
    steps = recorder()
    with steps.prepare():
        pass
    steps.log(me=steps)
    with steps.prepare():
        pass
    assert queued(steps)[0].logs["me"] is steps
    gone = weakref.ref(steps)
    del steps
    gc.collect()
    assert gone() is None


def test_the_run_s_step_and_log_are_the_recorder_s_and_its_methods_do_the_same(tmp_path: Path) -> None:
    """``Run.__init__`` binds ``run.step`` and ``run.log`` to the recorder's methods (one call per
    step, not two); ``Run.step`` and ``Run.log``, which keep the docstrings, do the same."""
    run = Run(name="bound", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    assert run.step == run.steps.prepare and run.log == run.steps.log
    assert Run.step(run, 8, 16) is run.steps and (run.steps.step_samples, run.steps.step_tokens) == (8, 16)
    Run.log(run, loss=2.0)
    run.log(lr=0.1)
    assert run.steps.logs == {"loss": 2.0, "lr": 0.1}
    run.finish()
