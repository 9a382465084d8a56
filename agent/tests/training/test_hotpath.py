"""The training thread's hot path, in C and in Python: one specification, run against both.

``gpulse.training._hotpath`` (C, built by ``agent/setup.py``) and its Python references in
``gpulse.training.step`` (``PyStepBase``, ``PyStepRecord``, ``PyPhaseBase``, ``py_timed_iter``) must
behave alike: a machine without a C compiler runs the Python ones, and every other test runs the C
ones (the default where built). Each implementation's recorder is :class:`Recorder` over its own
step base, as ``StepRecorder`` is over the C one.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time
import weakref
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from training_support import compiled

from gpulse.training import Run, step
from gpulse.training.errors import Guard
from gpulse.training.step import (
    RECORD_FIELDS,
    PyPhaseBase,
    PyStepBase,
    PyStepRecord,
    Recorder,
    StepRecorder,
    py_timed_iter,
)


class HotPath(NamedTuple):
    phase_base: type
    timed_iter: Callable[[Any, Iterable[Any]], Iterator[Any]]
    recorder: type  # Recorder over this implementation's step base
    record: type

    def steps(self, max_queue: int = 1000) -> Any:
        return self.recorder(Guard(), max_queue)


class PyRecorder(Recorder, PyStepBase):
    """The recorder of a machine without the C module."""


def _compiled() -> Any:
    return compiled("_hotpath")


@pytest.fixture(params=["c", "python"])
def impl(request: pytest.FixtureRequest) -> HotPath:
    if request.param == "python":
        return HotPath(PyPhaseBase, py_timed_iter, PyRecorder, PyStepRecord)
    hot = _compiled()
    return HotPath(hot.PhaseBase, hot.TimedIter, StepRecorder, hot.StepRecord)


def test_the_compiled_hot_path_is_built_and_used() -> None:
    """Installing gpulse builds it (``pip install -e agent``, which ``make venv`` runs); where it was
    not built, this says what to do, rather than every benchmark silently measuring the Python one."""
    hot = _compiled()
    assert step.PhaseBase is hot.PhaseBase
    assert step.TimedIter is hot.TimedIter
    assert step.StepBase is hot.StepBase and issubclass(StepRecorder, hot.StepBase)
    assert step.StepRecord is hot.StepRecord


def test_a_phase_inside_a_step_adds_its_name_and_duration(impl: HotPath) -> None:
    steps = impl.steps()
    phase = impl.phase_base(steps, "forward")
    steps.in_step = True
    with phase as entered:
        time.sleep(0.002)
    assert entered is phase
    assert steps.phase_times[0] == "forward"
    assert 2_000_000 <= steps.phase_times[1] < 1_000_000_000
    assert phase.t0 == 0  # closed: a second __exit__ adds nothing
    phase.__exit__(None, None, None)
    assert len(steps.phase_times) == 2


def test_a_phase_outside_a_step_adds_nothing(impl: HotPath) -> None:
    steps = impl.steps()
    with impl.phase_base(steps, "forward"):
        pass
    assert steps.phase_times == []


def test_a_phase_run_twice_in_a_step_appears_twice_in_order(impl: HotPath) -> None:
    steps = impl.steps()
    fwd, bwd = impl.phase_base(steps, "forward"), impl.phase_base(steps, "backward")
    steps.in_step = True
    for ph in (fwd, bwd, fwd):
        with ph:
            pass
    assert steps.phase_times[::2] == ["forward", "backward", "forward"]
    assert all(isinstance(ns, int) and ns >= 0 for ns in steps.phase_times[1::2])


def test_an_exception_in_a_phase_goes_on_to_the_loop_with_the_phase_timed(impl: HotPath) -> None:
    steps = impl.steps()
    steps.in_step = True
    with pytest.raises(KeyError), impl.phase_base(steps, "forward"):
        raise KeyError("boom")
    assert steps.phase_times[0] == "forward"


def test_a_subclass_can_take_over_a_phase_in_place(impl: HotPath) -> None:
    """What ``StepRecorder._use_cuda`` does when CUDA appears: the same objects, a class that also
    records events; ``abort`` writes ``t0`` and ``ev0`` from Python."""

    class Plain(impl.phase_base):  # type: ignore[misc,name-defined]
        __slots__ = ()

    class Other(Plain):
        __slots__ = ()

        def __enter__(self) -> Other:
            self.ev0 = "event"
            return self

    steps = impl.steps()
    ph = Plain(steps, "forward")
    ph.__class__ = Other
    steps.in_step = True
    with ph:
        pass
    assert (ph.ev0, ph.name, ph.steps) == ("event", "forward", steps)
    ph.t0, ph.ev0 = 0, None
    assert (ph.t0, ph.ev0) == (0, None)


def test_the_timed_loader_adds_each_wait_and_yields_every_batch_in_order(impl: HotPath) -> None:
    def slow() -> Iterator[int]:
        for i in range(3):
            time.sleep(0.002)
            yield i

    steps = impl.steps()
    assert list(impl.timed_iter(steps, slow())) == [0, 1, 2]
    assert 6_000_000 <= steps.wait_ns < 1_000_000_000
    steps.wait_ns = 0
    assert list(impl.timed_iter(steps, [])) == []
    assert steps.wait_ns == 0


def test_the_loader_s_own_error_goes_on_to_the_loop(impl: HotPath) -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise OSError("disk gone")

    it = impl.timed_iter(impl.steps(), broken())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)


def test_a_recorder_and_its_phases_are_freed_by_the_garbage_collector(impl: HotPath) -> None:
    """The recorder holds its phases and each phase holds the recorder: the collector must see the
    phase's references (the C type's traverse) to free the cycle."""
    steps = impl.steps()
    steps.phases["forward"] = impl.phase_base(steps, "forward")
    it = impl.timed_iter(steps, [1, 2])
    steps.loader_iter = it  # a cycle through the iterator too
    gone = weakref.ref(steps)
    del steps, it
    gc.collect()
    assert gone() is None


# -- the step recorder: StepBase and StepRecord ------------------------------------------------------


def test_a_step_becomes_a_record_of_its_counts_times_phases_and_data_wait(impl: HotPath) -> None:
    steps = impl.steps()
    steps.wait_known, steps.wait_ns = True, 5_000
    with steps.prepare(samples=32, tokens=64) as entered:
        assert entered is steps and steps.in_step
        with impl.phase_base(steps, "forward"):
            time.sleep(0.002)
    rec = steps.last
    assert type(rec) is impl.record
    assert (rec.step, rec.samples, rec.tokens, rec.wait_ns, rec.logs) == (1, 32, 64, 5_000, None)
    assert rec.phases[0] == "forward" and 2_000_000 <= rec.phases[1] <= rec.t1_ns - rec.t0_ns
    assert (rec.gpu_pairs, rec.memory, rec.comm_ns, rec.inflight_ns) == (None, None, None, None)
    assert not steps.in_step and steps.wait_ns == 0 and steps.phase_times == [] and not steps.queue


def test_a_step_without_phases_or_a_timed_loader_has_neither(impl: HotPath) -> None:
    steps = impl.steps()
    with steps.prepare():
        pass
    assert (steps.last.phases, steps.last.wait_ns, steps.last.samples) == ((), None, None)


def test_the_next_step_hands_the_last_one_over_with_what_was_logged_after_it(impl: HotPath) -> None:
    steps = impl.steps()
    with steps.prepare():
        pass
    steps.log(loss=1.5)
    steps.log(acc=0.5, loss=1.25)  # a later value of the same name wins
    with steps.prepare():
        pass
    (first,) = steps.queue
    assert first.step == 1 and first.logs == {"loss": 1.25, "acc": 0.5}
    assert steps.last.step == 2 and steps.last.logs is None and not steps.logs
    steps.hand_over()  # what finish() does
    assert [r.step for r in steps.queue] == [1, 2] and steps.queue[1].logs is None
    steps.hand_over()  # nothing left: nothing happens
    assert len(steps.queue) == 2


def test_steps_count_on_from_a_number_given_and_keep_one_they_cannot_count_from(impl: HotPath) -> None:
    """A given step number is kept as given (the worker checks it); counting goes on from an int64."""
    steps = impl.steps()
    for given in (None, 10, None, 2.5, None, 2**64, None):
        with steps.prepare(step=given):
            pass
        steps.hand_over()
    assert [r.step for r in steps.queue] == [1, 10, 11, 2.5, 13, 2**64, 15]


def test_a_step_that_raises_is_forgotten_and_the_exception_goes_on_to_the_loop(impl: HotPath) -> None:
    steps = impl.steps()
    heard: list[type] = []
    steps.on_error = lambda et, ev: heard.append(et)
    with pytest.raises(ValueError, match="bad batch"), steps.prepare(samples=1):
        with impl.phase_base(steps, "forward"):
            raise ValueError("bad batch")
    assert heard == [ValueError] and steps.last is None and not steps.in_step and steps.phase_times == []
    with steps.prepare():
        pass
    assert (steps.last.step, steps.last.phases) == (1, ())


def test_beyond_max_queue_steps_are_counted_not_kept_and_reported_once(impl: HotPath) -> None:
    steps = impl.steps(max_queue=2)
    for _ in range(5):
        with steps.prepare():
            pass
    steps.hand_over()
    assert [r.step for r in steps.queue] == [1, 2] and steps.not_kept == 3
    assert steps.guard.counts["queue_full"] == 1


def test_what_integrations_add_runs_only_once_they_added_something(impl: HotPath) -> None:
    class Counting(impl.recorder):  # type: ignore[misc,name-defined]
        closings = 0

        def _closing(self) -> None:
            Counting.closings += 1
            super()._closing()

    steps = Counting(Guard(), 10)
    with steps.prepare():
        pass
    assert Counting.closings == 0  # a plain step never leaves the step base
    heard: list[str] = []
    steps.on_step_end(lambda: heard.append("hook"))
    steps.add_comm(7)
    with steps.prepare():
        pass
    assert Counting.closings == 1 and heard == ["hook"] and steps.last.comm_ns == 7


def test_cuda_is_looked_for_at_the_start_at_step_16_then_at_doubling_intervals(impl: HotPath) -> None:
    seen: list[int] = []

    class Counting(impl.recorder):  # type: ignore[misc,name-defined]
        def check_cuda(self) -> None:
            seen.append(self.step_no)
            super().check_cuda()

    steps = Counting(Guard(), 10_000)
    for _ in range(3000):
        with steps.prepare():
            pass
    assert seen == [0, 16, 32, 64, 128, 256, 512, 1024, 2048]


def test_step_and_log_take_what_the_run_s_methods_take(impl: HotPath) -> None:
    steps = impl.steps()
    assert steps.prepare(32, 64, 7) is steps
    assert (steps.step_samples, steps.step_tokens, steps.step_number) == (32, 64, 7)
    for bad in (lambda: steps.log(0.5), lambda: steps.prepare(sample=3), lambda: steps.prepare(1, 2, 3, 4),
                lambda: steps.prepare(1, samples=2)):  # fmt: skip
        with pytest.raises(TypeError):
            bad()
    assert (steps.step_samples, steps.step_tokens, steps.step_number) == (32, 64, 7)


def test_a_record_is_made_and_changed_alike_by_both(impl: HotPath) -> None:
    rec = impl.record(3, 10, 20, None, 32, None, ("forward", 5), None, None, None)
    assert {k: getattr(rec, k) for k in RECORD_FIELDS} == {
        "step": 3, "t0_ns": 10, "t1_ns": 20, "wait_ns": None, "samples": 32, "tokens": None,
        "phases": ("forward", 5), "gpu_pairs": None, "memory": None, "comm_ns": None, "inflight_ns": None,
        "logs": None,
    }  # fmt: skip
    rec.logs, rec.comm_ns, rec.gpu_pairs = {"loss": 1.0}, 4, [("forward", 1, 2)]
    assert (rec.logs, rec.comm_ns, rec.gpu_pairs) == ({"loss": 1.0}, 4, [("forward", 1, 2)])
    assert impl.record(1, 0, 1, 0, 1, 1, (), None, None, None, 9).inflight_ns == 9


def test_a_plain_step_s_record_is_left_to_refcounting_and_one_that_can_be_in_a_cycle_is_tracked() -> None:
    """The C recorder untracks a record (and its phases) that refers to no tracked object, as CPython
    untracks tuples and dicts of plain values: the queue's records are then neither traversed by each
    collection nor promoted to the oldest generation (whose growth brings on full collections). The
    Python reference cannot untrack; its records are always tracked."""
    steps = StepRecorder(Guard())
    for logged in ({"loss": 0.5}, {"me": steps}):
        with steps.prepare(samples=32):
            with steps.phase("forward"):
                pass
        steps.log(**logged)
    with steps.prepare():  # hands the second over
        pass
    plain, cyclic = steps.queue
    assert not gc.is_tracked(plain) and not gc.is_tracked(plain.phases) and plain.logs == {"loss": 0.5}
    assert gc.is_tracked(cyclic)  # its logs hold the recorder: it stays visible to the collector
    plain.gpu_pairs = [("forward", object(), object())]
    assert gc.is_tracked(plain)  # given a tracked value: tracked again
    plain.gpu_pairs = None
    assert gc.is_tracked(plain)  # and stays so (CPython never untracks on assignment either)


def test_a_recorder_whose_queued_step_logged_the_recorder_itself_is_freed(impl: HotPath) -> None:
    """A cycle through a record (its logs) and the recorder (its queue): both types' traverse."""
    steps = impl.steps()
    with steps.prepare():
        pass
    steps.log(me=steps)
    with steps.prepare():
        pass
    assert steps.queue[0].logs["me"] is steps
    gone = weakref.ref(steps)
    del steps
    gc.collect()
    assert gone() is None


