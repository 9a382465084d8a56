"""One check framework: a :class:`Result` (ok, fail with its fix, or skip), a :class:`Check` (a named
function with the checks it needs first), and :func:`run_checks`, which runs a list in order.

A check that needs another one (the token needs a database that answers) is skipped, with the
name of the check that did not pass, when that one failed or was skipped; a check that raises is a
failed check, never a crash of the doctor. The two renderers are the doctor's (✔ ✘ –, a fix under
each failure) and ``agent --check``'s (``ok`` / ``FAIL`` / ``SKIP``, one verdict line); a skip is
never counted as a failure.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulse.agent.config import AgentConfig
from gpulse.influx.connection import Connection


class Status(str, enum.Enum):
    OK = "ok"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Result:
    name: str
    status: Status
    detail: str
    #: what to do (failures only)
    fix: str = ""


def ok(name: str, detail: str) -> Result:
    return Result(name, Status.OK, detail)


def fail(name: str, detail: str, fix: str) -> Result:
    return Result(name, Status.FAIL, detail, fix)


def skip(name: str, detail: str) -> Result:
    return Result(name, Status.SKIP, detail)


@dataclass
class Context:
    """What the checks share: the configuration, the results so far, and answers asked once."""

    cfg: AgentConfig
    #: True for ``doctor`` (the node as it runs: a running agent counts, waiting data is a problem);
    #: False for ``agent --check`` (would this configuration start?)
    live: bool = True
    results: dict[str, Result] = field(default_factory=dict)
    #: the database probe's answer (:class:`gpulse.influx.server.ServerInfo`), once the database check ran
    server: Any = None
    #: what the database probe found wrong (:class:`gpulse.influx.server.Problem`), if anything
    database_problem: Any = None
    #: real GPUs the gpus check found through NVML (0: none, simulated, or not checked)
    real_gpus: int = 0
    #: whether NVML works here (None: not checked)
    nvml_ok: bool | None = None

    def simulate(self) -> int | None:
        """The ``--simulate`` an agent command needs here: the configured one, or 8 where NVML is missing."""
        if self.cfg.simulate:
            return self.cfg.simulate
        if self.nvml_ok is None:  # the gpus check did not run (--skip gpus): ask NVML now
            from gpulse.sources.base import SourceUnavailable
            from gpulse.sources.nvml.source import NvmlSource

            source = NvmlSource()
            try:
                source.open()
                self.nvml_ok = True
            except SourceUnavailable:
                self.nvml_ok = False
            finally:
                source.close()
        return None if self.nvml_ok else 8

    _agent: tuple[dict[str, Any] | None, str] | None = None

    @property
    def conn(self) -> Connection:
        return self.cfg.connection

    def running_agent(self) -> tuple[dict[str, Any] | None, str]:
        """(the agent's status snapshot, '') when a trusted agent answers on the socket, else (None, why)."""
        if self._agent is None:
            from gpulse.cli.commands.status import AgentUnreachable, query_status

            try:
                self._agent = (query_status(self.cfg.socket_path, timeout=1.0, group=self.cfg.socket_group), "")
            except AgentUnreachable as e:
                self._agent = (None, str(e))
        return self._agent


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Context], Result]
    #: checks that must pass first (else this one is skipped, naming the one that did not)
    needs: tuple[str, ...] = ()
    #: skipped when no database is configured (recording only)
    needs_database: bool = False


def run_checks(checks: Sequence[Check], ctx: Context, skip_names: Iterable[str] = ()) -> list[Result]:
    """Run ``checks`` in order (an earlier failure explains a later one); ``skip_names`` are not run."""
    skipped = set(skip_names)
    out: list[Result] = []
    for check in checks:
        blocked = next((n for n in check.needs if n in ctx.results and ctx.results[n].status is not Status.OK), None)
        if check.name in skipped:
            r = skip(check.name, "skipped (--skip)")
        elif check.needs_database and not ctx.conn.url:
            r = skip(check.name, "no database configured (recording only)")
        elif blocked is not None:
            r = skip(check.name, f"not checked: the {blocked} check did not pass")
        else:
            try:
                r = check.run(ctx)
            except Exception as e:  # a check reports, it never crashes the command
                r = fail(check.name, f"the check itself failed: {type(e).__name__}: {e}", "run with -v and report it")
        ctx.results[check.name] = r
        out.append(r)
    return out


def counts(results: Sequence[Result]) -> tuple[int, int, int]:
    """(passed, failed, skipped)."""
    return tuple(sum(r.status is s for r in results) for s in (Status.OK, Status.FAIL, Status.SKIP))  # type: ignore[return-value]


SYMBOL = {Status.OK: "✔", Status.FAIL: "✘", Status.SKIP: "–"}


def render_doctor(results: Sequence[Result], conn: Connection | None = None) -> str:
    """``✔ name: detail`` per check, ``fix:`` under each failure, then the verdict."""
    passed, failed, skipped = counts(results)
    head = [f"gpulse doctor: {conn.describe()}"] if conn is not None and conn.url else []
    lines = []
    for r in results:
        lines.append(f"{SYMBOL[r.status]} {r.name}: {r.detail}")
        if r.status is Status.FAIL and r.fix:
            lines.append(f"    fix: {r.fix}")
    verdict = f"all {passed} checks passed" if not failed else f"{failed} check(s) failed, {passed} passed"
    verdict += f", {skipped} not applicable" if skipped else ""
    return "\n".join([*head, *lines, verdict]) + "\n"


AGENT_CHECK_WORD = {Status.OK: "ok  ", Status.FAIL: "FAIL", Status.SKIP: "SKIP"}


def render_agent_check(results: Sequence[Result]) -> str:
    """``agent --check``'s format: ``  ok   name: detail`` (``FAIL``, ``SKIP``), the fix under a failure,
    and ``gpulse agent --check: all N checks passed`` or ``F of N checks failed`` (skips said apart)."""
    passed, failed, skipped = counts(results)
    lines = []
    for r in results:
        lines.append(f"  {AGENT_CHECK_WORD[r.status]} {r.name}: {r.detail}")
        if r.status is Status.FAIL and r.fix:
            lines.append(f"       fix: {r.fix}")
    ran = passed + failed
    verdict = f"all {passed} checks passed" if not failed else f"{failed} of {ran} checks failed"
    verdict += f", {skipped} skipped" if skipped else ""
    return "\n".join([*lines, f"gpulse agent --check: {verdict}"]) + "\n"
