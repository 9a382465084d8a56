"""The agent loop: sample every GPU on a fixed grid, encode, hand lines to delivery; report on itself.

Schedule. Ticks are multiples of the interval on the wall clock (so agents on different nodes
sample at the same instants and Grafana's points line up), but the loop waits on the monotonic
clock, so a wall-clock step never makes it sleep or spin. All GPUs of a cycle share the tick's
timestamp. A cycle that would start late (the previous one overran, or the process was starved)
is skipped and counted in ``cycles_skipped``: cycles never overlap and never bunch up to catch up.

Hot path. Each GPU's :class:`~gpulse.lineprotocol.encode.Series` (escaped tag prefix) is built once and
rebuilt only when the set of GPUs or the training-run registrations (``runs_version``) change,
so a cycle is one ``collect`` call, one ``Encoder.line`` per reading and one ``submit``.

Shutdown. SIGTERM/SIGINT stop sampling; what is buffered is delivered within
``shutdown_timeout`` and the rest spooled (by :class:`~gpulse.delivery.pipeline.Delivery`), then one log
line says what became of the lines; with ``--summary-file`` the exact counts also go to that file as
JSON (scripts and tests count points against it).
SIGUSR1 asks for an immediate flush.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import resource
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, TextIO

from gpulse import __version__
from gpulse.agent.config import AgentConfig
from gpulse.agent.counters import Counts, LoopCounters, read
from gpulse.agent.findings import LiveFindings
from gpulse.agent.status_line import StatusLine
from gpulse.lineprotocol.encode import Encoder, Series
from gpulse.report.live import LiveWindow
from gpulse.schema import GPU_TAGS, MEASUREMENTS
from gpulse.sources.base import GpuIdentity, GpuSource, Reading, SourceUnavailable
from gpulse.sources.host import MAX_PROCESSES, HostSampler, TrainingProcess
from gpulse.util.countlog import CountedLog

log = logging.getLogger("gpulse.agent")
_rlog = CountedLog(log)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_NO_DRIVER = 3
#: another agent holds this socket or destination (gpulse.agent.instance)
EXIT_ANOTHER_AGENT = 4

#: Measurements tagged per GPU (host, gpu, uuid, model [, run]).
GPU_MEASUREMENTS = tuple(m.name for m in MEASUREMENTS.values() if m.tags[: len(GPU_TAGS)] == GPU_TAGS)
#: Wall-clock minus monotonic may drift this much before the schedule is re-aligned.
_CLOCK_STEP_NS = 100_000_000
#: The latest ``gpu_info`` of each GPU is written again this often, so it stays inside the raw
#: retention however long the agent runs (the inventory panels read it from the raw tier).
GPU_INFO_EVERY_S = 3600
#: ``host_process`` series kept encoded (run, rank, process), the least recently used forgotten first;
#: kept here alone, not in the encoder's cache, which a long-lived node's runs would fill.
MAX_PROCESS_SERIES = 2 * MAX_PROCESSES


def make_source(cfg: AgentConfig) -> GpuSource:
    """Simulated GPUs with ``--simulate N``, else NVML (imported only then)."""
    if cfg.simulate:
        from gpulse.sources.simulated import SimulatedSource

        return SimulatedSource(cfg.simulate, model=cfg.simulate_model, seed=cfg.seed)
    from gpulse.sources.nvml.source import NvmlSource

    if cfg.slurm_job_dir:
        from gpulse.sources.attribution.slurm_files import SlurmJobFiles
        from gpulse.sources.processes import ProcessDescriber

        return NvmlSource(describer=ProcessDescriber(slurm=SlurmJobFiles(cfg.slurm_job_dir)))
    return NvmlSource()


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_malloc_trim = _libc_malloc_trim()


def trim_heap() -> None:
    """Hand freed heap memory back to the OS (glibc only), every self-metrics interval.

    Request bodies (MBs while a backlog drains) are allocated and freed on the delivery and sink
    threads, whose glibc arenas otherwise keep the freed pages: the agent's RSS would creep up to
    its highest backlog and stay there. One call per self-metrics interval."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def process_cpu_s() -> float:
    """User + system CPU time of this process, all threads (sampling, delivery, training channel)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


#: The one no-GPU story (README, agent, doctor, ``make up``): simulated GPUs only when asked for, so a
#: node whose driver broke never writes invented numbers into the database.
NO_GPU_WAY_OUT = (
    "no GPU at hand? `gpulse agent --simulate 8` runs eight simulated GPUs and says so "
    "(GPULSE_SIMULATE=8 does the same for every gpulse command, doctor included)"
)
#: the NVML source's own hint, alone in parentheses or after a semicolon inside them
_SOURCE_HINT = re.compile(r"\s*\(use --simulate N[^)]*\)|;\s*use --simulate N[^)]*")


def unavailable_reason(e: BaseException) -> str:
    """Why the GPU source cannot open, in the source's words without its own ``--simulate`` hint."""
    return _SOURCE_HINT.sub("", str(e)).strip().rstrip(".")


