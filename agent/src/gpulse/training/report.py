"""``metrics_report.json``: the run's points, kept by each rank's worker, summarised at ``finish()`` on rank 0.

The summary is :func:`gpulse.report.model.build_report`, the same that ``gpulse report`` builds
from InfluxDB: this module is the one place the training library reaches outside the channel, for
a pure computation on the points it already has (the import rule allows exactly this import, and
checks that what it pulls in is standard library only). In a distributed run rank 0 builds it from
every rank's points (:mod:`gpulse.training.gather`); what it could not get makes the report
partial, and says why. The file is private (0600), written whole or not at all (a temporary file
renamed over it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from gpulse.channel.protocol import FieldShape, StepRows

if TYPE_CHECKING:
    from gpulse.report.model import RunReport
    from gpulse.training.gather import Gathered

REPORT_FILE = "metrics_report.json"
#: Rolling findings kept for the report (each raise is one entry, updated by its clear or end).
MAX_LIVE_FINDINGS = 256
#: Step fields the run's totals add up (also over the steps thinned out of the report).
_TOTALS = ("samples", "tokens")


class ReportBuffer:
    """The run's own points for the report; steps are capped at ``max_steps`` by halving the resolution.

    Steps are kept as the rows that were sent (:class:`~gpulse.channel.protocol.StepRows`, no copy),
    a slice at a time; their fields are read, and the run's tags added, only when the report is built."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max(max_steps, 2)
        #: the kept steps' rows in order, and each one's shape (a few shapes, referenced): no object per
        #: step that the garbage collector keeps tracking (a row of numbers it stops tracking at its
        #: first look; a (shape, row) pair it tracked for the run's life, so that, promoted to the oldest
        #: generation, kept steps brought on full collections, slow with torch in the heap)
        self._rows: list[tuple[int | float, ...]] = []
        self._shapes: list[FieldShape] = []
        self._runs: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._tags: Mapping[str, str] = {}
        #: the ``host`` tag the agent gives the run's points (the training process does not send it):
        #: set before the report is built, so that it names the hosts as the database does
        self.host: str | None = None
        self._stride = 1
        self._seen = 0
        #: samples and tokens of every step so far, kept or thinned out (the run's end point carries them),
        #: added up as rows come, a slice at a time, rather than all kept steps' in Python at ``finish()``
        self._totals = dict.fromkeys(_TOTALS, 0)
        #: (rule, first step) -> the agent's latest word on that finding (``live_findings``)
        self._findings: dict[tuple[str, int], dict[str, Any]] = {}

    def add(self, measurement: str, tags: Mapping[str, str], fields: Mapping[str, Any], ts: int) -> None:
        """Keep a ``train_run`` or ``train_event`` point (steps come as rows, :meth:`add_rows`)."""
        (self._runs if measurement == "train_run" else self._events).append({**tags, **fields, "time": ts})

    def add_finding(self, finding: Mapping[str, Any]) -> None:
        """A rolling finding the agent told this run about: its raise opens an entry, its clear or end
        updates it (the last step it held, its state)."""
        key = (str(finding.get("rule")), int(finding.get("first_step") or 0))
        if key in self._findings or len(self._findings) < MAX_LIVE_FINDINGS:
            self._findings[key] = {**self._findings.get(key, {}), **finding}

    @property
    def live_findings(self) -> list[dict[str, Any]]:
        """Each finding raised while the run was going: rule, state, first and last step it held,
        evidence, action, and when it was raised or last changed."""
        keys = ("rule", "state", "first_step", "last_step", "evidence", "action", "threshold", "time_ns", "host")
        return [{k: f.get(k) for k in keys} for f in self._findings.values()]

    @property
    def runs(self) -> list[dict[str, Any]]:
        return [self._with_host(r) for r in self._runs]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [self._with_host(r) for r in self._events]

    def _with_host(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "host": self.host} if self.host else row

    def add_rows(self, batch: StepRows) -> None:
        """Keep every ``stride``-th step of ``batch``; add the samples and tokens of all of them."""
        self._tags = batch.head.tags
        rows, shape = batch.rows, batch.shape
        for name in _TOTALS:
            i = shape.pos.get(name)
            if i is not None:
                self._totals[name] += sum(map(itemgetter(i), rows))
        kept = rows[(-self._seen) % self._stride :: self._stride] if self._stride > 1 else rows
        self._seen += len(rows)
        self._rows += kept
        self._shapes += repeat(shape, len(kept))
        while len(self._rows) >= self.max_steps:
            self._rows = self._rows[::2]
            self._shapes = self._shapes[::2]
            self._stride *= 2

    @property
    def samples(self) -> int:
        """Every step's samples, thinned out or kept."""
        return self._totals["samples"]

    @property
    def tokens(self) -> int:
        """Every step's tokens, thinned out or kept."""
        return self._totals["tokens"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.step_rows()

    def step_rows(self, at_most: int | None = None) -> list[dict[str, Any]]:
        """The kept steps as report rows; with ``at_most``, every n-th of them to stay within it."""
        rows, shapes = self._rows, self._shapes
        if at_most is not None and len(rows) > at_most:
            every = -(-len(rows) // max(at_most, 1))
            rows, shapes = rows[::every], shapes[::every]
        tags = {**self._tags, "host": self.host} if self.host else self._tags
        return [{**tags, **shape.fields(row), "time": row[-1]} for shape, row in zip(shapes, rows, strict=True)]


def build(buffer: ReportBuffer, others: Gathered | None = None) -> RunReport:
    """The report of ``buffer``'s points, with the other ranks' rows in ``others``."""
    from gpulse.report.model import build_report

    steps, runs, events = buffer.steps, buffer.runs, buffer.events
    if others is not None:
        steps, runs, events = steps + others.steps, runs + others.runs, events + others.events
    reason = others.partial_reason if others is not None else None
    return build_report(steps, [], runs, events, None, partial_reason=reason)


def summary(report: RunReport, paths: list[str]) -> str:
    """The lines the run prints as it ends (:func:`gpulse.report.text.render_summary`)."""
    from gpulse.report.text import render_summary

    return render_summary(report, paths)


def write_report(report: RunReport, output_dir: str, live_findings: list[dict[str, Any]] | None = None) -> str:
    """Write ``report`` (its ``profiles`` are the run's profiler windows, from their ``train_event``
    points) with what the agent found while it ran (``live_findings``) to ``output_dir``; returns its
    path. Raises on failure."""
    from gpulse.channel.recording import open_private

    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, REPORT_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        with open(fd, "w", encoding="utf-8") as fh:
            json.dump(
                {**report.to_json(), "live_findings": live_findings or []},
                fh,
                indent=2,
                default=str,
            )
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
