"""How a step's time is split into parts: the one definition the text, HTML and JSON reports use
(the Training run dashboard's phase panel computes the same from the same fields).

A step, as the bars show it, is its wait for the batch followed by the step itself
(``step_time_s``). Its parts:

* ``data_wait``: ``data_wait_s``, before the step;
* ``forward``: ``forward_s``;
* ``backward``: backward's compute, ``backward_s`` less ``comm_s`` — the recorded backward phase
  includes the exposed communication wait, because DDP (and FSDP) wait for the all-reduce before
  ``backward()`` returns (:mod:`gpulse.training.comm`);
* ``comm``: ``comm_s``, the exposed communication wait (on a rank that reached the collective
  first, it includes waiting for slower ranks);
* ``optimizer``: ``optimizer_s``;
* custom phases (``phase_<name>_s``), each by its name;
* ``other``: the step less the named parts inside it.

The parts inside the step add up to ``step_time_s`` by construction. When the named parts exceed
the step (or the communication wait exceeds the backward phase it is part of), the phases were
measured wrongly: ``other`` is 0 and :attr:`StepParts.excess_s` says by how much, for the report's
hints, never clipped silently.

Stdlib only, like :mod:`gpulse.report.model`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Row = Mapping[str, Any]
#: The standard parts in the order the HTML stacks them; custom phases follow, then ``other``.
PARTS = ("data_wait", "forward", "backward", "comm", "optimizer")
#: Parts outside the step (before it); every other part is inside ``step_time_s``.
OUTSIDE = ("data_wait",)
#: Named parts exceeding the step by more than this share of it are a measurement error.
TOLERANCE = 0.01


def _field(name: str) -> str:
    return f"{name}_s" if name in PARTS else f"phase_{name}_s"


def custom_phases(rows: Sequence[Row]) -> list[str]:
    """Names of the custom phases (``phase_<name>_s``) that appear in ``rows``, sorted."""
    keys = {k for r in rows for k in r if k.startswith("phase_") and k.endswith("_s") and not k.endswith("_gpu_s")}
    return sorted(k[len("phase_") : -2] for k in keys)


def _sum(rows: Sequence[Row], key: str) -> float | None:
    """Σ of the finite numbers under ``key`` (``None``: the field never appears)."""
    xs = [float(v) for r in rows if isinstance(v := r.get(key), int | float) and not isinstance(v, bool)]
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) if xs else None


@dataclass(frozen=True)
class StepParts:
    """Mean seconds per step of each part (only those measured, plus ``other``), and the step."""

    parts: dict[str, float]
    step_s: float
    #: named parts beyond the step (or comm beyond backward), s per step: 0 when consistent
    excess_s: float

    @property
    def consistent(self) -> bool:
        return self.excess_s <= TOLERANCE * self.step_s


def partition(rows: Sequence[Row], custom: Sequence[str] | None = None) -> StepParts:
    """The mean parts of ``rows`` (steps; a field a row lacks counts as 0 for it)."""
    n = len(rows) or 1
    custom = custom_phases(rows) if custom is None else custom
    mean = {p: s / n for p in [*PARTS, *custom] if (s := _sum(rows, _field(p))) is not None}
    step = (_sum(rows, "step_time_s") or 0.0) / n
    excess = 0.0
    if "backward" in mean and "comm" in mean:
        compute = mean["backward"] - mean["comm"]
        excess += max(0.0, -compute)
        mean["backward"] = max(0.0, compute)
    inside = sum(v for k, v in mean.items() if k not in OUTSIDE)
    excess += max(0.0, inside - step)
    mean["other"] = max(0.0, step - inside)
    return StepParts(parts=mean, step_s=step, excess_s=excess)


def step_share(phases_s: Mapping[str, float], name: str) -> float | None:
    """``name``'s share of the step itself in a report's ``phases_s``: what its bars show, on average."""
    step = sum(v for k, v in phases_s.items() if k not in OUTSIDE)
    return phases_s[name] / step if name in phases_s and step > 0 else None


def excess_hint(parts: StepParts) -> str | None:
    """The report's hint when the measured phases do not fit in the step, else ``None``."""
    if parts.consistent:
        return None
    return (
        f"The measured phases exceed the step by {parts.excess_s:.4f} s per step (of {parts.step_s:.4f} s): "
        "phases overlap (a custom phase inside forward or backward) or comm_s was measured outside the backward "
        "phase; 'other' is shown as 0. Time each phase once, with run.phase(name) around disjoint code."
    )