def no_gpu_message(e: BaseException) -> str:
    """Why the GPU source cannot open, and the one way out without a GPU."""
    return f"{unavailable_reason(e)}. {NO_GPU_WAY_OUT[0].upper()}{NO_GPU_WAY_OUT[1:]}."


def write_summary(path: str, summary: dict[str, Any]) -> None:
    """The final counts as one JSON object, complete or not at all (written aside, then renamed)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def gpu_jobs(readings: list[Reading], gpus: list[GpuIdentity]) -> dict[str, str]:
    """GPU uuid -> the job holding it, from the ``job`` tags of a cycle's ``gpu`` readings.

    The training channel tags a rank's points with it (a process in a pod cannot name its job)."""
    uuids = {g.index: g.uuid for g in gpus}
    out: dict[str, str] = {}
    for r in readings:
        job = r.tags.get("job") if r.measurement == "gpu" and r.tags else None
        uuid = uuids.get(r.gpu)
        if job and uuid:
            out[uuid] = job
    return out


class _Rate:
    """Lines per second over the last ~10 s, from a counter sampled about once a second."""

    def __init__(self, window: int = 10) -> None:
        self.samples: deque[tuple[float, int]] = deque(maxlen=window + 1)

    def add(self, now: float, count: int) -> None:
        self.samples.append((now, count))

    @property
    def per_s(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


class Agent:
    """One agent process: a GPU source, the training receiver, delivery, and the loop between them."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        source: GpuSource | None = None,
        stream: TextIO | None = None,
        tty: bool | None = None,
    ) -> None:
        self.cfg = cfg
        self.source = source if source is not None else make_source(cfg)
        self.stream = stream if stream is not None else sys.stderr
        self._tty = tty
        self.encoder = Encoder(precision="ns")
        self.delivery: Any = None
        self.receiver: Any = None
        self.status_line: StatusLine | None = None
        # the loop's counters (main thread writes; snapshot() reads them from the receiver thread)
        self.counters = LoopCounters()
        self.started_mono = time.monotonic()
        self.started_unix = time.time()
        self.stop_reason = ""
        self.source_failure: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._flush_requested = False
        self._rate = _Rate()
        # per-GPU series, rebuilt when GPUs or run registrations change
        self._gpus: list[GpuIdentity] = []
        self._runs: dict[str, str] = {}
        #: indexes of the GPUs a registered run uses
        self._run_gpus: set[int] = set()
        self._runs_version = -1
        self._series: dict[int, dict[str, Series]] = {}
        self._base_tags: dict[int, dict[str, dict[str, str]]] = {}
        self._agent_series = self.encoder.series("agent", {"host": cfg.host})
        self._gpu_info: dict[int, Reading] = {}
        self._gpu_info_due = 0
        self.host_sampler = None if cfg.no_host_metrics else HostSampler()
        self._host_series = self.encoder.series("host", {"host": cfg.host})
        self._process_series: OrderedDict[tuple[str, str, str, tuple[tuple[str, str], ...]], Series] = OrderedDict()
        #: one field-spec dict for every ``host_process`` series (the measurement has no open fields)
        self._process_specs: dict[str, tuple[str, str]] = {}
        window = LiveWindow(cfg.live_window_steps, cfg.live_window_s, cfg.live_every_s)
        self.findings = None if cfg.no_live_findings else LiveFindings(window)

    # -- control (signal handlers and tests) ------------------------------------------------------
    def request_stop(self, reason: str = "stop requested") -> None:
        if not self.stop_reason:
            self.stop_reason = reason
        self._stop.set()
        self._wake.set()

    def request_flush(self) -> None:
        self._flush_requested = True
        self._wake.set()

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_stop(signum: int, _frame: Any) -> None:
            self.request_stop(signal.Signals(signum).name)

        def on_usr1(_signum: int, _frame: Any) -> None:
            self.request_flush()

        old = {s: signal.signal(s, on_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, on_usr1)

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore

    # -- lifecycle ---------------------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped (signal, ``--duration``); returns the process exit code."""
        from gpulse.agent.instance import AnotherAgent, InstanceLock

        cfg = self.cfg
        try:
            instance = InstanceLock(cfg).acquire()  # before anything is opened, written or spooled
        except AnotherAgent as e:
            print(f"gpulse agent: {e}.\n  fix: {e.fix}", file=self.stream)
            return EXIT_ANOTHER_AGENT
        except OSError as e:
            print(f"gpulse agent: cannot start: {e}", file=self.stream)
            return EXIT_FAILURE
        try:
            return self._run_alone()
        finally:
            instance.release()

    def _run_alone(self) -> int:
        cfg = self.cfg
        try:
            self._gpus = list(self.source.open())
        except SourceUnavailable as e:
            print(f"gpulse agent: {no_gpu_message(e)}", file=self.stream)
            return EXIT_NO_DRIVER
        restore_signals = self._install_signals()
        try:
            try:
                self._start_pipeline()
            except OSError as e:  # e.g. a spool directory of another user, a record file we cannot open
                print(f"gpulse agent: cannot start: {e}", file=self.stream)
                self.stop_reason = "failed to start"
                return EXIT_ANOTHER_AGENT if e.errno == errno.EADDRINUSE else EXIT_FAILURE
            self._rebuild_series()
            log.info("gpulse %s agent on %s: %d GPU(s); %s", __version__, cfg.host, len(self._gpus), cfg.describe())
            self.status_line = StatusLine(self.snapshot, self.stream, tty=self._tty, log_every=cfg.status_interval)
            cpu0 = process_cpu_s()
            try:
                self._loop()
            finally:
                self.counters.loop_cpu_s = process_cpu_s() - cpu0
        finally:
            self._shutdown()
            restore_signals()
        if self.source_failure is not None:
            print(f"gpulse agent: {self.source_failure}", file=self.stream)
            return EXIT_FAILURE
        return EXIT_OK

    def _start_pipeline(self) -> None:
        from gpulse.delivery.pipeline import Delivery
        from gpulse.sinks.factory import build_sinks

        cfg = self.cfg
        sinks = build_sinks(
            cfg.connection if cfg.connection.url else None, cfg.record, cfg.tenant_routes, cfg.tenant_connections
        )
        self.delivery = Delivery(
            sinks,
            spool_dir=cfg.spool_dir,
            spool_max_bytes=cfg.spool_max_bytes,
            max_lines=cfg.max_lines,
            max_bytes=cfg.max_bytes,
            flush_interval=cfg.flush_interval,
            replay_spool_elsewhere=cfg.replay_spool_to_new_destination,
        )
        self.delivery.start()
        if not cfg.no_socket:
            from gpulse.channel.server import TrainingReceiver
            from gpulse.sources.processes import ProcessDescriber

            try:
                self.receiver = TrainingReceiver(
                    cfg.socket_path,
                    cfg.host,
                    self.delivery.submit,
                    group=cfg.socket_group,
                    status=self.snapshot,
                    observe=self.findings.observe if self.findings is not None else None,
                    attribute=ProcessDescriber().job_tags,
                )
                self.receiver.start()
            except OSError as e:
                if e.errno == errno.EADDRINUSE:  # an agent that holds no lock (an older gpulse) listens there
                    raise
                # GPU sampling matters more than the channel: training clients fall back to their file.
                log.error("training channel disabled: cannot open %s: %s", cfg.socket_path, e)
                self.receiver = None

    def _shutdown(self) -> None:
        cfg = self.cfg
        deadline = time.monotonic() + cfg.shutdown_timeout
        if self.status_line is not None:
            self.status_line.close()
        if self.delivery is not None and self.receiver is not None:
            # Give training clients their acks for what is already queued, then close the channel.
            self.delivery.flush(min(1.0, cfg.shutdown_timeout / 2))
        if self.receiver is not None:
            self._safe(self.receiver.close)
        if self.delivery is not None:
            self._submit_self_metrics(time.time_ns())
            self.delivery.close(max(0.1, deadline - time.monotonic()))
        self._safe(self.source.close)
        reading = self.read_counters()
        if cfg.summary_file:
            self._safe(lambda: write_summary(cfg.summary_file or "", self.summary(reading)))
        log.info(
            "stopped (%s): %d samples, %d lines written, %d spooled, %d dropped",
            self.stop_reason or "done",
            reading.samples,
            reading.lines_written,
            reading.lines_spooled,
            reading.lines_dropped,
        )

    @staticmethod
    def _safe(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:  # shutdown must go on: the summary and the spool matter more
            log.exception("error during shutdown")

    # -- the loop ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        cfg = self.cfg
        interval_ns = round(cfg.interval * 1e9)
        selfm_ns = round(cfg.self_metrics_interval * 1e9)
        offset = time.time_ns() - time.monotonic_ns()  # wall = mono + offset
        tick = (time.monotonic_ns() + offset) // interval_ns + 1  # next grid point, in intervals
        end_mono = self.started_mono + cfg.duration if cfg.duration else None
        next_selfm = 0  # wall ns of the next self-metrics point: the first cycle writes one
        next_rate = time.monotonic()
        thread_time = time.thread_time

        while not self._stop.is_set():
            due_mono_ns = tick * interval_ns - offset
            wait_s = (due_mono_ns - time.monotonic_ns()) / 1e9
            if end_mono is not None and time.monotonic() + max(wait_s, 0.0) >= end_mono:
                self.request_stop("duration reached")
                break
            if wait_s > 0:
                self._wake.wait(wait_s)
                self._wake.clear()
                if self._flush_requested:
                    self._flush_requested = False
                    self.delivery.flush(0)
                continue  # re-check stop and the time left
            # Due. If we woke up more than an interval late (starved, stopped), the missed ticks are skipped.
            now_wall = time.monotonic_ns() + offset
            late_ticks = (now_wall - tick * interval_ns) // interval_ns
            c = self.counters
            if late_ticks > 0:
                c.cycles_skipped += late_ticks
                tick += late_ticks
            ts = tick * interval_ns
            t0, c0 = time.perf_counter(), thread_time()
            try:
                self._cycle(ts)
            except Exception as e:  # a source or encoder bug costs this cycle, never the agent
                c.cycle_errors += 1
                _rlog.log(f"cycle-{type(e).__name__}", logging.ERROR, "sampling cycle failed (counted): %r", e)
            c.cycle_cpu_s += thread_time() - c0
            c.cycle_ms = (time.perf_counter() - t0) * 1e3
            c.samples += 1
            fatal = self.source.fatal()
            if fatal is not None:  # only a new process can recover: stop cleanly, exit non-zero
                self.source_failure = fatal
                self.request_stop("GPU source failed")
                break
            stepped = False
            if ts >= next_selfm:
                self._submit_self_metrics(ts)
                next_selfm = (ts // selfm_ns + 1) * selfm_ns
                new_offset = self._check_clock(offset)
                stepped, offset = new_offset != offset, new_offset
            # The next tick is the first grid point after this cycle ended: ticks it overran are skipped.
            nxt = (time.monotonic_ns() + offset) // interval_ns + 1
            if stepped:
                tick, next_selfm = nxt, 0
            else:
                c.cycles_skipped += max(0, nxt - tick - 1)
                tick = max(nxt, tick + 1)
            now = time.monotonic()
            if now >= next_rate:
                next_rate = now + 1.0
                self._rate.add(now, self._delivered())
                if self.status_line is not None:
                    self.status_line.tick()

    def _check_clock(self, offset: int) -> int:
        """Re-align the grid after a wall-clock step (NTP jump, suspend); never counted as skips."""
        new = time.time_ns() - time.monotonic_ns()
        if abs(new - offset) > _CLOCK_STEP_NS:
            log.warning("wall clock stepped by %+.3f s; schedule re-aligned", (new - offset) / 1e9)
            return new
        return offset

    def _cycle(self, ts: int) -> None:
        readings = self._with_gpu_info(self.source.collect(ts), ts)
        if self.receiver is not None and self.receiver.runs_version != self._runs_version:
            self._rebuild_series()
        gpus = self.source.gpus
        if gpus != self._gpus:
            self._gpus = list(gpus)
            self._rebuild_series()
        if self.receiver is not None and any(r.measurement == "gpu" for r in readings):
            self.receiver.note_gpu_jobs(gpu_jobs(readings, self._gpus))
        series = self._series
        points = self.counters.points
        line = self.encoder.line
        lines: list[str] = []
        for r in readings:
            per = series.get(r.gpu)
            if per is None:
                self._unknown_gpu(r.gpu)
                continue
            if r.tags:
                s = self.encoder.series(r.measurement, {**self._base_tags[r.gpu][r.measurement], **r.tags})
            else:
                s = per[r.measurement]
            text = line(s, r.fields, r.ts_ns)
            if text is not None:
                lines.append(text)
                points[r.measurement] = points.get(r.measurement, 0) + 1
            if r.measurement == "gpu" and r.gpu in self._run_gpus and self.findings is not None:  # read by its findings
                self.findings.observe("gpu", self._base_tags[r.gpu]["gpu"], r.fields, r.ts_ns)
        if self.host_sampler is not None:
            lines += self._host_lines(ts)
        lines += self._finding_lines()
        if lines:
            self.counters.lines_submitted += len(lines)
            self.delivery.submit(lines)

    def _finding_lines(self) -> list[str]:
        """The ``train_finding`` points of the rolling findings raised or cleared now (logged by them)."""
        out: list[str] = []
        if self.findings is None:
            return out
        for f in self.findings.evaluate(time.time_ns()):
            if self.receiver is not None:
                self.receiver.tell(f.run, {**f.as_dict(), "host": self.cfg.host})  # for its metrics_report.json
            series = self.encoder.series("train_finding", {"host": self.cfg.host, "run": f.run, "rule": f.rule})
            text = self.encoder.line(series, f.fields(), f.time_ns)
            if text is not None:
                out.append(text)
                self.counters.points["train_finding"] = self.counters.points.get("train_finding", 0) + 1
        return out

    def _host_lines(self, ts: int) -> list[str]:
        """The ``host`` point and a ``host_process`` point per training process the channel names and per worker.

        A failure here is logged (counted) and costs the host points of this cycle only, never the GPUs'."""
        assert self.host_sampler is not None
        try:
            training = self.receiver.training_processes() if self.receiver is not None else []
            node = self.host_sampler.node()
            procs = self.host_sampler.processes(TrainingProcess(*t) for t in training)
        except Exception as e:
            _rlog.log(f"host-{type(e).__name__}", logging.ERROR, "host sampling failed (counted): %r", e)
            return []
        cache = self._process_series
        points = [(self._host_series, node.fields())]
        findings = self.findings
        if findings is not None:
            findings.observe("host", {"host": self.cfg.host}, points[0][1], ts)
        for p in procs:
            job = self.receiver.job_tags(p.run, p.rank) if self.receiver is not None else {}
            key = (p.run, p.rank, p.process, tuple(job.items()))
            series = cache.get(key)
            if series is None:
                if len(cache) >= MAX_PROCESS_SERIES:
                    cache.popitem(last=False)
                tags = {"host": self.cfg.host, **p.tags, **job}
                series = cache[key] = Series(MEASUREMENTS["host_process"], "host_process", tags, self._process_specs)
            else:
                cache.move_to_end(key)
            points.append((series, p.fields()))
            if findings is not None:
                findings.observe("host_process", {"host": self.cfg.host, **p.tags}, points[-1][1], ts)
        out = []
        counts = self.counters.points
        for series, fields in points:
            text = self.encoder.line(series, fields, ts)
            if text is not None:
                out.append(text)
                counts[series.measurement] = counts.get(series.measurement, 0) + 1
        return out

    def _with_gpu_info(self, readings: list[Reading], ts: int) -> list[Reading]:
        """Remember each GPU's latest ``gpu_info``; repeat it (stamped ``ts``) every GPU_INFO_EVERY_S."""
        fresh = [r for r in readings if r.measurement == "gpu_info"]
        if fresh:
            self._gpu_info.update((r.gpu, r) for r in fresh)
            self._gpu_info_due = ts + round(GPU_INFO_EVERY_S * 1e9)
        elif self._gpu_info and ts >= self._gpu_info_due:
            present = {g.index for g in self.source.gpus}
            readings = [*readings, *(r._replace(ts_ns=ts) for r in self._gpu_info.values() if r.gpu in present)]
            self._gpu_info_due = ts + round(GPU_INFO_EVERY_S * 1e9)
        return readings

    def _unknown_gpu(self, index: int) -> None:
        self.counters.readings_unknown_gpu += 1
        if self.counters.readings_unknown_gpu == 1:
            log.warning("dropped a reading for GPU %d, which the source does not list (counted)", index)

    def _rebuild_series(self) -> None:
        runs: dict[str, str] = {}
        if self.receiver is not None:
            self._runs_version = self.receiver.runs_version
            runs = dict(self.receiver.gpu_runs())
        self._runs = runs
        self._run_gpus = {g.index for g in self._gpus if g.uuid in runs}
        host = self.cfg.host
        self._series, self._base_tags = {}, {}
        for g in self._gpus:
            base = {"host": host, "gpu": str(g.index), "uuid": g.uuid, "model": g.model}
            run = runs.get(g.uuid)
            tags_by_m: dict[str, dict[str, str]] = {}
            for m in GPU_MEASUREMENTS:
                tags = dict(base)
                if run and "run" in MEASUREMENTS[m].optional_tags:
                    tags["run"] = run
                tags_by_m[m] = tags
            self._base_tags[g.index] = tags_by_m
            self._series[g.index] = {m: self.encoder.series(m, t) for m, t in tags_by_m.items()}

    # -- self-metrics, status, summary: three views of one reading -----------------------------------
    def _delivered(self) -> int:
        return int(self.delivery.stats().get("lines_written", 0)) if self.delivery is not None else 0

    def read_counters(self) -> Counts:
        """Every counter at once (loop, GPU source, delivery, training channel)."""
        return read(
            self.counters,
            started_mono=self.started_mono,
            gpus=len(self._gpus),
            source=self.source,
            delivery=self.delivery,
            receiver=self.receiver,
            encoder_nonfinite=self.encoder.nonfinite_dropped,
            live_runs_evicted=self.findings.runs_evicted if self.findings is not None else 0,
            host_processes_skipped=self.host_sampler.processes_skipped if self.host_sampler is not None else 0,
        )

    def self_metrics(self) -> dict[str, Any]:
        """The fields of one ``agent`` point (see ``gpulse.schema.AGENT``)."""
        return self.read_counters().agent_point()

    def _submit_self_metrics(self, ts: int) -> None:
        trim_heap()
        text = self.encoder.line(self._agent_series, self.self_metrics(), ts)
        if text is not None:
            c = self.counters
            c.points["agent"] = c.points.get("agent", 0) + 1
            c.lines_submitted += 1
            self.delivery.submit([text])

    def snapshot(self) -> dict[str, Any]:
        """The agent's state for ``gpulse status`` and the live status line (JSON-serialisable)."""
        r = self.read_counters()
        lost = self.source.lost()
        runs = dict(self._runs)
        return {
            "version": __version__,
            "pid": os.getpid(),
            "host": self.cfg.host,
            "started_unix": round(self.started_unix, 3),
            "uptime_s": round(r.uptime_s, 3),
            "interval_s": self.cfg.interval,
            "source": f"simulated {self.cfg.simulate_model}" if self.cfg.simulate else "nvml",
            "gpus": [
                {"index": g.index, "uuid": g.uuid, "model": g.model, "lost": g.index in lost, "run": runs.get(g.uuid)}
                for g in self._gpus
            ],
            "runs": runs,
            "training": [
                {"run": run, "rank": rank, "pid": pid}
                for run, rank, pid in (self.receiver.training_processes() if self.receiver is not None else [])
            ],
            "findings": self.findings.open() if self.findings is not None else {},
            "samples": r.samples,
            "cycles_skipped": r.cycles_skipped,
            "cycle_ms": round(r.cycle_ms, 3),
            "lines_per_s": round(self._rate.per_s, 1),
            "database": self.cfg.connection.describe() if self.cfg.connection.url else None,
            "record": self.cfg.record,
            "spool_dir": self.cfg.spool_dir,
            **r.delivery(),
            "spool_held": [
                {"path": str(h.path), "destination": h.destination, "lines": h.lines, "bytes": h.bytes}
                for h in (self.delivery.held if self.delivery is not None else [])
            ],
            "records_received": r.records_received,
            "records_rejected": r.records_rejected,
        }

    def summary(self, reading: Counts | None = None) -> dict[str, Any]:
        """The final counts, written to ``--summary-file`` at exit."""
        r = reading or self.read_counters()
        c = r.loop
        n = c.samples
        return {
            "reason": self.stop_reason or "done",
            "samples": n,
            "cycles_skipped": c.cycles_skipped,
            "gpus": r.gpus,
            "gpus_lost": r.gpus_lost,
            "points": dict(sorted(c.points.items())),
            "lines_submitted": c.lines_submitted,
            **{k: getattr(r, k) for k in ("lines_written", "lines_spooled", "lines_replayed", "lines_dropped")},
            "lines_rejected": r.lines_rejected,
            "spool_bytes": r.spool_bytes,
            "values_dropped_nonfinite": r.values_dropped_nonfinite,
            "readings_unknown_gpu": c.readings_unknown_gpu,
            "cycle_errors": c.cycle_errors,
            "records_received": r.records_received,
            "records_rejected": r.records_rejected,
            "live_runs_evicted": r.live_runs_evicted,
            "host_processes_skipped": r.host_processes_skipped,
            "training_processes_evicted": r.training_processes_evicted,
            "uptime_s": round(r.uptime_s, 3),
            "cpu_s": round(process_cpu_s(), 3),  # everything, imports and shutdown included
            # steady state: the whole process (all threads) while sampling, per cycle
            "cpu_ms_per_cycle": round(c.loop_cpu_s * 1e3 / n, 3) if n else None,
            # the sampling thread alone (collect + encode + submit), per cycle
            "cycle_cpu_ms": round(c.cycle_cpu_s * 1e3 / n, 3) if n else None,
        }
