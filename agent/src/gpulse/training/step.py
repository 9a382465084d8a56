"""The training thread's part of a run: a few timestamps per step and one :class:`StepRecord` handed over.

Everything here runs inside the user's training loop, so it only takes ``perf_counter_ns``
timestamps, records pooled CUDA events (:mod:`gpulse.training.cuda`) and reads allocator counters;
it never waits for the GPU, never formats, never sends. A finished step becomes a tuple of
:class:`StepRecord`'s fields, in their order (a tuple is built without a Python call, where an
object's ``__init__`` would be a good part of what a step costs here: ``bench/bench_step.py``); it
stays open for ``run.log()`` until the next step begins (or the run finishes) and is then appended,
with its logs, to the queue the background worker (:mod:`gpulse.training.worker`) drains, which
makes it a :class:`StepRecord`.
The queue holds at most ``max_queue`` records: beyond that, steps are not kept and are counted
(``not_kept``), which ``finish()`` reports.

These are slotted classes with hand-written ``__init__`` (not dataclasses: importing
``dataclasses`` would double the cost of ``import gpulse.training``).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import Any

from gpulse.channel.protocol import Point
from gpulse.lineprotocol.limits import INT64_MAX, INT64_MIN
from gpulse.training.cuda import CudaDevice
from gpulse.training.errors import Guard

#: Steps waiting for the background worker at most; more are not kept (counted, reported at finish).
MAX_QUEUE = 100_000

#: A GPU phase timing: (phase name, start event, end event), read once both events completed.
GpuPair = tuple[str, Any, Any]


class StepRecord:
    """One finished step as the worker reads it (times in ``perf_counter_ns``), made by
    :meth:`queued` from what the training thread queued.

    ``phases`` is flat, ``(name, ns, name, ns, ...)``, a pair per time a phase ran (a phase entered
    twice appears twice; the worker adds them up); ``gpu_pairs`` ... ``inflight_ns`` are what
    integrations and CUDA add, ``None`` in a plain step; ``logs`` is what ``run.log()`` gave for
    this step, ``None`` if nothing."""

    __slots__ = ("comm_ns", "gpu_pairs", "inflight_ns", "logs", "memory", "phases", "samples", "step", "t0_ns", "t1_ns", "tokens", "wait_ns")  # fmt: skip

    def __init__(
        self,
        step: int,
        t0_ns: int,
        t1_ns: int,
        wait_ns: int | None,
        samples: int | None,
        tokens: int | None,
        phases: tuple[str | int, ...],
        gpu_pairs: list[GpuPair] | None = None,
        memory: tuple[int, int, int, int] | None = None,
        comm_ns: int | None = None,
        inflight_ns: int | None = None,
        logs: dict[str, Any] | None = None,
    ) -> None:
        self.step = step
        self.t0_ns = t0_ns
        self.t1_ns = t1_ns
        self.wait_ns = wait_ns
        self.samples = samples
        self.tokens = tokens
        self.phases = phases
        self.gpu_pairs = gpu_pairs
        self.memory = memory
        self.comm_ns = comm_ns
        self.inflight_ns = inflight_ns
        self.logs = logs

    @classmethod
    def queued(cls, item: QueuedStep) -> StepRecord:
        """The record of a step as :meth:`StepRecorder.prepare` queued it."""
        fields, logs = item
        return cls(*fields, logs)


#: A finished step on the training thread: :class:`StepRecord`'s fields but ``logs``, in its order.
StepFields = tuple[Any, ...]
#: A step in the queue: its fields and its logs (``None`` if nothing was logged).
QueuedStep = tuple[StepFields, dict[str, Any] | None]
#: What the worker's queue carries: steps, and points made elsewhere (run start, events).
QueueItem = QueuedStep | Point


class Phase:
    """A reusable context manager for one phase name (no allocation per use but the time entry).

    Two timestamps per use; the time goes to the step recorder's ``phase_times`` if a step is open
    when the phase ends. This class times on the CPU only. Once
    the run uses CUDA, every phase becomes a :class:`GpuPhase` (``StepRecorder._use_cuda`` swaps the
    class), which also records events; so a run on the CPU never pays for looking for them."""

    __slots__ = ("ev0", "name", "steps", "t0")

    def __init__(self, steps: StepRecorder, name: str) -> None:
        self.steps = steps
        self.name = name
        self.t0 = 0
        self.ev0: Any = None

    def __enter__(self) -> Phase:
        self.t0 = perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        steps = self.steps
        if steps.in_step:
            steps.phase_times += (self.name, perf_counter_ns() - self.t0)


class GpuPhase(Phase):
    """A phase of a run that uses CUDA: also a pair of pooled events around it (GPU time)."""

    __slots__ = ()

    def __enter__(self) -> Phase:
        steps = self.steps
        if steps.in_step and steps.timer is not None:
            self.ev0 = steps.record_event()
        self.t0 = perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        super().__exit__(et, ev, tb)
        if self.ev0 is not None:  # kept as the step's GPU time, or given back to the pool
            start, self.ev0 = self.ev0, None
            self.steps.end_gpu_phase(self.name, start)


def timed_iter(steps: StepRecorder, loader: Iterable[Any]) -> Iterator[Any]:
    """``iter(loader)``, the wait for each batch (from the loop asking to its arrival) added to
    ``steps.wait_ns``; the loader's own errors go on to the loop."""
    clock = perf_counter_ns
    t0 = clock()
    for batch in loader:
        steps.wait_ns += clock() - t0
        yield batch
        t0 = clock()


