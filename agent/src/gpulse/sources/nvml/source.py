"""The NVML source: real NVIDIA GPUs through ``pynvml`` (package ``nvidia-ml-py``).

Life cycle: ``open()`` initialises NVML, probes every GPU into a plan (:mod:`.nvml_probe`) and
starts the event thread (:mod:`.nvml_events`). ``collect(now)`` runs the plans: the fast tier
every cycle, the ~10 s and ~60 s tiers and processes when due, GPM from its ping-pong samples.

Faults never escape ``collect``: every failed call is counted by kind; a GPU that answers
``GpuIsLost`` is marked lost (one ``gpu_event`` kind=gpu_lost) while the others go on; when the
driver disappears for every GPU (``DriverNotLoaded``, ``LibRmVersionMismatch``, ``Uninitialized``)
the source re-initialises NVML with exponential backoff, probes again and writes ``gpu_info``
again (with ``gpu_recovered`` events for GPUs that had been lost).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from gpulse import schema
from gpulse.sources.base import GpuIdentity, GpuSource, Reading, SourceUnavailable
from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml.events import EventWatcher
from gpulse.sources.nvml.probe import GpuPlan, Tier, field_results, probe_gpu, system_info
from gpulse.sources.nvml.procs import ProcessSampler
from gpulse.sources.processes import ProcessDescriber

log = logging.getLogger(__name__)

NS = 1_000_000_000


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
    ) -> None:
        self._nv = nvml
        self.medium_ns = int(medium_interval_s * NS)
        self.slow_ns = int(slow_interval_s * NS)
        self.process_ns = int(process_interval_s * NS)
        self.events_enabled = events
        self.event_wait_ms = event_wait_ms
        self.gpm_enabled = gpm
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
        self._procs: ProcessSampler | None = None
        self._driver_gone = False
        self._reinit_at = 0
        self._backoff_ns = self.backoff_min_ns
        self._opened = False
        self.reinits = 0

    # -- GpuSource -------------------------------------------------------------------------------
    def open(self) -> list[GpuIdentity]:
        if self._nv is None:
            import pynvml

            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise SourceUnavailable(_unavailable_message(e)) from e
        except OSError as e:  # a broken libnvidia-ml.so
            raise SourceUnavailable(f"NVML could not be loaded ({e}); check the NVIDIA driver installation") from e
        self._opened = True
        try:
            self._probe_all()
        except nv.NVMLError as e:
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

    def close(self) -> None:
        self._stop_events()
        for p in self._plans:
            if p.gpm is not None:
                p.gpm.close()
        if self._opened:
            self._shutdown_quietly()
            self._opened = False

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
            if now_ns < self._reinit_at or not self._reinit(now_ns):
                return self._drain(out)
        if self._info_due:
            self._info_due = False
            out.extend(Reading("gpu_info", p.index, p.info_fields(), now_ns) for p in self._plans)
        medium = now_ns >= self._due["medium"]
        slow = now_ns >= self._due["slow"]
        procs = now_ns >= self._due["process"]
        if medium:
            self._due["medium"] = now_ns + self.medium_ns
        if slow:
            self._due["slow"] = now_ns + self.slow_ns
        if procs:
            self._due["process"] = now_ns + self.process_ns
        gone = 0
        for plan in self._live:
            fields: dict[str, Any] = {}
            status = self._read_tier(plan, plan.tiers["fast"], fields)
            if status == 0 and plan.gpm is not None:
                status = self._gpm(plan, now_ns, fields)
            if status == 0 and medium:
                status = self._read_tier(plan, plan.tiers["medium"], fields)
                if status == 0 and plan.links:
                    status = self._nvlink(plan, now_ns, fields, out)
            if status == 0 and slow:
                status = self._read_tier(plan, plan.tiers["slow"], fields)
            if fields and status != 1:  # a GPU lost mid-cycle: its partial values are not trusted
                out.append(Reading("gpu", plan.index, fields, now_ns))
            if status == 0 and procs and (plan.proc_lists or plan.proc_util):
                status = self._processes(plan, now_ns, out)
            if status == 2:
                gone += 1
        if any(p.index in self._lost for p in self._live):
            for p in self._live:
                if p.index in self._lost and p.gpm is not None:
                    p.gpm.close()
                    p.gpm = None
            self._live = [p for p in self._live if p.index not in self._lost]
        if gone and gone >= len(self._live):
            self._enter_reinit(now_ns)
        return self._drain(out)

    def _drain(self, out: list[Reading]) -> list[Reading]:
        pending = self._pending
        while pending:
            out.append(pending.popleft())
        return out

    def _read_tier(self, plan: GpuPlan, tier: Tier, out: dict[str, Any]) -> int:
        """Read one tier into ``out``; 0 = fine, 1 = GPU lost, 2 = driver gone."""
        h = plan.handle
        if tier.fids:
            try:
                values = self._nv.nvmlDeviceGetFieldValues(h, tier.fids)
            except Exception as e:
                status = self._fail(plan, e)
                if status:
                    return status
            else:
                for (ret, v), (name, scale) in zip(field_results(self._nv, values), tier.fmap, strict=True):
                    if ret == 0:
                        out[name] = v * scale if scale is not None else v
                    else:
                        status = self._fail_code(plan, ret)
                        if status:
                            return status
        for _label, fn in tier.calls:
            try:
                fn(h, out)
            except Exception as e:
                status = self._fail(plan, e)
                if status:
                    return status
        return 0

    def _gpm(self, plan: GpuPlan, now_ns: int, out: dict[str, Any]) -> int:
        gpm = plan.gpm
        try:
            failed = gpm.sample(now_ns, out)  # type: ignore[union-attr]
        except Exception as e:
            gpm.restart()  # type: ignore[union-attr]
            return self._fail(plan, e)
        if failed:
            self._count_n("other", failed)
        if gpm.dropped:  # type: ignore[union-attr]
            plan.supported.difference_update(gpm.dropped)  # type: ignore[union-attr]
            gpm.dropped = []  # type: ignore[union-attr]
            self._pending.append(Reading("gpu_info", plan.index, plan.info_fields(), now_ns))
        return 0

    def _nvlink(self, plan: GpuPlan, now_ns: int, fields: dict[str, Any], out: list[Reading]) -> int:
        nv = self._nv
        try:
            values = nv.nvmlDeviceGetFieldValues(plan.handle, plan.link_fids)
        except Exception as e:
            return self._fail(plan, e)
        results = list(field_results(nv, values))
        tx_total = rx_total = 0
        complete = True
        for i, link in enumerate(plan.links):
            (tx_ret, tx), (rx_ret, rx) = results[2 * i], results[2 * i + 1]
            f: dict[str, Any] = {}
            if tx_ret == 0:
                f["tx_kib"] = tx
                tx_total += tx
            else:
                complete = False
                self._count(tx_ret)
            if rx_ret == 0:
                f["rx_kib"] = rx
                rx_total += rx
            else:
                complete = False
                self._count(rx_ret)
            try:
                f["active"] = 1 if nv.nvmlDeviceGetNvLinkState(plan.handle, link) else 0
            except Exception as e:
                status = self._fail(plan, e)
                if status:
                    return status
            if f:
                out.append(Reading("gpu_nvlink", plan.index, f, now_ns, {"link": str(link)}))
        if complete:  # a total over some links only would look like a counter reset
            fields["nvlink_tx_kib"] = tx_total
            fields["nvlink_rx_kib"] = rx_total
        return 0

    def _processes(self, plan: GpuPlan, now_ns: int, out: list[Reading]) -> int:
        if self._procs is None:
            self._procs = ProcessSampler(self._nv, self._describer or ProcessDescriber(), self.process_ns // 1000)
        try:
            out.extend(self._procs.sample(plan, now_ns))
        except Exception as e:
            return self._fail(plan, e)
        return 0

    # -- faults ----------------------------------------------------------------------------------
    def _count(self, code: int) -> None:
        self._count_n(E.kind_of(code), 1)

    def _count_n(self, kind: str, n: int) -> None:
        with self._count_lock:
            self._counts[kind] += n

    def _fail(self, plan: GpuPlan, exc: BaseException) -> int:
        if not isinstance(exc, self._nv.NVMLError):
            log.debug("GPU %d: unexpected %r", plan.index, exc)
        return self._fail_code(plan, E.code_of(exc))

    def _fail_code(self, plan: GpuPlan, code: int) -> int:
        self._count(code)
        if code in E.LOST:
            self._mark_lost(plan)
            return 1
        if code in E.DRIVER_GONE:
            return 2
        return 0

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
        for i in range(count):
            try:
                plan = probe_gpu(nv, i, system, want_gpm=self.gpm_enabled)
                plans.append(plan)
                for code in plan.probe_errors:
                    self._count(code)
            except nv.NVMLError as e:
                code = E.code_of(e)
                self._count(code)
                if code in E.DRIVER_GONE:
                    raise
                log.error("GPU %d cannot be probed (%s); it is left out", i, e)
                lost.add(i)
        self._plans = plans
        self._lost = lost
        self._live = list(plans)
        self._info_due = True
        self._due = {"medium": 0, "slow": 0, "process": 0}
        self._start_events()

    def _start_events(self) -> None:
        if not self.events_enabled or not self._plans:
            return
        self._watcher = EventWatcher(
            self._nv,
            [(p.index, p.handle) for p in self._plans],
            self._pending.append,
            self._count,
            wait_ms=self.event_wait_ms,
        )
        if not self._watcher.start():
            self._watcher = None

    def _stop_events(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _enter_reinit(self, now_ns: int) -> None:
        log.warning("NVML driver went away on every GPU; re-initialising with backoff")
        self._driver_gone = True
        self._stop_events()
        for p in self._plans:
            if p.gpm is not None:
                p.gpm.close()
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
            self._count(E.code_of(e))
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
