"""``Run``: per-step training metrics with a hot path of a few microseconds.

The training thread only takes timestamps (``perf_counter_ns``), records pooled CUDA events and
reads allocator counters; it appends one small list per step to a deque. A background thread
turns those into ``train_step`` points (reading CUDA events once complete), computes rates and
MFU, and hands them to the :class:`~gpulse.training.client.Client`. Nothing here raises into the
training loop: failures are counted and logged once per cause (:class:`~gpulse.training.errors.Guard`).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from time import perf_counter_ns
from typing import Any

from gpulse.channel import protocol
from gpulse.training.client import RECORD_FILE, Client
from gpulse.training.errors import Guard
from gpulse.training.identity import dist_identity, env_run_id, generate_run_id, initialized_dist, share_run_id
from gpulse.training.timing import CudaTimer

REPORT_FILE = "metrics_report.json"
MAX_USER_TAGS = 8
RESERVED_TAGS = ("host", "run", "rank", "local_rank", "world_size")
_STANDARD_PHASES = ("forward", "backward", "optimizer")
# patterns as strings: ``re`` caches them on first use, keeping import time down
_TAG_KEY = r"[A-Za-z0-9_.\-]{1,64}"
_BAD_PHASE_CHARS = r"[^a-z0-9_]"
_BAD_LOG_CHARS = r"[^A-Za-z0-9_./\-]"
_MAX_TAG_VALUE = 256
_MAX_CONFIG = 4096

# step record layout (a list, so the log dict can be attached when the step is handed over)
_STEP, _T0, _T1, _WAIT, _SAMPLES, _TOKENS, _PHASES, _PAIRS, _MEM, _COMM, _LOGS = range(11)

_uncaught: list[type] = []  # set by our excepthook: tells the atexit finish that the script failed
_hook_installed = False
_exported_run_id: str | None = None


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


# -- the hot-path helpers ---------------------------------------------------------------------------
class _Phase:
    """A reusable context manager for one phase name (no allocation per use)."""

    __slots__ = ("acc", "ev0", "name", "run", "t0", "used")

    def __init__(self, run: Run, name: str) -> None:
        self.run = run
        self.name = name
        self.acc = 0
        self.t0 = 0
        self.ev0: Any = None
        self.used = False

    def __enter__(self) -> _Phase:
        run = self.run
        if run._in_step:
            if run._timer is not None:
                self.ev0 = run._record_event()
            self.t0 = perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        t0 = self.t0
        if t0:
            self.acc += perf_counter_ns() - t0
            self.t0 = 0
            if not self.used:
                self.used = True
                self.run._used_phases.append(self)
            if self.ev0 is not None:
                self.run._end_gpu_phase(self)


class _Step:
    """The reusable context manager returned by :meth:`Run.step`."""

    __slots__ = ("run", "samples", "step", "tokens")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.samples: int | None = None
        self.tokens: int | None = None
        self.step: int | None = None

    def __enter__(self) -> _Step:
        self.run.begin_step()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if et is None:
            self.run.end_step(self.samples, self.tokens, self.step)
        else:
            self.run._abort_step(et, ev)


class _TimedLoader:
    """``run.wrap_loader(loader)``: iterates the loader, adding each ``next()`` wait to the run."""

    def __init__(self, run: Run, loader: Iterable[Any]) -> None:
        self.run = run
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        run = self.run
        it = iter(self.loader)
        clock = perf_counter_ns
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            run._wait_ns += clock() - t0
            run._wait_known = True
            yield batch


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
        max_report_steps: int = 10_000,
        max_queue: int = 100_000,
        max_unacked: int = 10_000,
        max_unacked_bytes: int = 8 << 20,
        tick_s: float = 0.05,
    ) -> None:
        self.guard = Guard()
        self._pid = os.getpid()
        self._finished = False
        self._finish_lock = threading.Lock()
        # hot-path state first, so every method is a safe no-op even if setup below fails
        self._in_step = False
        self._step_t0 = 0
        self._step_no = 0
        self._wait_ns = 0
        self._wait_known = False
        self._logs: dict[str, Any] = {}
        self._last: list[Any] | None = None
        self._used_phases: list[_Phase] = []
        self._phases: dict[str, _Phase] = {}
        self._pairs: list[tuple[str, Any, Any]] | None = None
        self._timer: Any = None
        self._memory: Any = None
        self._next_cuda_check = 0
        self._gpus_dirty = False
        self._comm_ns = 0
        self._comm_known = False
        self._step_end_hooks: list[Any] = []
        self._open_phase: _Phase | None = None
        self._queue: deque[Any] = deque()
        self._max_queue = max_queue
        self._queued = 0
        self._step_ctx = _Step(self)
        self._enabled = False
        self._gpu_timing = gpu_timing
        self._track_memory = track_memory
        self._device: int | None = None
        self._torch: Any = None
        self.name = name or "run"
        self.run_id = ""
        self.tags: dict[str, str] = {}
        self.output_dir = os.fspath(output_dir) if output_dir is not None else os.getcwd()
        self.steps_sent = 0
        try:
            self._setup(
                name, tags, run_id, config, model, flops_per_token, peak_flops, dtype, socket_path,
                ack_timeout, write_report, max_report_steps, max_unacked, max_unacked_bytes, tick_s,
            )  # fmt: skip
            self._enabled = True
        except Exception as exc:
            self.guard.report("setup", exc, "gpulse is disabled for this run; training is unaffected")

    def _setup(
        self, name, tags, run_id, config, model, flops_per_token, peak_flops, dtype, socket_path,
        ack_timeout, write_report, max_report_steps, max_unacked, max_unacked_bytes, tick_s,
    ) -> None:  # fmt: skip
        self.rank, self.local_rank, self.world_size = dist_identity()
        self.run_id = self._resolve_run_id(run_id)
        self.tags = self._build_tags(tags)
        self.config = dict(config or {})
        self._write_report = write_report
        self._report = _ReportBuffer(max_report_steps)
        self._dtype = dtype
        self._peak_override = peak_flops
        if self._peak_override is None and os.environ.get("GPULSE_PEAK_FLOPS"):
            try:
                self._peak_override = float(os.environ["GPULSE_PEAK_FLOPS"])
            except ValueError as exc:
                self.guard.report("bad_GPULSE_PEAK_FLOPS", exc)
        self._fpt_fixed = flops_per_token
        self._flops_model: Any = None
        self._last_fpt: float | None = None
        self._peak: float | None = self._peak_override
        self._peak_label = "override" if self._peak_override else ""
        self._uuids: list[str] = []
        self._registered: list[str] = []
        if model is not None:
            self.watch_model(model)
        path = socket_path or protocol.client_socket_path()
        self.client = Client(
            path,
            os.path.join(self.output_dir, RECORD_FILE),
            ack_timeout=ack_timeout,
            max_unacked=max_unacked,
            max_unacked_bytes=max_unacked_bytes,
            guard=self.guard,
        )
        self._clock_offset = time.time_ns() - perf_counter_ns()
        self._start_ns = time.time_ns()
        self._start_perf = perf_counter_ns()
        self._tick = tick_s
        self._pending_gpu: deque[tuple[list[Any], float]] = deque()
        self._stop = threading.Event()
        self._start_point()
        self._maybe_detect_cuda()
        self._thread = threading.Thread(target=self._loop, name="gpulse-training", daemon=True)
        self._thread.start()
        _install_excepthook()
        atexit.register(self._atexit)

    def _resolve_run_id(self, explicit: str | None) -> str:
        global _exported_run_id
        rid = explicit or env_run_id()
        if rid and rid != _exported_run_id:  # an id this process exported belongs to its previous run
            return str(rid)[:_MAX_TAG_VALUE]
        rid = generate_run_id(self.name)
        dist = initialized_dist()
        if dist is not None and self.world_size > 1:
            rid = share_run_id(dist, self.rank, rid, self.guard)
        os.environ["GPULSE_RUN_ID"] = _exported_run_id = rid  # processes started from here join this run
        return rid

    def _build_tags(self, user: Mapping[str, Any] | None) -> dict[str, str]:
        tags = {}
        for key, value in (user or {}).items():
            key = str(key)
            if key in RESERVED_TAGS or not re.fullmatch(_TAG_KEY, key):
                self.guard.report("bad_tag", detail=f"tag {key!r} is reserved or not [A-Za-z0-9_.-]{{1,64}}; dropped")
                continue
            if len(tags) >= MAX_USER_TAGS:
                self.guard.report("too_many_tags", detail=f"at most {MAX_USER_TAGS} user tags; {key!r} dropped")
                continue
            text = str(value)[:_MAX_TAG_VALUE]
            if text:
                tags[key] = text
        tags.update(
            run=self.run_id, rank=str(self.rank), local_rank=str(self.local_rank), world_size=str(self.world_size)
        )
        return tags

    # -- public API: the hot path -------------------------------------------------------------------
    def step(self, samples: int | None = None, tokens: int | None = None, step: int | None = None) -> _Step:
        """Context manager around one optimizer step; ``step`` defaults to the previous step + 1."""
        ctx = self._step_ctx
        ctx.samples = samples
        ctx.tokens = tokens
        ctx.step = step
        return ctx

    def phase(self, name: str) -> _Phase:
        """Context manager timing a phase of the current step (forward, backward, optimizer or custom)."""
        ph = self._phases.get(name)
        if ph is None:
            ph = self._phases[name] = _Phase(self, _phase_name(name))
        return ph

    def wrap_loader(self, loader: Iterable[Any]) -> _TimedLoader:
        """Iterate ``loader``, timing how long each batch is waited for (``data_wait_s``)."""
        return _TimedLoader(self, loader)

    def log(self, **scalars: Any) -> None:
        """Scalars for the current (or just finished) step, as ``log_<name>`` fields.

        Floats and ints are stored as they are; tensors are never read here (no ``.item()``):
        CPU tensors are converted on the background thread, one-element CUDA tensors are copied
        asynchronously and read once the copy has completed.
        """
        self._logs.update(scalars)

    def begin_step(self, idle_since_ns: int = 0) -> None:
        """Start a step (for integrations that cannot use ``with run.step()``).

        ``idle_since_ns`` (``perf_counter_ns``) is when the loop last finished its own work, e.g. the
        previous step's end: the gap until now is the time spent waiting for the batch (data wait)."""
        if idle_since_ns:
            self.add_data_wait(perf_counter_ns() - idle_since_ns)
        last = self._last
        if last is not None:
            self._hand_over(last)
        if self._device is None and self._step_no >= self._next_cuda_check:
            self._maybe_detect_cuda()
        if self._timer is not None:
            self._pairs = []
        self._in_step = True
        self._step_t0 = perf_counter_ns()

    def end_step(self, samples: int | None = None, tokens: int | None = None, step: int | None = None) -> None:
        """End the step started by :meth:`begin_step`."""
        t1 = perf_counter_ns()
        if not self._in_step:
            return
        if self._open_phase is not None:
            self.exit_phase()
        for hook in self._step_end_hooks:
            try:
                hook()
            except Exception as exc:
                self.guard.report("step_end_hook", exc)
        self._in_step = False
        self._step_no = step if step is not None else self._step_no + 1
        used = self._used_phases
        if used:
            phases = tuple([(p.name, p.acc) for p in used])
            for p in used:
                p.acc = 0
                p.used = False
            used.clear()
        else:
            phases = ()
        wait = self._wait_ns if self._wait_known else None
        self._wait_ns = 0
        comm = None
        if self._comm_known:
            comm = self._comm_ns
            self._comm_ns = 0
        mem = None
        if self._memory is not None:
            try:
                mem = self._memory.read()
            except Exception as exc:
                self._memory = None
                self.guard.report("memory_stats", exc)
        pairs = self._pairs
        self._pairs = None
        self._last = [self._step_no, self._step_t0, t1, wait, samples, tokens, phases, pairs, mem, comm, None]

    def enter_phase(self, name: str) -> None:
        """Close the open phase (if any) and open ``name``: for callbacks that only see boundaries."""
        if self._open_phase is not None:
            self._open_phase.__exit__(None, None, None)
        ph = self.phase(name)
        ph.__enter__()
        self._open_phase = ph

    def exit_phase(self) -> None:
        """Close the phase opened by :meth:`enter_phase`."""
        ph = self._open_phase
        if ph is not None:
            self._open_phase = None
            ph.__exit__(None, None, None)

    def add_data_wait(self, ns: int) -> None:
        """Add host time spent waiting for data before the next step (integrations)."""
        self._wait_ns += ns
        self._wait_known = True

    def add_comm(self, ns: int) -> None:
        """Add communication time to the current step (the DDP comm hook does this)."""
        self._comm_ns += ns
        self._comm_known = True

    def _hand_over(self, rec: list[Any]) -> None:
        self._last = None
        logs = self._logs
        if logs:
            rec[_LOGS] = logs
            self._logs = {}
            if self._device is not None:
                self._copy_device_logs(logs)
        if self._queued - self.steps_sent > self._max_queue:
            self.guard.report("queue_full", detail="background thread is behind; step dropped")
            return
        self._queued += 1
        self._queue.append(rec)

    def _copy_device_logs(self, logs: dict[str, Any]) -> None:
        """Start an asynchronous copy of one-element CUDA tensors; the background thread reads them when done."""
        for key, value in logs.items():
            if type(value) in (float, int):
                continue
            try:
                device = getattr(value, "device", None)
                if device is None or device.type != "cuda" or value.numel() != 1:
                    continue
                timer = self._timer
                if timer is None:
                    continue  # no events to know when the copy is done: _scalar reports and skips it
                copy = value.detach().to("cpu", non_blocking=True)  # pinned destination: truly asynchronous
                event = self._record_event()
                if event is not None:
                    logs[key] = (copy, event)
            except Exception as exc:
                self.guard.report("log_copy", exc, key)

    def _abort_step(self, et: type, exc: BaseException) -> None:
        self._in_step = False
        self._open_phase = None
        for p in self._phases.values():
            p.t0 = 0
            if p.ev0 is not None and self._timer is not None:
                self._timer.release(p.ev0)
            p.ev0 = None
        for p in self._used_phases:
            p.acc = 0
            p.used = False
        self._used_phases.clear()
        if self._pairs and self._timer is not None:
            self._timer.drop(self._pairs)
        self._pairs = None
        if et.__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):
            self.mark("oom", text=str(exc)[:500])

    # -- GPU ----------------------------------------------------------------------------------------
    def _record_event(self) -> Any:
        try:
            return self._timer.record()
        except Exception as exc:
            self._timer = None
            self.guard.report("cuda_event", exc, "GPU phase times disabled")
            return None

    def _end_gpu_phase(self, ph: _Phase) -> None:
        start = ph.ev0
        ph.ev0 = None
        end = self._record_event()
        if end is None or self._pairs is None:
            if self._timer is not None:
                self._timer.release(start, end)
            return
        self._pairs.append((ph.name, start, end))

    def _maybe_detect_cuda(self) -> None:
        """Once CUDA is initialised in this process: pick the device, the event pool and memory probe."""
        self._next_cuda_check = self._step_no + 16
        if self._device is not None:
            return
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.cuda.is_initialized():  # a flag: never initialises CUDA itself
                return
            self._attach_cuda(torch, torch.cuda.current_device())  # per thread: read on the training thread
        except Exception as exc:
            self.guard.report("cuda_detect", exc)

    def _attach_cuda(self, torch: Any, device: int) -> None:
        """Use CUDA device ``device`` of ``torch`` for events, memory counters and GPU registration."""
        self._torch = torch
        if self._gpu_timing:
            self._timer = CudaTimer(torch)
        if self._track_memory:
            from gpulse.training.memory import MemoryProbe

            self._memory = MemoryProbe(torch, device)
        self._device = device
        self._gpus_dirty = True

    def _refresh_gpus(self) -> None:
        """(Background thread) register the UUIDs of the GPUs this rank uses; detect the MFU peak."""
        if self._device is None:
            return
        torch = self._torch
        used = [self._device]
        for i in range(torch.cuda.device_count()):
            if i != self._device and torch.cuda.memory_reserved(i) > 0:
                used.append(i)
        uuids = []
        for i in used:
            props = torch.cuda.get_device_properties(i)
            uuid = str(props.uuid)
            uuids.append(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        self._uuids = uuids
        if self._peak is None:
            from gpulse.training.flops import lookup_peak

            found = lookup_peak(torch.cuda.get_device_properties(self._device).name, self._dtype)
            if found is None:
                self.guard.report("unknown_peak", detail="GPU model not in the peak table; pass peak_flops= for MFU")
                self._peak = 0.0
            else:
                self._peak_label, self._peak = found
        if uuids != self._registered:
            self._registered = uuids
            self.client.submit(protocol.register(0, self.run_id, str(self.rank), self._pid, uuids))

    # -- public API: cold path ----------------------------------------------------------------------
    def mark(self, kind: str, text: str = "", step: int | None = None) -> None:
        """A run event (eval, checkpoint, oom, ...) as a ``train_event`` point (Grafana annotation)."""
        try:
            if len(self._queue) > self._max_queue:
                self.guard.report("queue_full", detail="background thread is behind; event dropped")
                return
            fields = {"kind": str(kind)[:64], "text": str(text)[:4096], "step": self._step_no if step is None else step}
            self._queue.append(("train_event", time.time_ns(), fields))
        except Exception as exc:
            self.guard.report("mark", exc)

    def watch_model(self, model: Any, seq_len: int | None = None) -> None:
        """Derive FLOPs per token (MFU) from a model's parameter count and config."""
        try:
            from gpulse.training.flops import from_model

            self._flops_model = from_model(model, seq_len)
        except Exception as exc:
            self.guard.report("flops_model", exc)

    def set_flops_per_token(self, value: float) -> None:
        self._fpt_fixed = float(value)

    def finish(self, status: str | None = None) -> None:
        """End the run: flush steps, send ``train_run`` end, unregister, write the report. Idempotent."""
        if self._finished or os.getpid() != self._pid:
            return
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        try:
            if self._last is not None:
                self._hand_over(self._last)
            if not self._enabled:
                return
            self._status = status or "finished"
            self._stop.set()
            self._thread.join(timeout=30.0)
            if self._thread.is_alive():
                self.guard.report("finish_timeout", detail="background thread still busy after 30 s")
                return
            self._write_metrics_report()
        except Exception as exc:
            self.guard.report("finish", exc)
        finally:
            try:
                atexit.unregister(self._atexit)
            except Exception:
                pass

    def __enter__(self) -> Run:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        self.finish(_status_for(et))

    def _atexit(self) -> None:
        self.finish(_status_for(_uncaught[-1]) if _uncaught else "finished")

    # -- the background thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        next_refresh = 0.0
        next_anchor = time.monotonic() + 30.0
        while True:
            stopping = self._stop.is_set()
            try:
                now = time.monotonic()
                if now >= next_refresh or self._gpus_dirty:
                    next_refresh = now + 10.0
                    self._gpus_dirty = False
                    try:
                        self._refresh_gpus()
                    except Exception as exc:
                        self.guard.report("gpu_refresh", exc)
                if now >= next_anchor:
                    next_anchor = now + 30.0
                    self._clock_offset = time.time_ns() - perf_counter_ns()
                self._drain(final=stopping)
                self.client.pump()
            except Exception as exc:
                self.guard.report("background", exc)
            if stopping:
                break
            self.client.wait_readable(self._tick)
        try:
            self._end_point()
            if self._registered:
                self.client.submit(protocol.unregister(0, self.run_id, str(self.rank), self._pid))
            self.client.close(wait=2.0)
        except Exception as exc:
            self.guard.report("close", exc)

    def _drain(self, final: bool = False) -> None:
        q = self._queue
        while q:
            item = q.popleft()
            if type(item) is list:
                pairs = item[_PAIRS]
                if pairs or _has_cuda_logs(item[_LOGS]):
                    self._pending_gpu.append((item, time.monotonic()))
                else:
                    self._emit_step(item, None)
            else:
                measurement, ts, fields = item
                self._emit(measurement, ts, fields)
        self._drain_gpu(final)

    def _drain_gpu(self, final: bool) -> None:
        pending = self._pending_gpu
        deadline = time.monotonic() + 2.0 if final else 0.0
        while pending:
            rec, queued_at = pending[0]
            pairs = rec[_PAIRS] or []
            logs = rec[_LOGS]
            extra = [v[1] for v in logs.values() if type(v) is tuple] if logs else []
            ready = False
            try:
                ready = CudaTimer.ready(pairs, extra)
            except Exception as exc:
                self.guard.report("cuda_query", exc)
                ready = True
                pairs = []
            if not ready:
                too_old = time.monotonic() - queued_at > 30.0 or len(pending) > 256
                if final and time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
                if not (too_old or final):
                    return
                self.guard.report("gpu_times_dropped", detail="CUDA events not complete in time; step sent without")
                if pairs and self._timer is not None:
                    self._timer.drop(pairs)
                rec[_PAIRS] = None
                if logs:  # a copy that has not completed must not be read
                    for key in [k for k, v in logs.items() if type(v) is tuple]:
                        del logs[key]
                pending.popleft()
                self._emit_step(rec, None)
                continue
            pending.popleft()
            times = None
            if pairs and self._timer is not None:
                try:
                    times = self._timer.read(pairs)
                except Exception as exc:
                    self.guard.report("cuda_elapsed", exc)
            self._emit_step(rec, times)

    def _emit_step(self, rec: list[Any], gpu_times: dict[str, float] | None) -> None:
        off = self._clock_offset
        t0, t1 = rec[_T0], rec[_T1]
        dt = (t1 - t0) / 1e9
        fields: dict[str, Any] = {
            "step": rec[_STEP],
            "start_time_ns": t0 + off,
            "end_time_ns": t1 + off,
            "step_time_s": dt,
        }
        if rec[_WAIT] is not None:
            fields["data_wait_s"] = rec[_WAIT] / 1e9
        for name, ns in rec[_PHASES]:
            fields[_phase_key(name, False)] = ns / 1e9
        if gpu_times:
            for name, s in gpu_times.items():
                fields["comm_s" if name == "comm" else _phase_key(name, True)] = s
        if rec[_COMM] is not None:
            fields["comm_s"] = rec[_COMM] / 1e9
        samples, tokens = rec[_SAMPLES], rec[_TOKENS]
        if samples:
            fields["samples"] = samples
            if dt > 0:
                fields["samples_per_s"] = samples / dt
        if tokens:
            fields["tokens"] = tokens
            if dt > 0:
                fields["tokens_per_s"] = tokens / dt
                self._add_flops(fields, tokens, samples, dt)
        mem = rec[_MEM]
        if mem is not None:
            fields["mem_allocated_bytes"], fields["mem_reserved_bytes"], fields["mem_peak_bytes"] = mem[:3]
            fields["alloc_retries"] = mem[3]
        if rec[_LOGS]:
            for key, value in rec[_LOGS].items():
                v = self._scalar(key, value)
                if v is not None:
                    fields[_log_key(key)] = v
        ts = t1 + off
        self._emit("train_step", ts, fields)
        self.steps_sent += 1

    def _add_flops(self, fields: dict[str, Any], tokens: int, samples: int | None, dt: float) -> None:
        if self._fpt_fixed:
            fpt = self._fpt_fixed
        elif self._flops_model is not None:
            fpt = self._flops_model.per_token(tokens / samples if samples else None)
        else:
            return
        self._last_fpt = fpt
        rate = fpt * tokens / dt
        fields["tflops"] = rate / 1e12
        if self._peak:
            fields["mfu"] = rate / (self._peak * max(len(self._uuids), 1))

    def _scalar(self, key: str, value: Any) -> float | None:
        """A logged value as a float, reading tensors only when that cannot wait for the GPU."""
        try:
            if type(value) is tuple:  # (pinned CPU copy, CUDA event), completed by now
                if self._timer is not None:
                    self._timer.release(value[1])
                return float(value[0])
            if isinstance(value, (int, float)):
                return float(value)
            device = getattr(value, "device", None)
            if device is not None and getattr(device, "type", "cpu") != "cpu":
                self.guard.report("log_device_tensor", detail=f"{key}: tensor not on CPU was not read")
                return None
            if hasattr(value, "numel") and value.numel() != 1:
                self.guard.report("log_not_scalar", detail=f"{key}: only one-element values are logged")
                return None
            return float(value)
        except Exception as exc:
            self.guard.report("log_value", exc, key)
            return None

    def _emit(self, measurement: str, ts: int, fields: dict[str, Any]) -> None:
        tags = self.tags
        for k, v in list(fields.items()):
            if type(v) is float and (v != v or v in (_INF, -_INF)):
                del fields[k]
                self.guard.report("nonfinite_value", detail=f"{measurement}.{k} dropped")
        self.client.submit(protocol.point(0, measurement, ts, tags, fields))
        self._report.add(measurement, tags, fields, ts)

    def _start_point(self) -> None:
        fields = {
            "event": "start",
            "status": "running",
            "name": self.name[:_MAX_TAG_VALUE],
            "config": _config_json(self.config),
            "pid": self._pid,
        }
        self._queue.append(("train_run", self._start_ns, fields))

    def _end_point(self) -> None:
        end = time.time_ns()
        fields: dict[str, Any] = {
            "event": "end",
            "status": getattr(self, "_status", "finished"),
            "name": self.name[:_MAX_TAG_VALUE],
            "config": _config_json({**self.config, "gpulse": self._diagnostics()}),
            "gpus": ",".join(self._uuids),
            "steps": self.steps_sent,
            "duration_s": (end - self._start_ns) / 1e9,
            "pid": self._pid,
        }
        if self._flops_model is not None or self._fpt_fixed:
            fields["mfu_formula"] = "given" if self._fpt_fixed else self._flops_model.formula
        if self._last_fpt:
            fields["flops_per_token"] = self._last_fpt
        if self._peak:
            fields["peak_flops"] = self._peak
        self._emit("train_run", end, fields)

    def _diagnostics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"errors": dict(self.guard.counts)}
        if self._flops_model is not None:
            out["flops"] = self._flops_model.describe()
        if self._peak_label:
            out["peak"] = self._peak_label
        return out

    def _write_metrics_report(self) -> None:
        if not self._write_report or self.rank != 0:
            return
        try:
            from gpulse.report.model import build_report

            report = build_report(self._report.steps, [], self._report.runs, self._report.events, None)
            os.makedirs(self.output_dir, exist_ok=True)
            path = os.path.join(self.output_dir, REPORT_FILE)
            tmp = f"{path}.{self._pid}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(report.to_json(), fh, indent=2, default=str)
            os.replace(tmp, path)
        except Exception as exc:
            self.guard.report("metrics_report", exc)

    # -- introspection ------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters for tests and troubleshooting."""
        c = getattr(self, "client", None)
        return {
            "steps_sent": self.steps_sent,
            "errors": dict(self.guard.counts),
            "sent": c.sent if c else 0,
            "acked": c.acked if c else 0,
            "recorded": c.recorded if c else 0,
            "pending": c.pending if c else 0,
        }


