"""The NVML source: real NVIDIA GPUs through ``pynvml`` (package ``nvidia-ml-py``).

Life cycle: ``open()`` initialises NVML, probes every GPU into a plan (:mod:`.probe`), starts the
event thread (:mod:`.events`) and, where a GPU lacks the PCIe byte counters, the window reader
(:mod:`.window`). ``collect(now)`` runs the plans: one field-values batch per GPU (the ~10 s and
~60 s tiers and NVLink ride in it when due), the per-cycle calls, GPM from its ping-pong samples,
each MIG device, and processes when due. No call made by ``collect`` has a built-in wait.

Faults never escape ``collect``: every failed call is counted by kind; a GPU that answers
``GpuIsLost`` is marked lost (one ``gpu_event`` kind=gpu_lost) while the others go on; when the
driver disappears for every GPU (``DriverNotLoaded``, ``LibRmVersionMismatch``, ``Uninitialized``)
the source re-initialises NVML with exponential backoff, probes again and writes ``gpu_info``
again (with ``gpu_recovered`` events for GPUs that had been lost).

A driver upgrade cannot be recovered in-process: pynvml's ``nvmlShutdown`` leaves
``libnvidia-ml.so`` loaded and ``_LoadNvmlLibrary`` never loads it again, so ``nvmlInit`` keeps
answering ``LibRmVersionMismatch`` (old library, new kernel module). The source then reports
:meth:`fatal` and the agent exits non-zero; its service manager starts a new process, which maps
the new library.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gpulse import schema
from gpulse.sources.base import GpuIdentity, GpuSource, Reading, SourceUnavailable
from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml.events import EventWatcher
from gpulse.sources.nvml.fields import NVLINK_ACTIVE, field_results
from gpulse.sources.nvml.mig import MigPlan
from gpulse.sources.nvml.probe import (
    PROCESS_ACCESS_ADVICE,
    GpuPlan,
    ProcessAccess,
    mig_info_fields,
    probe_gpu,
    system_info,
)
from gpulse.sources.nvml.procs import ProcessSampler
from gpulse.sources.nvml.window import FIELDS as WINDOW_FIELDS
from gpulse.sources.nvml.window import WindowReader
from gpulse.sources.processes import ProcessDescriber
from gpulse.util.countlog import CountedLog

log = logging.getLogger(__name__)
_rlog = CountedLog(log)

NS = 1_000_000_000
OK, GPU_LOST, DRIVER_GONE = E.ReadOutcome.OK, E.ReadOutcome.GPU_LOST, E.ReadOutcome.DRIVER_GONE
#: Per-link sum and all-links total may differ by this fraction before it is reported.
NVLINK_TOTAL_TOLERANCE = 0.001
DRIVER_UPGRADED = (
    "NVML reports an NVML/RM version mismatch: the NVIDIA kernel driver was upgraded under the running agent. "
    "pynvml cannot load the new libnvidia-ml.so into a running process, so gpulse exits now; a service manager "
    "(systemd Restart=on-failure, Docker's restart policy) starts it again with the new library, or restart it by hand"
)


class NvmlSource(GpuSource):
    """Samples every GPU NVML sees; see the module docstring."""

    def __init__(
        self,
        *,
        medium_interval_s: float = 10.0,
        slow_interval_s: float = 60.0,
        process_interval_s: float = 5.0,
        events: bool = True,
        event_wait_ms: int = 500,  # each timeout costs an exception: 2 wakeups per second, close within 0.5 s
        gpm: bool = True,
        describer: ProcessDescriber | None = None,
        reinit_backoff_s: tuple[float, float] = (1.0, 60.0),
        nvml: Any = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._nv = nvml
        self.medium_ns = int(medium_interval_s * NS)
        self.slow_ns = int(slow_interval_s * NS)
        self.process_ns = int(process_interval_s * NS)
        self.events_enabled = events
        self.event_wait_ms = event_wait_ms
        self.gpm_enabled = gpm
        self._clock = clock_ns
        self._describer = describer
        self.backoff_min_ns = int(reinit_backoff_s[0] * NS)
        self.backoff_max_ns = int(reinit_backoff_s[1] * NS)
        self._plans: list[GpuPlan] = []
        self._live: list[GpuPlan] = []
        self._lost: set[int] = set()
        self._lost_uuids: set[str] = set()
        self._counts = dict.fromkeys(schema.NVML_ERROR_KINDS, 0)
        self._count_lock = threading.Lock()
        self._pending: deque[Reading] = deque()
        self._info_due = False
        self._due = {"medium": 0, "slow": 0, "process": 0}
        self._watcher: EventWatcher | None = None
        self._window: WindowReader | None = None
        self._procs: ProcessSampler | None = None
        self._driver_gone = False
        self._reinit_at = 0
        self._backoff_ns = self.backoff_min_ns
        self._opened = False
        self._fatal: str | None = None
        self.reinits = 0

    # -- GpuSource -------------------------------------------------------------------------------
    def open(self) -> list[GpuIdentity]:
        if self._nv is None:
            import pynvml

            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except E.nvml_errors(nv) as e:
            raise SourceUnavailable(_unavailable_message(e)) from e
        except OSError as e:  # a broken libnvidia-ml.so
            raise SourceUnavailable(f"NVML could not be loaded ({e}); check the NVIDIA driver installation") from e
        self._opened = True
        try:
            self._probe_all()
        except E.nvml_errors(nv) as e:
            self._release()
            self._shutdown_quietly()
            raise SourceUnavailable(_unavailable_message(e)) from e
        if not self._plans and not self._lost:
            self._shutdown_quietly()
            raise SourceUnavailable("NVML reports no GPUs on this machine (use --simulate N to run without one)")
        return self.gpus

    @property
    def gpus(self) -> list[GpuIdentity]:
        return [p.identity for p in self._plans]

    def error_counts(self) -> dict[str, int]:
        with self._count_lock:
            return dict(self._counts)

    def lost(self) -> set[int]:
        return set(self._lost)

    def fatal(self) -> str | None:
        return self._fatal

    def close(self) -> None:
        self._release()
        if self._opened:
            self._shutdown_quietly()
            self._opened = False

    def _release(self) -> None:
        """Stop the threads and free the NVML allocations (GPM samples, event set), driver or not."""
        self._stop_threads()
        for p in self._plans:
            p.close()

    # -- collect ---------------------------------------------------------------------------------
    def collect(self, now_ns: int) -> list[Reading]:
        try:
            return self._collect(now_ns)
        except Exception:  # the contract: never raises; a bug here must not stop the agent
            log.exception("NVML collect failed")
            self._count(-1)
            return self._drain([])

    def _collect(self, now_ns: int) -> list[Reading]:
        out: list[Reading] = []
        if self._driver_gone:
            if self._fatal is not None or now_ns < self._reinit_at or not self._reinit(now_ns):
                return self._drain(out)
        if self._info_due:
            self._info_due = False
            for p in self._plans:
                out.append(Reading("gpu_info", p.index, p.info_fields(), now_ns))
                out.extend(Reading("gpu_info", p.index, mig_info_fields(p, m), now_ns, m.tags) for m in p.migs)
        medium = now_ns >= self._due["medium"]
        slow = now_ns >= self._due["slow"]
        procs = now_ns >= self._due["process"]
        if medium:
            self._due["medium"] = now_ns + self.medium_ns
        if slow:
            self._due["slow"] = now_ns + self.slow_ns
        if procs:
            self._due["process"] = now_ns + self.process_ns
        if medium and self._window is not None:
            self._withdraw_window(now_ns)
        gone = 0
        for plan in self._live:
            status = self._sample_gpu(plan, now_ns, medium, slow, out)
            if status is OK and procs and (plan.proc_lists or plan.proc_util or plan.migs):
                status = self._processes(plan, now_ns, out)
            if status is DRIVER_GONE:
                gone += 1
        if any(p.index in self._lost for p in self._live):
            for p in self._live:
                if p.index in self._lost:
                    p.close()
            self._live = [p for p in self._live if p.index not in self._lost]
        if gone and gone >= len(self._live):
            self._enter_reinit(now_ns)
        return self._drain(out)

    def _sample_gpu(self, plan: GpuPlan, now_ns: int, medium: bool, slow: bool, out: list[Reading]) -> E.ReadOutcome:
        """One GPU's cycle: the ``gpu`` reading (and NVLink, MIG devices) appended to ``out``."""
        fields: dict[str, Any] = {}
        links: list[Reading] = []
        status = self._read_fields(plan, medium, slow, now_ns, fields, links)
        for tier, due in (("fast", True), ("medium", medium), ("slow", slow)):
            if due and status is OK:
                status = self._run_calls(plan, plan.calls[tier], plan.handle, fields)
        if status is OK and plan.gpm is not None:
            status = self._gpm(plan, plan.gpm, fields, now_ns, None)
        if status is OK and medium and self._window is not None and plan.pcie_window:
            fresh = self._window.take(plan.index)
            if fresh:
                fields.update(fresh)
        if status is GPU_LOST:  # a GPU lost mid-cycle: its partial values are not trusted
            return status
        if fields:  # tagged with the job holding the GPU, as of the last process sample
            held = self._procs.holders.get(plan.index) if self._procs is not None else None
            out.append(Reading("gpu", plan.index, fields, now_ns, held or None))
        out.extend(links)
        for m in plan.migs:
            if status is OK:
                status = self._sample_mig(plan, m, now_ns, out)
        return status

    def _sample_mig(self, plan: GpuPlan, m: MigPlan, now_ns: int, out: list[Reading]) -> E.ReadOutcome:
        fields: dict[str, Any] = {}
        status = OK
        if m.memory is not None:
            status = self._run_calls(plan, [("memory", m.memory)], m.handle, fields)
        if status is OK and m.gpm is not None:
            status = self._gpm(plan, m.gpm, fields, now_ns, m)
        if fields and status is not GPU_LOST:
            out.append(Reading("gpu", plan.index, fields, now_ns, m.tags))
        return status

    def _withdraw_window(self, now_ns: int) -> None:
        """GPUs whose PCIe window call turned out unsupported: the fields go, gpu_info says so."""
        for index in self._window.unsupported():  # type: ignore[union-attr]
            for p in self._plans:
                if p.index == index:
                    p.pcie_window = False
                    p.supported.difference_update(WINDOW_FIELDS)
                    self._pending.append(Reading("gpu_info", p.index, p.info_fields(), now_ns))

    def _drain(self, out: list[Reading]) -> list[Reading]:
        pending = self._pending
        while pending:
            out.append(pending.popleft())
        return out

    def _read_fields(
        self, plan: GpuPlan, medium: bool, slow: bool, now_ns: int, out: dict[str, Any], links: list[Reading]
    ) -> E.ReadOutcome:
        """The cycle's one field-values call: values, counter rates, NVLink per link and totals."""
        batch = plan.batches.get((medium, slow))
        if batch is None or not batch.fids:
            return OK
        nv = self._nv
        try:
            values = nv.nvmlDeviceGetFieldValues(plan.handle, batch.fids)
        except Exception as e:
            return self._fail(plan, e)
        results = list(field_results(nv, values))
        for (ret, v, _ts), (name, scale) in zip(results, batch.values, strict=False):
            if ret == 0:
                out[name] = v * scale if scale is not None else v
            else:
                status = self._fail_code(plan, ret)
                if status is not OK:
                    return status
        at = len(batch.values)
        for (ret, v, ts), name in zip(results[at:], batch.rates, strict=False):
            if ret == 0:
                self._rate(plan, name, v, ts, out)
            else:
                status = self._fail_code(plan, ret)
                if status is not OK:
                    return status
        at += len(batch.rates)
        if batch.links:
            return self._nvlink(plan, batch.links, batch.link_totals, results[at:], now_ns, out, links)
        return OK

    @staticmethod
    def _rate(plan: GpuPlan, name: str, value: int, ts_us: int, out: dict[str, Any]) -> None:
        """A byte counter as bytes/s since its previous read (the entries' own timestamps); a counter
        that went backwards wrapped ("Value can be wrapped") and yields no value this cycle."""
        prev = plan.rate_prev.get(name)
        plan.rate_prev[name] = (value, ts_us)
        if prev is not None and ts_us > prev[1] and value >= prev[0]:
            out[name] = (value - prev[0]) * 1e6 / (ts_us - prev[1])

    def _nvlink(
        self,
        plan: GpuPlan,
        link_ids: list[int],
        with_totals: bool,
        results: list[tuple[int, Any, int]],
        now_ns: int,
        fields: dict[str, Any],
        out: list[Reading],
    ) -> E.ReadOutcome:
        """Per-link counters and state from the batch; the GPU totals from the all-links scope,
        checked against the sum of the links (else the sum, when every link answered)."""
        tx_sum = rx_sum = 0
        complete = True
        for i, link in enumerate(link_ids):
            f: dict[str, Any] = {}
            for (ret, v, _ts), name in zip(results[3 * i : 3 * i + 3], ("tx_kib", "rx_kib", "active"), strict=True):
                if ret == 0:
                    f[name] = (1 if v == NVLINK_ACTIVE else 0) if name == "active" else v
                else:
                    complete = complete and name == "active"  # a link without counters spoils the sum
                    status = self._fail_code(plan, ret)
                    if status is not OK:
                        return status
            tx_sum += f.get("tx_kib", 0)
            rx_sum += f.get("rx_kib", 0)
            if f:
                out.append(Reading("gpu_nvlink", plan.index, f, now_ns, {"link": str(link)}))
        totals = results[3 * len(link_ids) : 3 * len(link_ids) + 2] if with_totals else []
        if len(totals) == 2 and totals[0][0] == 0 and totals[1][0] == 0:
            tx, rx = totals[0][1], totals[1][1]
            if complete and not (_close(tx, tx_sum) and _close(rx, rx_sum)):
                _rlog.log(
                    f"nvlink-sum-{plan.index}",
                    logging.WARNING,
                    "GPU %d: NVLink all-links counters (tx %d, rx %d KiB) differ from the sum of its links "
                    "(tx %d, rx %d KiB); the all-links values are written",
                    plan.index, tx, rx, tx_sum, rx_sum,
                )  # fmt: skip
            fields["nvlink_tx_kib"], fields["nvlink_rx_kib"] = tx, rx
        elif complete:  # a total over some links only would look like a counter reset
            fields["nvlink_tx_kib"], fields["nvlink_rx_kib"] = tx_sum, rx_sum
        return OK

    def _run_calls(
        self, plan: GpuPlan, calls: list[tuple[str, Any]], handle: Any, out: dict[str, Any]
    ) -> E.ReadOutcome:
        for _label, fn in calls:
            try:
                fn(handle, out)
            except Exception as e:
                status = self._fail(plan, e)
                if status is not OK:
                    return status
        return OK

    def _gpm(self, plan: GpuPlan, gpm: Any, out: dict[str, Any], now_ns: int, mig: MigPlan | None) -> E.ReadOutcome:
        try:
            failed = gpm.sample(out)
        except Exception as e:
            gpm.restart()
            return self._fail(plan, e)
        if failed:
            self._count_n("other", failed)
        if gpm.dropped:
            supported = mig.supported if mig is not None else plan.supported
            supported.difference_update(gpm.dropped)
            gpm.dropped = []
            info = mig_info_fields(plan, mig) if mig is not None else plan.info_fields()
            self._pending.append(Reading("gpu_info", plan.index, info, now_ns, mig.tags if mig else None))
        return OK

    def _processes(self, plan: GpuPlan, now_ns: int, out: list[Reading]) -> E.ReadOutcome:
        if self._procs is None:
            self._procs = ProcessSampler(self._nv, self._describer or ProcessDescriber(), self.process_ns // 1000)
        try:
            out.extend(self._procs.sample(plan, now_ns))
        except Exception as e:
            return self._fail(plan, e)
        return OK

    # -- faults ----------------------------------------------------------------------------------
    def _count(self, code: int) -> None:
        self._count_n(E.kind_of(code), 1)

    def _count_n(self, kind: str, n: int) -> None:
        with self._count_lock:
            self._counts[kind] += n

    def _fail(self, plan: GpuPlan, exc: BaseException) -> E.ReadOutcome:
        if not isinstance(exc, E.nvml_errors(self._nv)):
            log.debug("GPU %d: unexpected %r", plan.index, exc)
        return self._fail_code(plan, E.code_of(exc))

    def _fail_code(self, plan: GpuPlan, code: int) -> E.ReadOutcome:
        self._count(code)
        status = E.outcome_of(code)
        if status is GPU_LOST:
            self._mark_lost(plan)
        return status

    def _mark_lost(self, plan: GpuPlan) -> None:
        if plan.index in self._lost:
            return
        self._lost.add(plan.index)
        self._lost_uuids.add(plan.identity.uuid)
        log.error(
            "GPU %d (%s) is lost (fell off the bus?); the other GPUs keep being sampled", plan.index, plan.identity.uuid
        )
        fields = {"kind": "gpu_lost", "xid": 0, "data": 0, "text": "GPU is lost: NVML returned GpuIsLost"}
        self._pending.append(Reading("gpu_event", plan.index, fields, time.time_ns()))

    # -- (re)initialisation ----------------------------------------------------------------------
    def _probe_all(self) -> None:
        """Probe every GPU; a GPU that is lost during the probe is recorded as lost."""
        nv = self._nv
        system = system_info(nv)
        count = nv.nvmlDeviceGetCount()
        plans: list[GpuPlan] = []
        lost: set[int] = set()
        self._plans = plans  # what is probed so far is freed if a later GPU takes the driver down
        for i in range(count):
            try:
                plan = probe_gpu(nv, i, system, want_gpm=self.gpm_enabled, gpm_clock=self._clock)
                plans.append(plan)
                if plan.process_access is ProcessAccess.NO_PERMISSION:
                    log.warning("GPU %d: %s", i, PROCESS_ACCESS_ADVICE[plan.process_access.value])
                for code in plan.probe_errors:
                    self._count(code)
            except E.nvml_errors(nv) as e:
                code = E.code_of(e)
                self._count(code)
                if code in E.DRIVER_GONE:
                    raise
                log.error("GPU %d cannot be probed (%s); it is left out", i, e)
                lost.add(i)
        self._lost = lost
        self._live = list(plans)
        self._info_due = True
        self._due = {"medium": 0, "slow": 0, "process": 0}
        self._start_threads()

    def _start_threads(self) -> None:
        if self.events_enabled and self._plans:
            self._watcher = EventWatcher(
                self._nv,
                [(p.index, p.handle) for p in self._plans],
                self._pending.append,
                self._count,
                wait_ms=self.event_wait_ms,
            )
            if not self._watcher.start():
                self._watcher = None
        slow = [(p.index, p.handle) for p in self._plans if p.pcie_window]
        if slow:
            self._window = WindowReader(self._nv, slow, self._count, interval_s=self.medium_ns / NS)
            self._window.start()

    def _stop_threads(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._window is not None:
            self._window.stop()
            self._window = None

    def _enter_reinit(self, now_ns: int) -> None:
        log.warning("NVML driver went away on every GPU; re-initialising with backoff")
        self._driver_gone = True
        self._release()
        self._live = []
        self._backoff_ns = self.backoff_min_ns
        self._reinit_at = now_ns + self._backoff_ns

    def _reinit(self, now_ns: int) -> bool:
        nv = self._nv
        self._shutdown_quietly()
        try:
            nv.nvmlInit()
            self._probe_all()
        except Exception as e:
            code = E.code_of(e)
            self._count(code)
            self._release()
            if code == E.LIB_RM_VERSION_MISMATCH:
                self._fatal = DRIVER_UPGRADED
                log.error("%s", DRIVER_UPGRADED)
                return False
            self._backoff_ns = min(self._backoff_ns * 2, self.backoff_max_ns)
            self._reinit_at = now_ns + self._backoff_ns
            log.info("NVML re-init failed (%s); next try in %.0f s", e, self._backoff_ns / NS)
            return False
        self._driver_gone = False
        self.reinits += 1
        log.warning("NVML re-initialised: %d GPU(s)", len(self._plans))
        ts = time.time_ns()
        for p in self._plans:
            if p.identity.uuid in self._lost_uuids and p.index not in self._lost:
                self._lost_uuids.discard(p.identity.uuid)
                fields = {"kind": "gpu_recovered", "xid": 0, "data": 0, "text": "GPU answers again after NVML re-init"}
                self._pending.append(Reading("gpu_event", p.index, fields, ts))
        return True

    def _shutdown_quietly(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass


def _close(a: int, b: int) -> bool:
    return abs(a - b) <= NVLINK_TOTAL_TOLERANCE * max(abs(a), abs(b), 1)


def _unavailable_message(e: BaseException) -> str:
    code = E.code_of(e)
    if code == E.LIBRARY_NOT_FOUND:
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine (use --simulate N to run without a GPU)"
    if code == E.DRIVER_NOT_LOADED:
        return "the NVIDIA driver is not loaded (check `nvidia-smi`; use --simulate N to run without a GPU)"
    if code == E.LIB_RM_VERSION_MISMATCH:
        return (
            "NVML and the kernel driver versions differ (driver upgraded without reload): reload the driver or reboot"
        )
    if code == E.NO_PERMISSION:
        return "no permission to use NVML: run the agent as a user that can open /dev/nvidia*"
    return f"NVML cannot start: {e}"
