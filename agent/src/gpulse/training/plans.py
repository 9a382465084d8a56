"""Step-row plans: the common step, made into a row by one compiled function instead of the general path.

A run's steps nearly all look alike: the same phases, the same logged names, counts that are plain
``int`` and logged values that are plain finite ``float``. For such a step the general path
(:meth:`gpulse.training.points.PointMaker.step_row`) spends most of its time finding names and
appending them one by one. A :class:`Layout` says what such a step looks like; its :data:`RowPlan`
checks a record has that layout, with plain values only, and builds its row in one go; any record
it does not fit gets ``None`` and takes the general path, which stays the one definition of a step's
fields. A plan is only used once it gave, for the record it was made from, the very row the general
path gave (:meth:`PointMaker.step_row <gpulse.training.points.PointMaker.step_row>` checks), so a
plan can be missing a case but never disagree. Steps with GPU times or MFU take the general path.

``plan.take(queue, n, off)`` makes the rows of the records at the head of the worker's queue that
the plan fits, and takes them off it, so that a slice of alike steps costs the worker one call.
:data:`RowPlan` is the C one (``gpulse/training/_rows.c``, built with the hot path:
``agent/setup.py``) where built, else :class:`PyRowPlan`, which :func:`compile_plan` writes in Python
(as ``dataclasses`` and ``namedtuple`` write theirs); one test suite runs against both
(``agent/tests/training/test_plans.py``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

from gpulse.training.step import StepRecord

#: A row: the step's field values in its shape's order, the timestamp last.
Row = tuple[int | float, ...]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Layout(NamedTuple):
    """What a step record holds, as far as its row's field names go."""

    wait: bool
    phases: tuple[str, ...]
    comm: bool
    inflight: bool
    samples: bool
    tokens: bool
    memory: bool
    logs: tuple[str, ...]

    @classmethod
    def of(cls, rec: Any) -> Layout:
        logs = rec.logs
        return cls(
            rec.wait_ns is not None,
            tuple(rec.phases[::2]),
            rec.comm_ns is not None,
            rec.inflight_ns is not None,
            bool(rec.samples),
            bool(rec.tokens),
            rec.memory is not None,
            tuple(logs) if logs else (),
        )


class PyRowPlan:
    """The plan of one layout in Python (:func:`compile_plan`'s function): the reference of the C
    ``RowPlan`` (``gpulse/training/_rows.c``), which does the same checks in the same order and is
    stricter in a few cases (there a record goes to the general path, whose row is the same)."""

    __slots__ = ("row",)

    def __init__(self, layout: Layout, mfu: Any) -> None:
        self.row = compile_plan(layout, mfu)

    def __call__(self, rec: Any, off: int) -> Row | None:
        return self.row(rec, off)

    def take(self, queue: deque[Any], n: int, off: int) -> list[Row]:
        """The rows of the records at the head of ``queue`` that the plan fits (at most ``n``), taken
        off it; the first item that is not a step record without GPU events, or that the plan does
        not fit, stays at the head (the worker's general path makes its row, or says what is wrong)."""
        rows: list[Row] = []
        row = self.row
        while len(rows) < n and queue:
            rec = queue[0]
            if type(rec) is not StepRecord or rec.gpu_pairs is not None:
                break
            try:
                r = row(rec, off)
            except Exception:  # the general path meets the same value and says what is wrong with it
                break
            if r is None:
                break
            queue.popleft()
            rows.append(r)
        return rows


def compile_plan(layout: Layout, mfu: Any) -> Any:
    """The plan of ``layout`` as a Python function ``(record, offset_ns) -> row | None``: its row has
    the general path's values in the general path's order.
    ``mfu`` (the run's :class:`~gpulse.training.mfu.Mfu`) is read at each call: while it can compute
    FLOPs, steps with tokens take the general path."""
    env: dict[str, Any] = {"MIN": INT64_MIN, "MAX": INT64_MAX, "mfu": mfu, "LOGS": layout.logs}
    src = [
        "def plan(rec, off):",
        " step = rec.step",
        " if type(step) is not int or not MIN <= step <= MAX: return None",
        " t0 = rec.t0_ns",
        " t1 = rec.t1_ns",
    ]
    row = ["step", "t0 + off", "t1 + off", "t1 - t0"]

    def plain_int(attr: str, var: str, present: bool) -> None:
        if present:
            src.extend((f" {var} = rec.{attr}", f" if type({var}) is not int: return None"))
            row.append(var)
        else:
            src.append(f" if rec.{attr} is not None: return None")

    plain_int("wait_ns", "w", layout.wait)
    src.extend((" ph = rec.phases", f" if len(ph) != {2 * len(layout.phases)}: return None"))
    for i, name in enumerate(layout.phases):
        env[f"P{i}"] = name
        src.extend((f" if ph[{2 * i}] != P{i}: return None", f" p{i} = ph[{2 * i + 1}]"))
        row.append(f"p{i}")
    plain_int("comm_ns", "c", layout.comm)
    plain_int("inflight_ns", "f", layout.inflight)
    if layout.samples or layout.tokens:
        src.extend((" dt = (t1 - t0) / 1e9", " if dt <= 0: return None"))
    for attr, var, present in (("samples", "sa", layout.samples), ("tokens", "tk", layout.tokens)):
        if present:
            src.extend((f" {var} = rec.{attr}", f" if type({var}) is not int or not {var} or not MIN <= {var} <= MAX: return None"))  # fmt: skip
            row.extend((var, f"{var} / dt"))
        else:
            src.append(f" if rec.{attr}: return None")
    if layout.tokens:
        src.append(" if mfu.fixed or mfu.model is not None: return None")
    if layout.memory:
        src.extend((" m = rec.memory", " if m is None: return None"))
        row.extend(("int(m[0])", "int(m[1])", "int(m[2])", "int(m[3])"))
    else:
        src.append(" if rec.memory is not None: return None")
    if layout.logs:
        src.extend((" lg = rec.logs", " if not lg or tuple(lg) != LOGS: return None"))
        for i in range(len(layout.logs)):
            src.extend((f" l{i} = lg[LOGS[{i}]]", f" if type(l{i}) is not float or l{i} - l{i} != 0.0: return None"))
            row.append(f"l{i}")
    else:
        src.append(" if rec.logs: return None")
    src.append(f" return ({', '.join(row)}, t1 + off)")
    exec("\n".join(src), env)  # the source is made above from names held in env, never from input
    return env["plan"]


try:  # the same in C: a record read from its struct, its row made without an interpreter frame
    from gpulse.training._rows import RowPlan
except ImportError:  # not built (agent/setup.py): the Python reference above
    RowPlan = PyRowPlan


def plan_for(layout: Layout, mfu: Any) -> Any:
    """The plan of ``layout`` (``plan(rec, off)``, ``plan.take(queue, n, off)``): a :data:`RowPlan`."""
    return RowPlan(layout, mfu)
