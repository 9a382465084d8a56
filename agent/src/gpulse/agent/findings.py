"""The agent's rolling findings: one :class:`~gpulse.report.live.RollingFindings` per run on this node.

The training channel hands every accepted ``train_step`` and ``train_run`` point to :meth:`LiveFindings.observe`
(its reader thread), and the sampling loop its ``host`` and ``host_process`` points and the ``gpu``
points of the GPUs each run registered; the agent's sampling loop calls :meth:`LiveFindings.evaluate` once per cycle, which
runs the rules at most every ``every_s`` per run, off both the training processes and the channel thread.
Here every rank of the node is seen, so ``rank_imbalance`` can be judged across them. A run's state is
dropped at its end point (the first rank's; its ``metrics_report.json`` holds the final diagnosis),
after :data:`IDLE_RUN_S` without a step, or when a step of a new run finds :data:`MAX_RUNS` runs
judged already (the run that stepped least recently makes room: counted in ``runs_evicted``, the
agent's ``live_runs_evicted``, and logged once), and its open findings are then written as
``ended``, so that alerts on them resolve. With each window's rows bounded too
(:data:`~gpulse.report.live.MAX_WINDOW_ROWS`), unique run names cannot grow the agent.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

# Runs judged at once: as many as the channel's validator remembers; a step of a further run
# evicts the run that stepped least recently (bounded memory).
from gpulse.channel.validate import MAX_RUNS
from gpulse.report.live import FindingState, LiveFinding, LiveWindow, RollingFindings
from gpulse.util.countlog import CountedLog

log = logging.getLogger("gpulse.agent.findings")

#: A run silent this long is forgotten (a crash without an end point).
IDLE_RUN_S = 600.0


class LiveFindings:
    """Rolling findings of every run on the node; thread-safe (channel thread in, sampling loop out)."""

    def __init__(self, window: LiveWindow) -> None:
        self.window = window
        #: least recently stepped first
        self._runs: OrderedDict[str, RollingFindings] = OrderedDict()
        self._seen_ns: dict[str, int] = {}
        #: runs forgotten to make room for a new one (:data:`MAX_RUNS`)
        self.runs_evicted = 0
        self._once = CountedLog(log, period_s=None)
        self._lock = threading.Lock()
        #: findings closed by their run's end, written at the next evaluation
        self._ended: list[LiveFinding] = []

    def observe(self, measurement: str, tags: Mapping[str, str], fields: Mapping[str, Any], ts: int) -> None:
        """A checked point of the training channel (steps fill the run's window, an end point ends it)
        or the agent's own ``host`` / ``host_process`` point (the host beside the steps), or a ``gpu`` point of
        a GPU the run registered."""
        run = tags.get("run")
        with self._lock:
            if measurement == "host":
                row = {"time": ts, **tags, **fields}  # one row for every run's window: they only read it
                for engine in self._runs.values():
                    engine.add_beside(measurement, row)
            elif not run:
                return
            elif measurement in ("host_process", "gpu"):
                if run in self._runs:
                    self._runs[run].add_beside(measurement, {"time": ts, **tags, **fields})
            elif measurement == "train_run" and fields.get("event") == "end":
                self._end(run, ts)
            elif measurement == "train_step":
                engine = self._runs.get(run)
                if engine is None:
                    if len(self._runs) >= MAX_RUNS:
                        self._evict(run, ts)
                    engine = self._runs[run] = RollingFindings(run, self.window)
                else:
                    self._runs.move_to_end(run)
                engine.add({"time": ts, **tags, **fields})
                self._seen_ns[run] = ts

    def evaluate(self, now_ns: int) -> list[LiveFinding]:
        """The raises and clears due now, each logged once."""
        with self._lock:
            idle = [r for r, seen in self._seen_ns.items() if now_ns - seen > IDLE_RUN_S * 1e9]
            for run in idle:
                self._end(run, now_ns)
            changes, self._ended = self._ended, []
            changes += [c for e in self._runs.values() for c in e.evaluate(now_ns)]
        for c in changes:
            log.log(logging.WARNING if c.state is FindingState.RAISED else logging.INFO, "finding: %s", c.line())
        return changes

    def _evict(self, newcomer: str, ts: int) -> None:
        """Forget the run that stepped least recently, so that ``newcomer`` is judged; counted, logged once."""
        oldest = next(iter(self._runs))
        self._end(oldest, ts)
        self.runs_evicted += 1
        self._once.log(
            "runs-evicted",
            logging.WARNING,
            "rolling findings: more than %d runs step on this node at once: run %s (the least recently stepped) "
            "is no longer judged so that run %s is; further evictions are only counted (live_runs_evicted)",
            MAX_RUNS,
            oldest,
            newcomer,
        )

    def _end(self, run: str, ts: int) -> None:
        engine = self._runs.pop(run, None)
        self._seen_ns.pop(run, None)
        if engine is not None:
            self._ended += engine.end(ts)

    def judged(self) -> list[str]:
        """The runs judged now, the least recently stepped first."""
        with self._lock:
            return list(self._runs)

    def open(self) -> dict[str, list[dict[str, Any]]]:
        """Run id -> its open findings (JSON form), for ``gpulse status``."""
        with self._lock:
            return {run: [f.as_dict() for f in e.open] for run, e in self._runs.items() if e.open}