_INF = float("inf")


def _status_for(et: type | None) -> str:
    if et is None:
        return "finished"
    if issubclass(et, KeyboardInterrupt):
        return "interrupted"
    if issubclass(et, SystemExit):
        return "finished"
    return "failed"


def _has_cuda_logs(logs: dict[str, Any] | None) -> bool:
    return bool(logs) and any(type(v) is tuple for v in logs.values())


def _phase_key(name: str, gpu: bool) -> str:
    """``forward_s`` / ``forward_gpu_s`` for the standard phases, ``phase_<name>_s`` for the others."""
    suffix = "_gpu_s" if gpu else "_s"
    return f"{name}{suffix}" if name in _STANDARD_PHASES else f"phase_{name}{suffix}"


def _phase_name(name: str) -> str:
    clean = re.sub(_BAD_PHASE_CHARS, "_", str(name).lower())[:48]
    return clean or "unnamed"


_LOG_KEYS: dict[str, str] = {}


def _log_key(name: str) -> str:
    key = _LOG_KEYS.get(name)
    if key is None:
        key = "log_" + (re.sub(_BAD_LOG_CHARS, "_", str(name))[:64] or "value")
        if len(_LOG_KEYS) < 4096:
            _LOG_KEYS[name] = key
    return key


def _config_json(config: Mapping[str, Any]) -> str:
    try:
        text = json.dumps(config, default=str, sort_keys=True)
    except Exception:
        text = json.dumps({k: str(v) for k, v in config.items()})
    return text if len(text) <= _MAX_CONFIG else text[: _MAX_CONFIG - 3] + "..."


class _ReportBuffer:
    """The run's own points, kept for ``metrics_report.json``; steps capped by halving resolution.

    Step fields are kept as sent (no copy; the tags are the run's and added when the report is built).
    """

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max(max_steps, 2)
        self._steps: list[tuple[Mapping[str, Any], int]] = []
        self.runs: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._tags: Mapping[str, str] = {}
        self._stride = 1
        self._seen = 0

    def add(self, measurement: str, tags: Mapping[str, str], fields: Mapping[str, Any], ts: int) -> None:
        if measurement == "train_step":
            self._tags = tags
            self._seen += 1
            if (self._seen - 1) % self._stride:
                return
            self._steps.append((fields, ts))
            if len(self._steps) >= self.max_steps:
                self._steps = self._steps[::2]
                self._stride *= 2
        elif measurement == "train_run":
            self.runs.append({**tags, **fields, "time": ts})
        else:
            self.events.append({**tags, **fields, "time": ts})

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [{**self._tags, **fields, "time": ts} for fields, ts in self._steps]
