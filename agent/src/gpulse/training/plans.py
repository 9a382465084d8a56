"""Step-row plans: the common step, made into a row by one compiled function instead of the general path.

A run's steps nearly all look alike: the same phases, the same logged names, counts that are plain
``int`` and logged values that are plain finite ``float``. For such a step the general path
(:meth:`gpulse.training.points.PointMaker.step_row`) spends most of its time finding names and
appending them one by one. A :class:`Layout` says what such a step looks like; :func:`compile_plan`
writes one Python function for it (as ``dataclasses`` and ``namedtuple`` write theirs) that checks
a record has that layout, with plain values only, and builds its row in one expression; any record
it does not fit gets ``None`` and takes the general path, which stays the one definition of a step's
fields. A plan is only used once it gave, for the record it was made from, the very row the general
path gave (:meth:`PointMaker.step_row <gpulse.training.points.PointMaker.step_row>` checks), so a
plan can be missing a case but never disagree. Steps with GPU times or MFU take the general path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

#: A plan: ``(record, offset_ns) -> row`` or ``None`` when the record does not have its layout.
Plan = Callable[[Any, int], "tuple[int | float, ...] | None"]
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


def compile_plan(layout: Layout, mfu: Any) -> Plan:
    """The plan of ``layout``: its row has the general path's values in the general path's order.
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
    return env["plan"]  # type: ignore[no-any-return]
