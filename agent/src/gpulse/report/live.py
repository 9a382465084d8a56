"""Rolling findings: the diagnosis rules of ``finish()`` judged while the run is going.

One run's recent ``train_step`` rows (every rank the caller sees) are kept in a sliding window: the
last :attr:`LiveWindow.steps` steps or the last :attr:`LiveWindow.seconds`, whichever holds more
(at most :data:`MAX_WINDOW_ROWS` rows).
Every :attr:`LiveWindow.every_s` the window becomes a report (:func:`gpulse.report.model.build_report`,
so the rules are the very ones ``metrics_report.json`` and ``gpulse report`` apply) and each rule's
outcome goes through hysteresis:

* the rule *holds* at an evaluation when it fires on the whole window and on its newer half in time
  (so a burst must be recent and weigh on the whole window);
* a finding is *raised* once its rule has held at every evaluation for a whole window (as many
  steps and seconds as the window spans). A burst of up to half a window never raises it: it stays
  in the newer half for less than half a window more, so the rule holds for less than a window;
* a raised finding is *cleared* once its rule has failed at every evaluation for a whole window,
  by the same rule in reverse, so a short lull does not clear it.

A change that lasts raises (or clears) its finding within two windows: the whole window tips within
one, and the rule then holds for one more.

Stdlib only, like the report model: nothing here may cost the training thread anything.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpulse.report.model import Row, build_report, num
from gpulse.report.records import Finding

#: Step rows one run's window keeps at most (every rank of the node together), the oldest dropped
#: first: the window is the last N steps or S seconds only while that fits, so that a fast run with
#: many ranks, or one that sends wide rows, cannot grow the agent without bound.
MAX_WINDOW_ROWS = 4096
#: ``host``, ``host_process`` and ``gpu`` rows kept beside one run's steps, each, at most (the oldest
#: dropped first): a slow run's window spans many sampling cycles of every process and GPU.
MAX_BESIDE_ROWS = 4096


class FindingState(enum.Enum):
    RAISED = "raised"
    CLEARED = "cleared"
    #: the run ended while the finding was open (its final diagnosis is in ``metrics_report.json``)
    ENDED = "ended"


@dataclass(frozen=True)
class LiveWindow:
    """How much recent history is judged and how often (defaults: the issue's 100 steps / 2 minutes)."""

    steps: int = 100
    seconds: float = 120.0
    #: seconds between two evaluations: the rules run on a timer, never per step
    every_s: float = 5.0

    def __post_init__(self) -> None:
        if self.steps < 2 or self.seconds <= 0 or self.every_s <= 0:
            raise ValueError(f"a live window needs steps >= 2 and positive seconds and every_s, not {self}")


@dataclass
class LiveFinding:
    """One raise or clear of one rule for one run (a ``train_finding`` point)."""

    run: str
    rule: str
    state: FindingState
    title: str
    evidence: str
    action: str
    threshold: str
    #: the step (highest of the node's ranks) at the first and the last evaluation that held
    first_step: int
    last_step: int
    time_ns: int
    window_steps: int
    #: the rule's numeric figures (``Hit.data``'s numbers)
    figures: dict[str, float] = field(default_factory=dict)
    #: which case of the rule (``data_loading``'s :class:`~gpulse.report.host.LoadingCase`), else empty
    case: str = ""

    def fields(self) -> dict[str, Any]:
        """The ``train_finding`` point's fields (``gpulse.schema.TRAIN_FINDING``)."""
        return {
            "state": self.state.value,
            "open": int(self.state is FindingState.RAISED),
            "title": self.title,
            "evidence": self.evidence,
            "action": self.action,
            "threshold": self.threshold,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "window_steps": self.window_steps,
            **({"case": self.case} if self.case else {}),
            **{f"figure_{k}": v for k, v in self.figures.items()},
        }

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``gpulse status --json``, ``live_findings``)."""
        return {"run": self.run, "rule": self.rule, "time_ns": self.time_ns, **self.fields()}

    def line(self) -> str:
        """One line for the agent's log and ``gpulse status``."""
        if self.state is not FindingState.RAISED:
            return f"run {self.run}: {self.rule} {self.state.value} (held steps {self.first_step}-{self.last_step})"
        return f"run {self.run}: {self.rule} raised at step {self.last_step}: {self.evidence} Action: {self.action}"


@dataclass
class _Track:
    """A rule's hysteresis state: since when (step, ns) it has held or failed without a break."""

    raised: LiveFinding | None = None
    since_step: int = 0
    since_ns: int = 0
    holding: bool = False


