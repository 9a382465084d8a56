"""The run's background thread: queued step records become points, sent to the agent or recorded.

It wakes every ``tick_s`` (1 s by default, and at once for ``finish()``): each wake-up costs it
CPU whatever there is to do (the wake itself, cold caches, a send and a receive), so
with millisecond steps a longer tick is a smaller share per step, and the agent writes to the
database once a second anyway. It drains the training thread's queue in
slices of at most :data:`SLICE` records and talks to the agent between two slices, so a flood of
steps cannot keep points from reaching the agent. Each slice's steps become rows
(:class:`~gpulse.channel.protocol.StepRows`, made by :mod:`gpulse.training.points`), handed to the
client and the report buffer in one go per shape; what a step costs here is measured by
``bench/bench_step.py``. A step
with GPU timings waits (without blocking anything) until its CUDA events have completed, at most
:data:`GPU_WAIT_S`; then it is sent without them. Every point also goes to the report buffer.
Every :data:`GPU_REFRESH_S` (and as soon as CUDA is found) it registers the rank's GPUs with the
agent, and it re-anchors the step clock to wall time every :data:`CLOCK_ANCHOR_S`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from gpulse.channel.protocol import Point, PointHead, Register, StepRows, Unregister
from gpulse.training.client import Client
from gpulse.training.errors import Guard
from gpulse.training.points import PointMaker, StepShape, finite_fields
from gpulse.training.report import ReportBuffer
from gpulse.training.step import StepRecord, StepRecorder
from gpulse.training.timing import CudaTimer

#: Records handled before the worker reads acks and sends again.
SLICE = 512
#: A step whose CUDA events have not completed after this long is sent without GPU times.
GPU_WAIT_S = 30.0
#: Steps waiting for their CUDA events at most (beyond, the oldest is sent without GPU times).
MAX_GPU_PENDING = 256
#: At finish, how long steps may still wait for their CUDA events.
FINAL_GPU_WAIT_S = 2.0
GPU_REFRESH_S = 10.0
CLOCK_ANCHOR_S = 30.0


class Worker:
    """Turns a run's queue into points for ``client`` and ``report``; ``end_point()`` makes the last one."""

    def __init__(
        self,
        steps: StepRecorder,
        client: Client,
        points: PointMaker,
        report: ReportBuffer,
        tags: dict[str, str],
        guard: Guard,
        tick_s: float,
    ) -> None:
        self.steps = steps
        self.client = client
        self.points = points
        self.report = report
        self.tags = tags
        self.guard = guard
        self.tick_s = tick_s
        self.steps_sent = 0
        #: the GPUs this rank uses, as registered with the agent
        self.uuids: list[str] = []
        self.run_id = tags.get("run", "")
        self.rank = tags.get("rank", "0")
        self.pid = 0
        self._step_head = PointHead("train_step", tags)
        self._pending_gpu: deque[tuple[StepRecord, float]] = deque()
        self._offset_ns = time.time_ns() - perf_counter_ns()
        self._stop = threading.Event()
        self._end_point: Any = None
        self._thread = threading.Thread(target=self._loop, name="gpulse-training", daemon=True)
        #: the automatic profiler window (``training.profiling``): ``request(rule, evidence) -> bool``,
        #: asked when the agent raises a finding of this run; ``None``: no profiling
        self.request_profile: Callable[[str, str], bool] | None = None
        client.on_finding = self._on_finding

    def start(self, pid: int) -> None:
        self.pid = pid
        self._thread.start()

    def finish(self, end_point: Any, timeout: float = 30.0) -> bool:
        """Send everything queued, then ``end_point()`` (a :class:`Point`); whether the thread finished in time."""
        self._end_point = end_point
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the thread -------------------------------------------------------------------------------
    def _loop(self) -> None:
        next_refresh = 0.0
        next_anchor = time.monotonic() + CLOCK_ANCHOR_S
        while True:
            stopping = self._stop.is_set()
            more = False
            try:
                now = time.monotonic()
                if now >= next_refresh or self.steps.cuda.changed:
                    next_refresh = now + GPU_REFRESH_S
                    self._refresh_gpus()
                if now >= next_anchor:
                    next_anchor = now + CLOCK_ANCHOR_S
                    self._offset_ns = time.time_ns() - perf_counter_ns()
                more = self._drain(final=stopping)
                self.client.pump()
            except Exception as exc:
                self.guard.report("background", exc)
            if stopping and not more:
                break
            if not more:
                # a tick, not the socket: waking for each ack costs more than it brings (acks are read
                # every tick), and finish() wakes the thread at once
                self._stop.wait(self.tick_s)
        try:
            if self._end_point is not None:
                self.emit(self._end_point())
            if self.uuids:
                self.client.submit(Unregister(self.run_id, self.rank, self.pid))
            self.client.close(wait=2.0)
        except Exception as exc:
            self.guard.report("close", exc)

    def _on_finding(self, finding: dict[str, Any]) -> None:
        """A rolling finding the agent raised, cleared or ended for this run (read with the acks,
        on this thread): kept for ``metrics_report.json``; a raise may open the profiler window."""
        self.report.add_finding(finding)
        if finding.get("state") == "raised" and self.request_profile is not None:
            self.request_profile(str(finding.get("rule")), str(finding.get("evidence")))

    def _refresh_gpus(self) -> None:
        """Register the UUIDs of the GPUs this rank uses; find the MFU peak for its device."""
        cuda = self.steps.cuda
        cuda.changed = False
        if cuda.device is None:
            return
        try:
            uuids = cuda.gpu_uuids()
            self.points.gpus = len(uuids)
            self.points.mfu.detect_peak(cuda.name())
        except Exception as exc:
            self.guard.report("gpu_refresh", exc)
            return
        if uuids != self.uuids:
            self.uuids = uuids
            self.client.submit(Register(self.run_id, self.rank, self.pid, tuple(uuids)))

    def _drain(self, final: bool) -> bool:
        """Handle up to :data:`SLICE` queued records; whether more are waiting."""
        q = self.steps.queue
        pending = self._pending_gpu
        now = time.monotonic()
        cuda_logs = self.steps.cuda.timer is not None  # only then can a logged value be a pending copy
        queued_row = self.points.queued_row
        offset = self._offset_ns
        shape: StepShape | None = None
        rows: list[tuple[int | float, ...]] = []
        budget = min(SLICE, len(q))
        while budget > 0:
            budget -= 1
            item = q.popleft()
            if type(item) is tuple:  # a step (StepRecorder.prepare); anything else is a point
                if item[0][7] or (cuda_logs and _has_cuda_logs(item[1])):  # GPU phase events, CUDA copies
                    pending.append((StepRecord.queued(item), now))
                    continue
                row_shape, row = queued_row(item, offset)
                if row_shape is not shape:  # rows of one shape go together
                    self._send_rows(shape, rows, now)
                    shape, rows = row_shape, []
                rows.append(row)
            else:
                self._send_rows(shape, rows, now)  # first: the queue's order is kept
                shape, rows = None, []
                self.emit(item)
        self._send_rows(shape, rows, now)
        if pending:
            self._drain_gpu(final)
        return bool(q)

    def _drain_gpu(self, final: bool) -> None:
        pending = self._pending_gpu
        deadline = time.monotonic() + FINAL_GPU_WAIT_S if final else 0.0
        while pending:
            rec, queued_at = pending[0]
            pairs = rec.gpu_pairs or []
            logs = rec.logs
            extra = [v[1] for v in logs.values() if type(v) is tuple] if logs else []
            try:
                ready = CudaTimer.ready(pairs, extra)
            except Exception as exc:
                self.guard.report("cuda_query", exc)
                ready, pairs = True, []
            if not ready:
                if final and time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
                too_old = time.monotonic() - queued_at > GPU_WAIT_S or len(pending) > MAX_GPU_PENDING
                if not (too_old or final):
                    return
                self.guard.report("gpu_times_dropped", detail="CUDA events not complete in time; step sent without")
                if pairs:
                    self.steps.cuda.drop(pairs)
                rec.gpu_pairs = None
                if logs:  # a copy that has not completed must not be read
                    for key in [k for k, v in logs.items() if type(v) is tuple]:
                        del logs[key]
                pending.popleft()
                self._send_rows(*self._row(rec, None), time.monotonic())
                continue
            pending.popleft()
            times = None
            timer = self.steps.cuda.timer
            if pairs and timer is not None:
                try:
                    times = timer.read(pairs)
                except Exception as exc:
                    self.guard.report("cuda_elapsed", exc)
            self._send_rows(*self._row(rec, times), time.monotonic())

    def _row(
        self, rec: StepRecord, gpu_times: dict[str, float] | None
    ) -> tuple[StepShape, list[tuple[int | float, ...]]]:
        shape, row = self.points.step_row(rec, self._offset_ns, gpu_times)
        return shape, [row]

    def _send_rows(self, shape: StepShape | None, rows: list[tuple[int | float, ...]], now: float) -> None:
        """Hand steps of one shape to the client and the report, in one go."""
        if rows:
            batch = StepRows(self._step_head, shape, rows)  # type: ignore[arg-type]
            self.client.submit_rows(batch, now)
            self.report.add_rows(batch)
            self.steps_sent += len(rows)

    def emit(self, point: Point) -> None:
        """Send ``point`` (to the agent, or the file) and keep it for the report."""
        finite_fields(point.fields, point.measurement, self.guard)
        self.client.submit(point)
        self.report.add(point.measurement, point.tags, point.fields, point.ts)


def _has_cuda_logs(logs: dict[str, Any] | None) -> bool:
    return bool(logs) and any(type(v) is tuple for v in logs.values())  # type: ignore[union-attr]
