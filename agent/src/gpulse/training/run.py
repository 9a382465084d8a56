"""``Run``: the public API of ``gpulse.training`` (``docs/training.md``); the work is done elsewhere.

* :mod:`~gpulse.training.step`: the training thread's hot path (timestamps and counts), one
  step (:class:`~gpulse.training.step.StepRecord`'s fields) per step into a bounded queue;
* :mod:`~gpulse.training.worker`: the background thread, from records to points
  (:mod:`~gpulse.training.points`, :mod:`~gpulse.training.mfu`), to the agent or the recording
  file (:mod:`~gpulse.training.client`);
* :mod:`~gpulse.training.cuda`: the CUDA device, found without initialising CUDA;
* :mod:`~gpulse.training.identity`: rank, run id and tags;
* :mod:`~gpulse.training.report`: ``metrics_report.json`` at ``finish()``, and the summary rank 0
  prints on stderr (``quiet=True`` silences it).

Nothing here raises into the training loop: failures are counted and logged once per cause
(:class:`~gpulse.training.errors.Guard`).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gpulse.channel.protocol import Point
from gpulse.training.errors import LOGGER_NAME, Guard
from gpulse.training.mfu import Mfu
from gpulse.training.step import MAX_QUEUE, StepRecorder, TimedLoader

if TYPE_CHECKING:
    from gpulse.training.profiling import ProfileWindow
    from gpulse.training.worker import Worker

MAX_TEXT = 4096

_uncaught: list[type] = []  # set by our excepthook: tells the atexit finish that the script failed
_hook_installed = False


class Run:
    """One training run as seen by one rank. See ``docs/training.md``.

    ::

        run = Run(name="exp1", tags={"model": "qwen2.5-7b"}, output_dir="out")
        for batch in run.wrap_loader(loader):
            with run.step(samples=32, tokens=32 * 2048):
                with run.phase("forward"): ...
            run.log(loss=loss_value)
        run.finish()
    """

    def __init__(
        self,
        name: str | None = None,
        tags: Mapping[str, Any] | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        *,
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        model: Any = None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        dtype: Any = "bf16",
        socket_path: str | None = None,
        ack_timeout: float = 10.0,
        gpu_timing: bool = True,
        track_memory: bool = True,
        write_report: bool = True,
        quiet: bool = False,
        max_report_steps: int = 10_000,
        gather_timeout_s: float = 30.0,
        max_queue: int = MAX_QUEUE,
        max_unacked: int = 10_000,
        max_unacked_bytes: int = 8 << 20,
        tick_s: float = 1.0,
        profile: bool = True,
    ) -> None:
        self.guard = Guard()
        self._pid = os.getpid()
        self._finished = False
        self._finish_ns = 0
        self._finish_lock = threading.Lock()
        # the hot path first, so that every method is a safe no-op even if the setup below fails
        self.steps = StepRecorder(self.guard, max_queue)
        self.steps.cuda.gpu_timing = gpu_timing
        self.steps.cuda.track_memory = track_memory
        self.steps.on_error = self._step_failed
        # run.step(), run.phase(name) and run.log() are called for every step: the recorder's own
        # methods and the phase table's lookup stand in for the methods below (one call, not two),
        # which keep the docstrings and do the same
        self.step = self.steps.prepare  # type: ignore[method-assign]
        self.phase = self.steps.phases.__getitem__  # type: ignore[method-assign]
        self.log = self.steps.log  # type: ignore[method-assign]
        self._enabled = False
        self.name = name or "run"
        self.run_id = ""
        self.rank = 0
        self.tags: dict[str, str] = {}
        self.config = dict(config or {})
        self.output_dir = os.fspath(output_dir) if output_dir is not None else os.getcwd()
        self.worker: Worker | None = None
        self.world_size = 1
        #: communication timing (:mod:`gpulse.training.comm`), in a distributed run or after ``attach_ddp``
        self.comm_timer: Any = None
        self.gather_timeout_s = gather_timeout_s
        self._exchange: Any = None
        #: no summary on stderr at ``finish()`` (rank 0 prints one otherwise)
        self.quiet = quiet
        self.mfu = Mfu(self.guard, flops_per_token, peak_flops, dtype)
        #: the automatic profiler window (:mod:`gpulse.training.profiling`), asked for by findings
        self.profile_window: ProfileWindow | None = None
        self._profile = profile
        try:
            self._setup(tags, run_id, model, socket_path, ack_timeout, write_report, max_report_steps,
                        max_unacked, max_unacked_bytes, tick_s)  # fmt: skip
            self._enabled = True
        except Exception as exc:
            self.guard.report("setup", exc, "gpulse is disabled for this run; training is unaffected")

    def _setup(
        self, tags, run_id, model, socket_path, ack_timeout, write_report, max_report_steps, max_unacked,
        max_unacked_bytes, tick_s,
    ) -> None:  # fmt: skip
        # imported here, not at the top: ``import gpulse.training`` stays as cheap as it can be
        from gpulse.channel.protocol import RECORD_FILE, client_socket_path
        from gpulse.channel.trust import SOCKET_GROUP_ENV
        from gpulse.training.client import Client
        from gpulse.training.identity import dist_identity, resolve_run_id, run_tags
        from gpulse.training.points import PointMaker, run_fields
        from gpulse.training.report import ReportBuffer
        from gpulse.training.worker import Worker

        self.rank, self.local_rank, self.world_size = dist_identity()
        self.run_id = resolve_run_id(run_id, self.name, self.rank, self.world_size, self.guard)
        self.tags = run_tags(tags, self.run_id, self.rank, self.local_rank, self.world_size, self.guard)
        self._write_report = write_report
        self.report = ReportBuffer(max_report_steps)
        if model is not None:
            self.mfu.watch_model(model)
        self.client = Client(
            socket_path or client_socket_path(),
            os.path.join(self.output_dir, RECORD_FILE),
            ack_timeout=ack_timeout,
            max_unacked=max_unacked,
            max_unacked_bytes=max_unacked_bytes,
            guard=self.guard,
            socket_group=os.environ.get(SOCKET_GROUP_ENV) or None,
        )
        self._start_ns = time.time_ns()
        self.steps.add_point(
            Point(
                "train_run",
                self._start_ns,
                self.tags,
                run_fields("start", "running", self.name, self.config, self._pid),
            )
        )
        self.steps.check_cuda()
        points = PointMaker(self.guard, self.mfu, self.steps.cuda)
        self.worker = Worker(self.steps, self.client, points, self.report, self.tags, self.guard, tick_s)
        self.worker.start(self._pid)
        from gpulse.training.profiling import ProfileWindow, profiling_enabled

        self.profile_window = ProfileWindow(
            self.steps,
            self.guard,
            self.output_dir,
            self.rank,
            enabled=profiling_enabled(self._profile),
            mark=self._mark_profile,
        )
        # a finding the node's agent raised (and so held for a whole window) asks for one window
        self.worker.request_profile = self.profile_window.request
        if self.world_size > 1:
            self._distributed(model)
        _install_excepthook()
        atexit.register(self._atexit)

    def _distributed(self, model: Any) -> None:
        """A rank of a distributed run: time its communication without user code, and announce it to
        rank 0, which gathers every rank's points for the report at ``finish()``."""
        from gpulse.training.comm import auto_attach

        auto_attach(self, model)
        if self._write_report:
            self._join_exchange(announce=True)

    def _join_exchange(self, announce: bool) -> Any:
        """The store through which rank 0 gathers the ranks' points, when the process group exists."""
        if self._exchange is None:
            from gpulse.training.gather import RankExchange
            from gpulse.training.identity import initialized_dist

            dist = initialized_dist()
            if dist is None:
                return None
            try:
                self._exchange = RankExchange.capture(dist, self.run_id, self.rank, self.world_size)
                if announce:
                    self._exchange.announce()
            except Exception as exc:
                self._exchange = None
                self.guard.report("gather", exc, "metrics_report.json will cover rank 0 only")
        return self._exchange

    # -- the hot path -----------------------------------------------------------------------------
    def step(self, samples: int | None = None, tokens: int | None = None, step: int | None = None) -> StepRecorder:
        """Context manager around one optimizer step; ``step`` defaults to the previous step + 1."""
        return self.steps.prepare(samples, tokens, step)  # type: ignore[no-any-return]

    def phase(self, name: str) -> Any:
        """Context manager timing a phase of the current step (forward, backward, optimizer or custom)."""
        return self.steps.phases[name]

    def wrap_loader(self, loader: Iterable[Any]) -> TimedLoader:
        """Iterate ``loader``, timing how long each batch is waited for (``data_wait_s``)."""
        return TimedLoader(self.steps, loader)

    def log(self, **scalars: Any) -> None:
        """Scalars for the current (or just finished) step, as ``log_<name>`` fields.

        Floats and ints are stored as they are; tensors are never read here (no ``.item()``):
        CPU tensors are converted on the background thread, one-element CUDA tensors are copied
        asynchronously and read once the copy has completed.
        """
        self.steps.log(**scalars)

    # -- for integrations that cannot use ``with`` --------------------------------------------------
    def begin_step(self, idle_since_ns: int = 0) -> None:
        """Start a step. ``idle_since_ns`` (``perf_counter_ns``) is when the loop last finished its
        own work, e.g. the previous step's end: the gap until now is the data wait."""
        self.steps.begin(idle_since_ns)

    def end_step(self, samples: int | None = None, tokens: int | None = None, step: int | None = None) -> None:
        """End the step started by :meth:`begin_step`."""
        self.steps.end(samples, tokens, step)

    def enter_phase(self, name: str) -> None:
        """Close the open phase (if any) and open ``name``: for callbacks that only see boundaries."""
        self.steps.enter_phase(name)

    def exit_phase(self) -> None:
        """Close the phase opened by :meth:`enter_phase`."""
        self.steps.exit_phase()

    def add_data_wait(self, ns: int) -> None:
        """Add host time spent waiting for data before the next step."""
        self.steps.add_data_wait(ns)

    def add_comm(self, ns: int) -> None:
        """Add time the current step waited for communication (``comm_s``; :mod:`gpulse.training.comm` does this)."""
        self.steps.add_comm(ns)

    @property
    def in_step(self) -> bool:
        """Whether a step is open (between begin and end)."""
        return self.steps.in_step

    # -- the cold path ------------------------------------------------------------------------------
    def mark(self, kind: str, text: str = "", step: int | None = None) -> None:
        """A run event (eval, checkpoint, oom, ...) as a ``train_event`` point (Grafana annotation)."""
        self._train_event(kind, text, step)

    def _mark_profile(self, text: str, profile: str) -> None:
        """A finished profiler window as a ``train_event`` of kind ``profile``: its annotation text, and
        the window as JSON for the report (``profiles``)."""
        self._train_event("profile", text, None, profile=profile)

    def _train_event(self, kind: object, text: object, step: int | None, **extra: str) -> None:
        """The one way a ``train_event`` point is made, so that a mark never raises into the script:
        a failure is counted under ``mark``."""
        try:
            fields = {"kind": str(kind)[:64], "text": str(text)[:MAX_TEXT], "step": self.steps.step_no if step is None else step, **extra}  # fmt: skip
            self.steps.add_point(Point("train_event", time.time_ns(), self.tags, fields))
        except Exception as exc:
            self.guard.report("mark", exc)

    def watch_model(self, model: Any, seq_len: int | None = None) -> None:
        """Derive FLOPs per token (MFU) from a model's parameter count and config."""
        self.mfu.watch_model(model, seq_len)

    def set_flops_per_token(self, value: float) -> None:
        self.mfu.set_flops_per_token(value)

    def finish(self, status: str | None = None) -> None:
        """End the run: flush steps, send ``train_run`` end, unregister, write the report and (rank 0,
        unless ``quiet``) print its summary on stderr. Idempotent."""
        if self._finished or os.getpid() != self._pid:
            return
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        self._finish_ns = time.time_ns()  # the run's end; flushing what it sent is not part of it
        try:
            self.steps.prepare()  # queues the last step
            if not self._enabled:
                return
            status = status or "finished"
            if self.profile_window is not None:  # its trace read back, its event queued, before the last flush
                self.profile_window.close()
            if self.worker is None or not self.worker.finish(
                lambda: Point("train_run", time.time_ns(), self.tags, self._end_fields(status))
            ):
                self.guard.report("finish_timeout", detail="background thread still busy after 30 s")
                return
            self._say_what_was_lost()
            if self._write_report or not self.quiet:
                self._report()
        except Exception as exc:
            self.guard.report("finish", exc)
        finally:
            if self.comm_timer is not None:
                self.comm_timer.close()
            try:
                atexit.unregister(self._atexit)
            except Exception:
                pass

    def _report(self) -> None:
        """Rank 0 builds the report for every rank it can gather (the others hand theirs over), writes
        ``metrics_report.json`` and, unless quiet, says on stderr what it found."""
        from gpulse.training import report

        self.report.host = self.client.host
        others = None
        if self.world_size > 1 and self._write_report:
            others = self._gather()
        if self.rank != 0:
            return
        built = report.build(self.report, others)
        paths = []
        if self._write_report:
            try:
                paths.append(report.write_report(built, self.output_dir, self.report.live_findings))
            except OSError as exc:  # a full disk, a directory gone: say which file
                self.guard.report("report_write", exc, f"{report.REPORT_FILE} not written to {self.output_dir}")
        if not self.quiet:
            print(report.summary(built, paths), end="", file=sys.stderr, flush=True)

    def _gather(self) -> Any:
        """Rank 0: the other ranks' points (:class:`~gpulse.training.gather.Gathered`); the others hand theirs over."""
        from gpulse.training.gather import Gathered, pack, rows_per_rank

        exchange = self._join_exchange(announce=False)
        if self.rank != 0:
            if exchange is not None:
                rows = self.report.step_rows(rows_per_rank(self.world_size))
                try:
                    exchange.hand_over(pack(rows, self.report.runs, self.report.events))
                except Exception as exc:
                    self.guard.report("gather", exc, "rank 0's metrics_report.json will lack this rank")
            return None
        if exchange is None:
            return Gathered(
                partial_reason="no torch.distributed process group to gather the other ranks' points through "
                "(gpulse uses its key-value store): create the Run after init_process_group"
            )
        import logging

        return exchange.collect(self.gather_timeout_s, logging.getLogger(LOGGER_NAME).warning)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        self.finish(_status_for(et))

    def stats(self) -> dict[str, Any]:
        """Counters for tests and troubleshooting."""
        c = getattr(self, "client", None)
        return {
            "steps_sent": self.steps_sent,
            "steps_not_kept": self.steps.not_kept,
            "errors": self._errors(),
            "sent": c.sent if c else 0,
            "datagrams": c.datagrams if c else 0,
            "acked": c.acked if c else 0,
            "recorded": c.recorded if c else 0,
            "pending": c.pending if c else 0,
        }

    @property
    def steps_sent(self) -> int:
        """Steps turned into points so far (sent to the agent or recorded)."""
        return self.worker.steps_sent if self.worker is not None else 0

    # -- inside ---------------------------------------------------------------------------------------
    def _errors(self) -> dict[str, int]:
        """The Guard's counts by cause, with the steps the queue could not take (counted apart)."""
        errors = dict(self.guard.counts)
        if self.steps.not_kept:
            errors["queue_full"] = errors.get("queue_full", 1) - 1 + self.steps.not_kept
        return errors

    def _step_failed(self, et: type, exc: BaseException | None) -> None:
        if et.__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):
            self.mark("oom", text=str(exc)[:500])

    def _end_fields(self, status: str) -> dict[str, Any]:
        """``train_run`` end: what the run did, and gpulse's own errors (``config.gpulse``)."""
        diagnostics = {"errors": self._errors(), **self.mfu.describe()}
        from gpulse.training.points import run_fields

        fields = run_fields("end", status, self.name, {**self.config, "gpulse": diagnostics}, self._pid)
        fields.update(
            gpus=",".join(self.worker.uuids),
            steps=self.worker.steps_sent,
            duration_s=((self._finish_ns or time.time_ns()) - self._start_ns) / 1e9,
        )
        samples, tokens = self.report.samples, self.report.tokens
        if samples:
            fields["samples"] = samples
        if tokens:
            fields["tokens"] = tokens
        self.mfu.end_fields(fields)
        return fields

    def _say_what_was_lost(self) -> None:
        """One line at the end for each way steps or points were kept nowhere, and one saying which
        went to the recording file instead of the agent, and why (the counts are in :meth:`stats`)."""
        import logging  # only now: importing it costs more than all of gpulse.training

        log = logging.getLogger(LOGGER_NAME)
        if self.steps.not_kept:
            log.warning(
                "gpulse: run %s: %d of %d steps were not kept: they came faster than they could be sent "
                "(more than max_queue=%d waiting); the others are in the agent or in %s",
                self.run_id, self.steps.not_kept, self.worker.steps_sent + self.steps.not_kept,
                self.steps.max_queue, self.client.record_path,
            )  # fmt: skip
        recorded = self.client.recorded_summary()
        if recorded:  # said once, here: a short run without an agent would otherwise say nothing at all
            log.warning("gpulse: run %s: %s", self.run_id, recorded)
        if self.client.dropped:
            log.warning(
                "gpulse: run %s: %d points were neither acknowledged by an agent nor recorded to %s (see record_write)",
                self.run_id, self.client.dropped, self.client.record_path,
            )  # fmt: skip

    def _atexit(self) -> None:
        self.finish(_status_for(_uncaught[-1]) if _uncaught else "finished")


def _install_excepthook() -> None:
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        _uncaught.append(exc_type)
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def _status_for(et: type | None) -> str:
    if et is None:
        return "finished"
    if issubclass(et, KeyboardInterrupt):
        return "interrupted"
    if issubclass(et, SystemExit):
        return "finished"
    return "failed"
