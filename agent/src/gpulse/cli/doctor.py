"""``gpulse doctor``: every way a gpulse node can be misconfigured, checked and explained with a fix.

The checks (:mod:`gpulse.cli.checks`) run in an order where an earlier failure explains a later
one: the GPUs (and whether containers see them), the database (one probe decides v1 or v2), its
credentials, the bucket the agent writes to, the downsampling layout and its runs, the clock, the
agent running here (one per socket and destination), the training socket, and each sink's spool. ``agent --check`` runs a subset of the same checks.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpulse.agent.config import AgentConfig
from gpulse.cli.checks import database, gpus, local
from gpulse.cli.checks.base import Check, Context, Result, Status, render_doctor, run_checks

CHECKS: tuple[Check, ...] = (
    gpus.GPUS,
    gpus.CONTAINERS,
    database.DATABASE,
    database.TOKEN,
    database.BUCKET,
    database.LAYOUT,
    database.DOWNSAMPLING,
    database.CLOCK,
    local.INSTANCE,
    local.SOCKET,
    local.SPOOL,
)
CHECK_NAMES = tuple(c.name for c in CHECKS)


def run(cfg: AgentConfig, skip_names: Iterable[str] = ()) -> list[Result]:
    """Every check against the node as it runs."""
    return run_checks(CHECKS, Context(cfg, live=True), skip_names)


def report(cfg: AgentConfig, skip_names: Iterable[str] = ()) -> tuple[str, int]:
    """(the doctor's output, its exit status: 0 only when nothing failed)."""
    results = run(cfg, skip_names)
    return render_doctor(results, cfg.connection), int(any(r.status is Status.FAIL for r in results))
