"""The agent's counters in one place: what the loop counts, and one reading of everything at once.

Three views read the same :class:`Counts`: the ``agent`` point written every self-metrics interval
(its fields are exactly ``gpulse.schema.AGENT``'s, in that order), the ``gpulse status`` snapshot,
and the final summary (``--summary-file``) written at exit. A counter added here and to the schema shows up
in all three; one in the schema without a source here fails at the first reading (and in the tests).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulse.schema import AGENT, NVML_ERROR_KINDS

log = logging.getLogger("gpulse.agent")

#: delivery's counters (``Delivery.stats()``), the same names in the schema, the snapshot and the summary
DELIVERY_COUNTS = (
    "lines_written",
    "lines_spooled",
    "lines_replayed",
    "lines_dropped",
    "lines_rejected",
    "spool_damaged_lines",
    "spool_damaged_bytes",
)
DELIVERY_GAUGES = ("spool_bytes", "buffer_lines", "write_latency_ms", "last_write_age_s", "last_write_unix")
_NVML_PREFIX = "nvml_errors_"


@dataclass
class LoopCounters:
    """What the sampling loop counts; only the loop's thread writes them."""

    samples: int = 0
    cycles_skipped: int = 0
    #: wall time of the last cycle
    cycle_ms: float = 0.0
    #: the sampling thread's CPU time over all cycles
    cycle_cpu_s: float = 0.0
    #: the whole process's CPU time while the loop ran
    loop_cpu_s: float = 0.0
    points: dict[str, int] = field(default_factory=dict)
    lines_submitted: int = 0
    readings_unknown_gpu: int = 0
    cycle_errors: int = 0


@dataclass(frozen=True)
class Counts:
    """Every counter of the agent at one instant: the loop's, the GPU source's, delivery's and the
    training channel's."""

    loop: LoopCounters
    uptime_s: float
    gpus: int
    gpus_lost: int
    nvml_errors: dict[str, int]
    lines_written: int
    lines_spooled: int
    lines_replayed: int
    lines_dropped: int
    lines_rejected: int
    #: lines and bytes lost to spool damage found at replay
    spool_damaged_lines: int
    spool_damaged_bytes: int
    spool_bytes: int
    buffer_lines: int
    write_latency_ms: float | None
    last_write_age_s: float | None
    last_write_unix: float | None
    records_received: int
    records_rejected: int
    runs_registered: int
    #: NaN/Inf values dropped, by the agent's encoder and by the training channel's validator
    values_dropped_nonfinite: int
    #: runs the rolling findings forgot for a newer one, and process samples the host sampler skipped
    #: (what the agent keeps per run and per process is bounded)
    live_runs_evicted: int
    host_processes_skipped: int
    #: processes named by runs' start points that the training channel forgot for newer ones
    training_processes_evicted: int

    @property
    def samples(self) -> int:
        return self.loop.samples

    @property
    def cycles_skipped(self) -> int:
        return self.loop.cycles_skipped

    @property
    def cycle_ms(self) -> float:
        return self.loop.cycle_ms

    def agent_point(self) -> dict[str, Any]:
        """The fields of one ``agent`` point: the schema's, in its order."""
        out: dict[str, Any] = {}
        for f in AGENT.fields:
            name = f.name
            out[name] = (
                self.nvml_errors[name[len(_NVML_PREFIX) :]] if name.startswith(_NVML_PREFIX) else getattr(self, name)
            )
        return out

    def delivery(self) -> dict[str, Any]:
        """Delivery's counters and gauges by name (the snapshot and the summary list them)."""
        return {k: getattr(self, k) for k in (*DELIVERY_COUNTS, *DELIVERY_GAUGES)}


def read(
    loop: LoopCounters,
    *,
    started_mono: float,
    gpus: int,
    source: Any,
    delivery: Any | None,
    receiver: Any | None,
    encoder_nonfinite: int,
    live_runs_evicted: int = 0,
    host_processes_skipped: int = 0,
) -> Counts:
    """One :class:`Counts` from the agent's parts (delivery and the receiver may be absent)."""
    d: Mapping[str, Any] = delivery.stats() if delivery is not None else {}
    rs = _receiver_stats(receiver)
    errors = dict.fromkeys(NVML_ERROR_KINDS, 0)
    for kind, n in source.error_counts().items():
        errors[kind if kind in errors else "other"] += n
    dropped_by_channel = int((rs.get("values_dropped_by_cause") or {}).get("nonfinite", 0))
    return Counts(
        loop=dataclasses.replace(loop, points=dict(loop.points)),
        uptime_s=time.monotonic() - started_mono,
        gpus=gpus,
        gpus_lost=len(source.lost()),
        nvml_errors=errors,
        **{k: int(d.get(k) or 0) for k in (*DELIVERY_COUNTS, "spool_bytes", "buffer_lines")},
        write_latency_ms=d.get("write_latency_ms"),
        last_write_age_s=d.get("last_write_age_s"),
        last_write_unix=d.get("last_write_unix"),
        records_received=int(rs.get("records_received", 0)),
        records_rejected=int(rs.get("records_rejected", 0)),
        runs_registered=int(rs.get("runs_registered", 0)),
        training_processes_evicted=int(rs.get("processes_evicted", 0)),
        values_dropped_nonfinite=encoder_nonfinite + dropped_by_channel,
        live_runs_evicted=live_runs_evicted,
        host_processes_skipped=host_processes_skipped,
    )


def _receiver_stats(receiver: Any | None) -> dict[str, Any]:
    if receiver is None:
        return {}
    try:
        return dict(receiver.stats())
    except Exception:  # a broken receiver must not take the self-metrics down with it
        log.exception("training receiver stats failed")
        return {}