def _figures(data: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class RollingFindings:
    """One run's rolling diagnosis; not thread-safe (the caller serialises :meth:`add` and :meth:`evaluate`)."""

    def __init__(self, run: str, window: LiveWindow, thresholds: Mapping[str, float] | None = None) -> None:
        self.run = run
        self.window = window
        self.thresholds = dict(thresholds or {})
        self._rows: deque[Row] = deque(maxlen=MAX_WINDOW_ROWS)
        #: the agent's ``host``, ``host_process`` and the run's ``gpu`` rows over the same span (the
        #: data-loading case, the GPU rules)
        self._host: dict[str, deque[Row]] = {m: deque(maxlen=MAX_BESIDE_ROWS) for m in ("host", "host_process", "gpu")}
        self._tracks: dict[str, _Track] = {}
        self._last_eval_ns = 0
        self.last_step = 0

    def add(self, row: Row) -> None:
        """A ``train_step`` row (``time`` in ns, tags and fields); rows older than the window are dropped,
        and the oldest beyond :data:`MAX_WINDOW_ROWS`."""
        self._rows.append(row)
        step = num(row, "step")
        if step is not None:
            self.last_step = max(self.last_step, int(step))

    def add_beside(self, measurement: str, row: Row) -> None:
        """A ``host``, ``host_process`` or ``gpu`` row of the run's node, kept as long as the steps beside it
        (at most :data:`MAX_BESIDE_ROWS` of each measurement). Rows are only read, so one row may be
        shared by the windows of several runs."""
        self._host[measurement].append(row)

    def _trim(self, now_ns: int) -> None:
        oldest_step = self.last_step - self.window.steps
        oldest_ns = now_ns - round(self.window.seconds * 1e9)
        rows = self._rows
        while rows and (num(rows[0], "step") or 0) <= oldest_step and int(rows[0].get("time") or 0) < oldest_ns:
            rows.popleft()
        since = min((int(r.get("time") or 0) for r in rows), default=now_ns) - round(self.window.every_s * 1e9)
        for kept in self._host.values():
            while kept and int(kept[0].get("time") or 0) < since:
                kept.popleft()

    def held(self) -> dict[str, int]:
        """Rows the window holds now, by measurement (what it costs the agent)."""
        return {"train_step": len(self._rows), **{m: len(rows) for m, rows in self._host.items()}}

    @property
    def open(self) -> list[LiveFinding]:
        """The findings raised and not cleared, in rule order."""
        return [t.raised for t in self._tracks.values() if t.raised is not None]

    def evaluate(self, now_ns: int, *, force: bool = False) -> list[LiveFinding]:
        """The raises and clears of this evaluation (none when the last one is under ``every_s`` ago)."""
        if not force and now_ns - self._last_eval_ns < self.window.every_s * 1e9:
            return []
        self._last_eval_ns = now_ns
        self._trim(now_ns)
        if not self._rows:
            return []
        rows = list(self._rows)
        host, procs, gpu = (list(self._host[m]) for m in ("host", "host_process", "gpu"))
        hits = {f.id: f for f in self._diagnosis(rows, gpu, host, procs)}
        times = [int(r.get("time") or 0) for r in rows]
        mid = (min(times) + max(times)) // 2
        newer = [r for r, t in zip(rows, times, strict=True) if t >= mid]
        recent = {f.id for f in self._diagnosis(newer, [g for g in gpu if int(g["time"]) >= mid], host, procs)}
        hits = {rule_id: f for rule_id, f in hits.items() if rule_id in recent}
        span_ns = round(self.window.seconds * 1e9)
        changes: list[LiveFinding] = []
        for rule_id in {*hits, *self._tracks}:
            track = self._tracks.setdefault(rule_id, _Track())
            hit = hits.get(rule_id)
            if (hit is not None) != track.holding or track.since_ns == 0:
                track.holding, track.since_step, track.since_ns = hit is not None, self.last_step, now_ns
            lasted = self.last_step - track.since_step >= self.window.steps and now_ns - track.since_ns >= span_ns
            if hit is not None and track.raised is not None:
                track.raised.last_step = self.last_step
            if hit is not None and track.raised is None and lasted:
                track.raised = LiveFinding(
                    self.run,
                    rule_id,
                    FindingState.RAISED,
                    hit.title,
                    hit.evidence,
                    hit.action,
                    hit.threshold,
                    first_step=track.since_step,
                    last_step=self.last_step,
                    time_ns=now_ns,
                    window_steps=len(self._rows),
                    figures=_figures(hit.data),
                    case=str(hit.data.get("case") or ""),
                )
                changes.append(track.raised)
            elif hit is None and track.raised is not None and lasted:
                raised, track.raised = track.raised, None
                changes.append(replace(raised, state=FindingState.CLEARED, time_ns=now_ns))
        order = list(hits) + sorted(set(self._tracks) - set(hits))
        return sorted(changes, key=lambda f: order.index(f.rule))

    def end(self, now_ns: int) -> list[LiveFinding]:
        """The run ended: each open finding closes (state ``ended``)."""
        closed = [replace(f, state=FindingState.ENDED, time_ns=now_ns) for f in self.open]
        self._tracks.clear()
        return closed

    def _diagnosis(self, steps: list[Row], gpu: list[Row], host: list[Row], procs: list[Row]) -> list[Finding]:
        return build_report(steps, gpu, [], [], self.thresholds, host=host, host_process=procs).diagnosis