def test_the_run_s_step_and_log_are_the_recorder_s_and_its_methods_do_the_same(tmp_path: Path) -> None:
    """``Run.__init__`` binds ``run.step`` and ``run.log`` to the recorder's methods (C: no frame per
    step); ``Run.step`` and ``Run.log``, which keep the docstrings, do the same."""
    run = Run(name="bound", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    assert run.step == run.steps.prepare and run.log == run.steps.log
    assert Run.step(run, 8, 16) is run.steps and (run.steps.step_samples, run.steps.step_tokens) == (8, 16)
    Run.log(run, loss=2.0)
    run.log(lr=0.1)
    assert run.steps.logs == {"loss": 2.0, "lr": 0.1}
    run.finish()


AGENT = Path(__file__).resolve().parents[2]

WITHOUT_COMPILER_RUN = """
import os, sys, tempfile
from gpulse.training import Run, plans, step
assert step.__file__.startswith(sys.argv[1]), step.__file__
assert step.PhaseBase is step.PyPhaseBase and step.TimedIter is step.py_timed_iter
assert step.StepBase is step.PyStepBase and step.StepRecord is step.PyStepRecord
assert plans.RowPlan is plans.PyRowPlan
with tempfile.TemporaryDirectory() as tmp:
    run = Run(name="nocc", output_dir=tmp, socket_path=os.path.join(tmp, "none", "a.sock"), write_report=False)
    for batch in run.wrap_loader(range(3)):
        with run.step(samples=1):
            with run.phase("forward"):
                pass
    print(run.steps.last.phases[0], run.steps.last.wait_ns is not None)
    run.finish()
    print(run.worker.steps_sent, type(run.worker.points._plan[0]).__name__)
"""


def test_without_a_c_compiler_gpulse_installs_and_runs_on_the_python_hot_path(tmp_path: Path) -> None:
    """``optional=True`` in ``agent/setup.py``: a failed build of the C modules is a warning, and the
    installed gpulse uses the Python references (``CC=/bin/false`` stands in for a machine without a
    compiler; the build runs on a copy of the package, not in the checkout)."""
    src = tmp_path / "agent"
    shutil.copytree(AGENT / "src", src / "src", ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(AGENT / name, src / name)
    env = {**os.environ, "CC": "/bin/false", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "whl"), str(src)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    for module in ("_hotpath", "_rows"):
        assert f'building extension "gpulse.training.{module}" failed' in built.stdout + built.stderr
    (wheel,) = (tmp_path / "whl").glob("gpulse-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpulse/training/step.py" in names
    assert not [n for n in names if "_hotpath" in n or "_rows" in n or n.endswith(".h")]  # no module, no C source
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    ran = subprocess.run(
        [sys.executable, "-c", WITHOUT_COMPILER_RUN, str(site)],
        env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["forward", "True", "3", "PyRowPlan"]  # every step, the Python plan's rows
