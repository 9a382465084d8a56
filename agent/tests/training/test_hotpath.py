"""The training thread's hot path, in C and in Python: one specification, run against both.

``gpulse.training._hotpath`` (C, built by ``agent/setup.py``) and its Python references in
``gpulse.training.step`` (``PyPhaseBase``, ``py_timed_iter``) must behave alike: a machine without a
C compiler runs the Python ones, and every other test runs the C ones (the default where built).
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

from gpulse.training import step
from gpulse.training.errors import Guard
from gpulse.training.step import PyPhaseBase, StepRecorder, py_timed_iter


class HotPath(NamedTuple):
    phase_base: type
    timed_iter: Callable[[Any, Iterable[Any]], Iterator[Any]]


NOT_BUILT = "gpulse.training._hotpath is not built ({}): install a C compiler and run `make venv` again"


def _compiled() -> Any:
    try:
        from gpulse.training import _hotpath
    except ImportError as exc:  # the message is the point: say what to do
        pytest.fail(NOT_BUILT.format(exc))
    return _hotpath


@pytest.fixture(params=["c", "python"])
def impl(request: pytest.FixtureRequest) -> HotPath:
    if request.param == "python":
        return HotPath(PyPhaseBase, py_timed_iter)
    hot = _compiled()
    return HotPath(hot.PhaseBase, hot.TimedIter)


def test_the_compiled_hot_path_is_built_and_used() -> None:
    """Installing gpulse builds it (``pip install -e agent``, which ``make venv`` runs); where it was
    not built, this says what to do, rather than every benchmark silently measuring the Python one."""
    hot = _compiled()
    assert step.PhaseBase is hot.PhaseBase
    assert step.TimedIter is hot.TimedIter


def _recorder() -> StepRecorder:
    return StepRecorder(Guard())


def test_a_phase_inside_a_step_adds_its_name_and_duration(impl: HotPath) -> None:
    steps = _recorder()
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
    steps = _recorder()
    with impl.phase_base(steps, "forward"):
        pass
    assert steps.phase_times == []


def test_a_phase_run_twice_in_a_step_appears_twice_in_order(impl: HotPath) -> None:
    steps = _recorder()
    fwd, bwd = impl.phase_base(steps, "forward"), impl.phase_base(steps, "backward")
    steps.in_step = True
    for ph in (fwd, bwd, fwd):
        with ph:
            pass
    assert steps.phase_times[::2] == ["forward", "backward", "forward"]
    assert all(isinstance(ns, int) and ns >= 0 for ns in steps.phase_times[1::2])


def test_an_exception_in_a_phase_goes_on_to_the_loop_with_the_phase_timed(impl: HotPath) -> None:
    steps = _recorder()
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

    steps = _recorder()
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

    steps = _recorder()
    assert list(impl.timed_iter(steps, slow())) == [0, 1, 2]
    assert 6_000_000 <= steps.wait_ns < 1_000_000_000
    steps.wait_ns = 0
    assert list(impl.timed_iter(steps, [])) == []
    assert steps.wait_ns == 0


def test_the_loader_s_own_error_goes_on_to_the_loop(impl: HotPath) -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise OSError("disk gone")

    it = impl.timed_iter(_recorder(), broken())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)


def test_a_recorder_and_its_phases_are_freed_by_the_garbage_collector(impl: HotPath) -> None:
    """The recorder holds its phases and each phase holds the recorder: the collector must see the
    phase's references (the C type's traverse) to free the cycle."""
    steps = _recorder()
    steps.phases["forward"] = impl.phase_base(steps, "forward")
    it = impl.timed_iter(steps, [1, 2])
    steps.loader_iter = it  # a cycle through the iterator too
    gone = weakref.ref(steps)
    del steps, it
    gc.collect()
    assert gone() is None


AGENT = Path(__file__).resolve().parents[2]

WITHOUT_COMPILER_RUN = """
import os, sys, tempfile
from gpulse.training import Run, step
assert step.__file__.startswith(sys.argv[1]), step.__file__
assert step.PhaseBase is step.PyPhaseBase and step.TimedIter is step.py_timed_iter
with tempfile.TemporaryDirectory() as tmp:
    run = Run(name="nocc", output_dir=tmp, socket_path=os.path.join(tmp, "none", "a.sock"), write_report=False)
    for batch in run.wrap_loader(range(3)):
        with run.step(samples=1):
            with run.phase("forward"):
                pass
    print(run.steps.last.phases[0], run.steps.last.wait_ns is not None)
    run.finish()
"""


def test_without_a_c_compiler_gpulse_installs_and_runs_on_the_python_hot_path(tmp_path: Path) -> None:
    """``optional=True`` in ``agent/setup.py``: a failed build of the C module is a warning, and the
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
    assert 'building extension "gpulse.training._hotpath" failed' in built.stdout + built.stderr
    (wheel,) = (tmp_path / "whl").glob("gpulse-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpulse/training/step.py" in names
    assert not [n for n in names if "_hotpath" in n]  # neither the module nor its C source
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    ran = subprocess.run(
        [sys.executable, "-c", WITHOUT_COMPILER_RUN, str(site)],
        env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["forward", "True"]
