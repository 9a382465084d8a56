"""One registry of the agent's counters: the ``agent`` point, ``gpulse status`` and the final summary
are three views of one reading, so they cannot disagree or drift from the schema."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from support.waiting import wait_until
from test_agent import final_summary, make_cfg

from gpulse.agent.counters import LoopCounters, read
from gpulse.agent.loop import Agent
from gpulse.schema import AGENT
from gpulse.sources.simulated import SimulatedSource


class _Delivery:
    """Delivery's ``stats()`` as :class:`gpulse.delivery.pipeline.Delivery` returns it."""

    def stats(self) -> dict:
        return {"lines_written": 90, "lines_spooled": 7, "lines_replayed": 5, "lines_dropped": 2, "lines_rejected": 1,
                "spool_damaged_lines": 6, "spool_damaged_bytes": 300, "spool_bytes": 4096, "buffer_lines": 3, "write_latency_ms": 1.5, "last_write_age_s": 0.4,
                "last_write_unix": 1.7e9}  # fmt: skip


class _Receiver:
    def stats(self) -> dict:
        return {"records_received": 12, "records_rejected": 2, "runs_registered": 1,
                "values_dropped_by_cause": {"nonfinite": 4}}  # fmt: skip


def test_the_agent_point_has_exactly_the_schema_s_fields_in_its_order() -> None:
    source = SimulatedSource(2)
    source.open()
    loop = LoopCounters(samples=10, cycles_skipped=1, cycle_ms=0.7)
    r = read(
        loop, started_mono=0.0, gpus=2, source=source, delivery=_Delivery(), receiver=_Receiver(), encoder_nonfinite=3
    )
    point = r.agent_point()
    assert list(point) == [f.name for f in AGENT.fields]
    assert point["samples"] == 10 and point["lines_written"] == 90 and point["records_received"] == 12
    assert point["values_dropped_nonfinite"] == 3 + 4  # the encoder's and the training channel's
    assert point["gpus"] == 2 and point["runs_registered"] == 1 and point["write_latency_ms"] == 1.5


def test_without_delivery_or_receiver_the_counts_are_zero_and_the_times_unknown() -> None:
    source = SimulatedSource(1)
    source.open()
    r = read(LoopCounters(), started_mono=0.0, gpus=1, source=source, delivery=None, receiver=None, encoder_nonfinite=0)
    assert r.lines_written == 0 and r.records_received == 0 and r.last_write_age_s is None


def test_status_self_metrics_and_summary_read_the_same_counters(tmp_path: Path) -> None:
    sock = str(tmp_path / "agent.sock")
    cfg = make_cfg(tmp_path, "--simulate", "2", "--interval", "0.1", "--socket", sock, "--self-metrics-interval", "0.1")
    out = io.StringIO()
    agent = Agent(cfg, stream=out, tty=False)
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        wait_until(lambda: agent.counters.samples >= 5, what="5 samples")
        agent.request_stop()
    finally:
        thread.join(timeout=30)
    summary = final_summary(cfg)
    status = agent.snapshot()
    point = agent.self_metrics()
    for key in ("samples", "cycles_skipped", "lines_written", "lines_spooled", "records_received"):
        assert summary[key] == status[key] == point[key], key
    assert summary["gpus"] == point["gpus"] == len(status["gpus"]) == 2
    json.dumps(status)  # the status reply is JSON