class TimedLoader:
    """``run.wrap_loader(loader)``: iterates the loader, adding each ``next()`` wait to the step."""

    def __init__(self, steps: StepRecorder, loader: Iterable[Any]) -> None:
        self.steps = steps
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        self.steps.wait_known = True  # never reset: from now on every step has its data wait
        return timed_iter(self.steps, self.loader)


class PhaseTable(dict[str, Phase]):
    """The run's phases by the name the user gave; a new name makes its :class:`Phase` (``__missing__``),
    so that ``run.phase(name)``, called for every phase of every step, is one dict lookup."""

    __slots__ = ("steps",)

    def __init__(self, steps: StepRecorder) -> None:
        super().__init__()
        self.steps = steps

    def __missing__(self, name: str) -> Phase:
        ph = self[name] = (Phase if self.steps.timer is None else GpuPhase)(self.steps, phase_name(name))
        return ph


class StepRecorder:
    """The state of the step in progress, on the training thread; finished steps go to ``queue``.

    It is also the context manager ``run.step()`` returns: ``prepare`` is ``run.step(...)``, ``log``
    is ``run.log(...)``, ``__enter__`` and ``__exit__`` begin and end a step. What only integrations
    and CUDA runs need (``_closing``, ``_extras``) runs only once ``extras``
    is set, so that a plain step checks one flag for all of it. ``begin()`` / ``end()`` do what
    ``with`` does, for integrations that cannot use it. Never raises into the loop: what fails is
    counted by ``guard`` and switched off."""

    def __init__(self, guard: Guard, max_queue: int = MAX_QUEUE) -> None:
        self.guard = guard
        self.queue: deque[QueueItem] = deque()
        #: the finished step, open for ``run.log()`` until the next step begins (or the run finishes)
        self.last: StepFields | None = None
        #: what ``run.log()`` gave since the last hand-over (the first call's own dict)
        self.logs: dict[str, Any] = {}
        #: the counts of the step being run, as ``run.step()`` or ``end()`` gave them
        self.step_samples: int | None = None
        self.step_tokens: int | None = None
        self.step_number: int | None = None
        #: this step's phases so far, flat (:class:`StepRecord`), taken by the step's record at its end
        self.phase_times: tuple[str | int, ...] = ()
        self.t0 = 0
        self.step_no = 0
        self.wait_ns = 0
        self._next_cuda_check = 0
        self.max_queue = max_queue
        #: steps the queue could not take (the worker fell behind by more than ``max_queue``)
        self.not_kept = 0
        self.in_step = False
        self.wait_known = False
        #: whether steps have more than times, counts and logs: set for good once an integration or
        #: CUDA adds to them (hooks, ``enter_phase``, communication, memory, GPU events)
        self.extras = False
        self.comm_ns = 0
        self.comm_known = False
        self.inflight_ns = 0
        self.inflight_known = False
        #: hears of a step that raised: ``on_error(exc_type, exc)``
        self.on_error: Callable[[type, BaseException | None], None] | None = None
        self.phases = PhaseTable(self)
        self.open_phase: Phase | None = None
        self.pairs: list[GpuPair] | None = None
        self.step_end_hooks: list[Callable[[], None]] = []
        self.cuda = CudaDevice(guard)
        #: the CUDA event pool and allocator probe, once CUDA is in use (copied from ``cuda`` for speed)
        self.timer: Any = None
        self._memory: Any = None

    @property
    def memory(self) -> Any:
        """The allocator probe read at every step's end, or ``None``."""
        return self._memory

    @memory.setter
    def memory(self, probe: Any) -> None:
        self._memory = probe
        if probe is not None:
            self.extras = True  # read by _extras, which plain steps skip

    # -- the hot path: run.step(), with, run.log() -------------------------------------------------
    def prepare(self, samples: int | None = None, tokens: int | None = None, step: int | None = None) -> StepRecorder:
        """``run.step(...)``: queue the finished step with its logs (``run.log()`` now writes for the
        next one) and keep the counts the next step ends with. ``finish()`` calls it with none."""
        rec = self.last
        if rec is not None:
            self.last = None
            logs: dict[str, Any] | None = self.logs
            if logs:
                self.logs = {}
                if self.timer is not None:
                    self.cuda.copy_logs(logs)  # start copying its CUDA scalars
            else:
                logs = None
            if len(self.queue) < self.max_queue:
                self.queue.append((rec, logs))
            else:
                self._not_kept()
        self.step_samples = samples
        self.step_tokens = tokens
        self.step_number = step
        return self

    def log(self, **scalars: Any) -> None:
        if self.logs:
            self.logs.update(scalars)
        else:  # the step's first log: its own dict becomes the step's (nothing copied)
            self.logs = scalars

    def __enter__(self) -> StepRecorder:
        if self.step_no >= self._next_cuda_check:
            self.check_cuda()
        if self.extras and self.timer is not None:
            self.pairs = []  # this step's GPU phase events
        self.in_step = True
        self.t0 = perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        """End the step with the counts in ``step_samples``, ``step_tokens``, ``step_number``; a step
        that raised is forgotten and the exception goes on to the loop."""
        t1 = perf_counter_ns()
        if et is not None:
            self.abort()
            if self.on_error is not None:
                self.on_error(et, ev)
            return
        if not self.in_step:
            return
        if self.extras:
            self._closing()
        self.in_step = False
        step = self.step_number
        if step is None:
            self.step_no = step = self.step_no + 1
        else:  # the record keeps what it was given (the worker checks it); step_no follows an int64
            self.step_no = step if isinstance(step, int) and INT64_MIN <= step <= INT64_MAX else self.step_no + 1
        phases = self.phase_times
        self.phase_times = ()
        wait = None
        if self.wait_known:
            wait = self.wait_ns
            self.wait_ns = 0
        if self.extras:
            self.last = (step, self.t0, t1, wait, self.step_samples, self.step_tokens, phases, *self._extras())
        else:  # StepRecord's fields in its order
            self.last = (step, self.t0, t1, wait, self.step_samples, self.step_tokens, phases, None, None, None, None)

    def _not_kept(self) -> None:
        """A step the queue could not take (the worker is more than ``max_queue`` behind)."""
        self.not_kept += 1
        if self.not_kept == 1:
            # logged once, counted here: the Guard's lock, taken per step, would make the training
            # thread wait for the worker whenever the worker holds it
            self.guard.report("queue_full", detail=f"more than {self.max_queue} steps waiting; steps not kept")

    # -- steps for integrations that cannot use ``with`` -------------------------------------------
    def begin(self, idle_since_ns: int = 0) -> None:
        """Start a step; ``idle_since_ns`` (``perf_counter_ns``) starts the data wait before it."""
        if idle_since_ns:
            self.add_data_wait(perf_counter_ns() - idle_since_ns)
        self.prepare()
        self.__enter__()

    def end(self, samples: int | None = None, tokens: int | None = None, step: int | None = None) -> None:
        """End the step; ``step`` defaults to the previous step + 1."""
        self.prepare(samples, tokens, step)
        self.__exit__(None, None, None)

    # -- what runs once ``extras`` is set ------------------------------------------------------------
    def _closing(self) -> None:
        """Before a step's record is made: close the phase ``enter_phase`` opened, run the step-end hooks."""
        if self.open_phase is not None:
            self.exit_phase()
        for hook in self.step_end_hooks:
            try:
                hook()
            except Exception as exc:
                self.guard.report("step_end_hook", exc)

    def _extras(self) -> tuple[list[GpuPair] | None, tuple[int, int, int, int] | None, int | None, int | None]:
        """What integrations add to a step's record: GPU phase events, memory, communication."""
        comm = inflight = memory = None
        if self.comm_known:
            comm = self.comm_ns
            self.comm_ns = 0
        if self.inflight_known:
            inflight = self.inflight_ns
            self.inflight_ns = 0
        if self.memory is not None:
            try:
                memory = self.memory.read()
            except Exception as exc:
                self.memory = None
                self.guard.report("memory_stats", exc)
        pairs = self.pairs
        self.pairs = None
        return pairs, memory, comm, inflight

    def add_point(self, point: Point) -> None:
        """Queue a point made on the training thread (an event), bounded like steps."""
        if len(self.queue) >= self.max_queue:
            self.guard.report("queue_full", detail=f"more than {self.max_queue} steps waiting; event not kept")
            return
        self.queue.append(point)

    def abort(self) -> None:
        """The step raised: forget it (its phases and events); the exception goes on to the loop."""
        self.in_step = False
        self.open_phase = None
        for p in self.phases.values():
            p.t0 = 0
            if p.ev0 is not None:
                self.cuda.release(p.ev0)
            p.ev0 = None
        self.phase_times = ()
        if self.pairs:
            self.cuda.drop(self.pairs)
        self.pairs = None

    # -- phases -----------------------------------------------------------------------------------
    def phase(self, name: str) -> Phase:
        return self.phases[name]

    def enter_phase(self, name: str) -> None:
        """Close the open phase (if any) and open ``name``: for callbacks that only see boundaries."""
        self.extras = True
        if self.open_phase is not None:
            self.open_phase.__exit__(None, None, None)
        ph = self.phase(name)
        ph.__enter__()
        self.open_phase = ph

    def exit_phase(self) -> None:
        ph = self.open_phase
        if ph is not None:
            self.open_phase = None
            ph.__exit__(None, None, None)

    def record_event(self) -> Any:
        """A CUDA event recorded now, or ``None`` (pool used up; on an error GPU times are switched off)."""
        try:
            return self.timer.record()
        except Exception as exc:
            self.timer = None
            self.guard.report("cuda_event", exc, "GPU phase times disabled")
            return None

    def end_gpu_phase(self, name: str, start: Any) -> None:
        end = self.record_event()
        if end is None or self.pairs is None:
            self.cuda.release(start, end)
            return
        self.pairs.append((name, start, end))

    # -- what integrations add --------------------------------------------------------------------
    def add_data_wait(self, ns: int) -> None:
        """Data wait before the step; a wait inside an open step (a batch fetched between two of its
        micro-batches) also moves the step's start, so that it is counted once, as data wait."""
        self.wait_ns += ns
        self.wait_known = True
        if self.in_step:
            self.t0 += ns

    def add_comm(self, ns: int) -> None:
        """Exposed communication: time the training thread waited for it (``comm_s``)."""
        self.comm_ns += ns
        self.comm_known = self.extras = True

    def add_comm_in_flight(self, ns: int) -> None:
        """Time any collective was in flight or waited for (``comm_in_flight_s``)."""
        self.inflight_ns += ns
        self.inflight_known = self.extras = True

    def on_step_end(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` at the end of every step, before the record is made (comm hooks fold their time in)."""
        self.step_end_hooks.append(hook)
        self.extras = True

    # -- CUDA -------------------------------------------------------------------------------------
    def check_cuda(self) -> None:
        """Use CUDA once this process has initialised it: checked at the start, at step 16, then at
        intervals doubling up to every 1,024 steps (steps 32, 64, ..., 1024, 2048, 3072, ...).

        Scripts initialise CUDA before or within their first steps, found by step 16; a check is a
        few cold interpreter frames (``torch.cuda.is_initialized()``), too many to pay every step."""
        self._next_cuda_check = self.step_no + min(max(16, self.step_no), 1024)
        if self.cuda.device is not None or self.cuda.detect():
            self._use_cuda()

    def _use_cuda(self) -> None:
        self.timer = self.cuda.timer
        self.memory = self.cuda.memory
        self.extras = True
        self._next_cuda_check = 1 << 62
        if self.timer is not None:
            for ph in self.phases.values():
                ph.__class__ = GpuPhase  # the phases made so far record events too (the class's docstring)


def phase_name(name: str) -> str:
    """A phase name as a field name part: lower case, ``[a-z0-9_]``, at most 48 characters."""
    clean = re.sub(r"[^a-z0-9_]", "_", str(name).lower())[:48]  # a pattern string: compiled on first use
    return clean or "unnamed"
